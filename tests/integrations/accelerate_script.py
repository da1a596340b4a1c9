"""Accelerate on 1 or 2 CPU processes (2: under torchrun, gloo), in the Accelerate style: no ``set_epoch`` call, the
loop just iterates the prepared loader once per epoch.

    python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/integrations/accelerate_script.py OUT_DIR CACHE_DIR
    python tests/integrations/accelerate_script.py OUT_DIR CACHE_DIR          # one process

Three ways of combining the two, each reported in OUT_DIR/rank<R>.json under its name:

- ``prefetch``: ``accelerator.prepare(make_loader(...))``: Accelerate returns the PrefetchLoader unchanged (it only
  prepares ``torch.utils.data.DataLoader`` instances), autoloader shards with its DistributedSampler.
- ``inner``: ``accelerator.prepare(make_loader(...).loader)``: Accelerate rebuilds the tuned DataLoader as a
  ``DataLoaderShard`` and shards it again (``BatchSamplerShard``) on top of autoloader's DistributedSampler. The
  correct outcome is either a clear error (recorded as ``error``) or every sample exactly once per epoch.
- ``unsharded``: ``make_loader(..., distributed=False)`` then ``accelerator.prepare(loader.loader)``: each process
  tunes alone, Accelerate alone shards.
"""
from __future__ import annotations

import argparse
import traceback
import warnings

import torch
from accelerate import Accelerator

from autoloader import make_loader

from _helpers import BUDGET_S, Indexed, arm_watchdog, write_report

N = 64
BATCH = 8
EPOCHS = 3


def train(accelerator: Accelerator, loader, model, optimizer) -> list:
    """The Accelerate loop: iterate, step; no set_epoch. Returns the sample ids seen, per epoch."""
    epochs = []
    for _ in range(EPOCHS):
        seen = []
        for images, ids in loader:
            seen.extend(int(i) for i in ids)
            loss = model(images.float().flatten(1)).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        epochs.append(seen)
    return epochs


def scenario(name: str, accelerator: Accelerator, cache_dir: str) -> dict:
    model = torch.nn.Linear(3 * 8 * 8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    common = dict(batch_size=BATCH, shuffle=True, device="cpu", cache=cache_dir, budget=BUDGET_S, max_workers=2)
    report: dict = {"error": None}
    try:
        if name == "prefetch":
            loader = make_loader(Indexed(N), **common)
            model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
            report["prepared_type"] = type(prepared).__name__
            report["returned_unchanged"] = prepared is loader
        elif name == "inner":
            loader = make_loader(Indexed(N), **common)
            model, optimizer, prepared = accelerator.prepare(model, optimizer, loader.loader)
            report["prepared_type"] = type(prepared).__name__
        else:
            loader = make_loader(Indexed(N), distributed=False, **common)
            model, optimizer, prepared = accelerator.prepare(model, optimizer, loader.loader)
            report["prepared_type"] = type(prepared).__name__
        report["num_workers"] = prepared_workers(prepared)
        report["epochs"] = train(accelerator, prepared, model, optimizer)
        report["tuning"] = loader.tuning.to_dict()  # in force since the loader's first iter() (pending if never)
    except Exception as exc:  # recorded: the test decides whether an error was the right outcome
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()[-3000:]
    return report


def prepared_workers(prepared) -> int:
    inner = getattr(prepared, "loader", None) or getattr(prepared, "base_dataloader", None) or prepared
    return getattr(inner, "num_workers", None)


def main() -> None:
    arm_watchdog()
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("cache_dir")
    parser.add_argument("--scenarios", default="prefetch,inner,unsharded")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    accelerator = Accelerator(cpu=True)
    report = {"rank": accelerator.process_index, "world_size": accelerator.num_processes,
              "distributed_type": str(accelerator.distributed_type)}
    for name in args.scenarios.split(","):
        report[name] = scenario(name, accelerator, args.cache_dir)
        accelerator.wait_for_everyone()
    write_report(args.out_dir, accelerator.process_index, report)
    accelerator.end_training()


if __name__ == "__main__":
    main()
