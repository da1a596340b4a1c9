"""One rank of the torchrun test in test_distributed.py: make_loader under gloo, epoch 1, findings to JSON.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/dist_script.py OUT_DIR CACHE_DIR [--explicit]

Each rank writes OUT_DIR/rank<R>.json: the TuneResult, the trials this rank ran (as logged), the sampler's type and
the sample indices of epoch 1.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from autoloader import make_loader


class Work(Dataset):
    """``n`` tiny samples, each costing a little CPU so trials measure real loading; yields (tensor, index)."""

    def __init__(self, n: int, cost: int = 1500) -> None:
        self.n, self.cost = n, cost

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        acc = 0
        for j in range(self.cost):
            acc += (j * index) % 7
        return torch.full((4,), float(acc)), index


class _Trials(logging.Handler):
    """Records the trials this rank ran, from the tuner's log line per trial: the config, the agreed rate (or the
    status without the reason, which is this rank's own) and the agreed elapsed time."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if not (args and args[0] in ("trial", "candidate")):
            return
        args = args[1:]
        if len(args) < 2:
            self.lines.append(record.getMessage())
            return
        outcome = str(args[1]) if "samples/s" in str(args[1]) else str(args[1]).split(":")[0]
        self.lines.append(" | ".join([str(args[0]), outcome] + [repr(a) for a in args[2:]]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("cache_dir")
    parser.add_argument("--explicit", action="store_true", help="pass distributed=True instead of auto")
    parser.add_argument("--budget", type=float, default=4.0)
    parser.add_argument("--online", action="store_true", help="tune online, in this script's epochs")
    args = parser.parse_args()

    trials = _Trials()
    tuner_log = logging.getLogger("autoloader.tuner")  # search/search.py: one line per trial
    tuner_log.setLevel(logging.INFO)
    tuner_log.addHandler(trials)
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        if args.online:
            return _online(args, rank)
        loader = make_loader(Work(200), batch_size=8, shuffle=True, device="cpu", cache=args.cache_dir,
                             budget=args.budget, distributed=True if args.explicit else None, tuning="trials")
        loader.set_epoch(1)
        indices = [int(i) for _, batch_indices in loader for i in batch_indices]
        sampler = loader.loader.sampler
        report = {
            "rank": rank,
            "world_size": dist.get_world_size(),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "0")),
            "sampler": type(sampler).__name__,
            "sampler_epoch": getattr(sampler, "epoch", None),
            "num_workers": loader.tuning.num_workers,
            "source": loader.tuning.source,
            "result": json.dumps(loader.tuning.to_dict(), sort_keys=True),
            "indices": indices,
            "trials_run": trials.lines,
        }
        with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(report, fh)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def finish(out_dir: str, rank: int, report: dict) -> int:
    """Write this rank's report (``rank<R>.json``) and wait for every rank: the end of each torchrun script."""
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)
    dist.barrier()
    return 0


def record_epoch(loader, epoch: int) -> dict:
    """One epoch of ``loader`` (of (sample, index) batches): the sample indices this rank got and the workers in
    force at each batch."""
    loader.set_epoch(epoch)
    indices, configs = [], []
    for _, batch_indices in loader:
        indices += [int(i) for i in batch_indices]
        configs.append(loader.loader.num_workers)  # the DataLoader that served this batch (nothing is read ahead)
    return {"indices": indices, "configs": configs}


def _online(args: argparse.Namespace, rank: int) -> int:
    """Epochs of an online-tuned loader until it decided, and at least two (a decision often comes within the first),
    at most 10: per epoch, the sample indices this rank got and the configuration in force at each batch."""
    # a batch costs ~5 ms beside no step: workers are worth trying (at 1,500 a sample, the median of the probe's
    # batches sometimes put serial loading within the margin, and no candidate served)
    loader = make_loader(Work(400, cost=6000), batch_size=8, shuffle=True, device="cpu", cache=args.cache_dir,
                         max_workers=4, tuning="online")
    epochs = []
    while (not loader.decisions or len(epochs) < 2) and len(epochs) < 10:
        epochs.append(record_epoch(loader, len(epochs)))
    report = {"rank": rank, "epochs": epochs, "decisions": [repr(d.config) for d in loader.decisions],
              "result": json.dumps(loader.tuning.to_dict(), sort_keys=True)}
    del loader
    return finish(args.out_dir, rank, report)


if __name__ == "__main__":
    sys.exit(main())
