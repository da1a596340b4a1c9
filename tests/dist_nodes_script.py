"""One rank of the simulated two-node run in test_distributed_nodes.py: make_loader under gloo, epoch 1, findings to
JSON. Launched twice on one host, one launch per node (static rendezvous on localhost):

    python -m torch.distributed.run --nnodes=2 --node_rank=K --nproc_per_node=2 --master_addr=127.0.0.1 \\
        --master_port=PORT tests/dist_nodes_script.py OUT_DIR CACHE_DIR [--batch-size-node1 N]

The node is unlike the other through the environment of its launch: ``NODE_SAMPLE_WAIT_S`` (a per-sample wait, a
slow network mount) and ``taskset`` (fewer cores). Each rank writes OUT_DIR/rank<R>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from autoloader import make_loader
from dist_script import finish, record_epoch
from autoloader.distributed import node_decisions

SAMPLES = 192
ONLINE_SAMPLES = 640


class Reads(Dataset):
    """``n`` small samples, each waiting ``NODE_SAMPLE_WAIT_S`` (read when a sample is loaded, so the dataset itself
    is the same object on both nodes and only the node differs); yields (tensor, index)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        wait = float(os.environ.get("NODE_SAMPLE_WAIT_S", "0"))
        if wait > 0:
            time.sleep(wait)
        return torch.full((4,), float(index)), index


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("cache_dir")
    parser.add_argument("--batch-size-node1", type=int, default=8, help="node 1's batch size (a mismatch when not 8)")
    parser.add_argument("--online", type=int, default=0, metavar="EPOCHS", help="tune online during EPOCHS epochs")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        rank, node = dist.get_rank(), int(os.environ["GROUP_RANK"])
        batch_size = args.batch_size_node1 if node == 1 else 8
        if args.online:
            return _online(args, rank, node)
        started = time.time()
        loader = make_loader(Reads(SAMPLES), batch_size=batch_size, shuffle=True, device="cpu",
                             cache=args.cache_dir, budget=6.0, max_workers=4, tuning="trials")
        returned = time.time()
        loader.set_epoch(1)
        indices = [int(i) for _, batch_indices in loader for i in batch_indices]
        found = node_decisions(loader)
        report = {"rank": rank, "node": node, "local_rank": int(os.environ["LOCAL_RANK"]),
                  "cpus": len(os.sched_getaffinity(0)), "num_workers": loader.tuning.num_workers,
                  "source": loader.tuning.source, "reason": loader.tuning.reason,
                  "result": json.dumps(loader.tuning.to_dict(), sort_keys=True), "cache_key": loader.cache_key,
                  "started": started, "returned": returned, "indices": indices, "node_decisions": found}
        with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(report, fh)
        del loader
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _online(args: argparse.Namespace, rank: int, node: int) -> int:
    """``args.online`` epochs of a loader tuned online (the same number on every rank, so that each epoch's samples
    can be checked across the 4): per epoch, this rank's sample indices and the workers in force at each batch."""
    loader = make_loader(Reads(ONLINE_SAMPLES), batch_size=8, shuffle=True, device="cpu", cache=args.cache_dir,
                         max_workers=4, tuning="online")
    epochs = [record_epoch(loader, epoch) for epoch in range(args.online)]
    found = node_decisions(loader)
    report = {"rank": rank, "node": node, "epochs": epochs, "decisions": [repr(d.config) for d in loader.decisions],
              "num_workers": loader.tuning.num_workers, "reason": loader.tuning.reason,
              "result": json.dumps(loader.tuning.to_dict(), sort_keys=True), "node_decisions": found}
    del loader
    return finish(args.out_dir, rank, report)


if __name__ == "__main__":
    sys.exit(main())
