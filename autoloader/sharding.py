"""Sharding the data across every rank: the facts all ranks must share (``check_same``) and the
``DistributedSampler`` autoloader shards with (``ShardingSampler``), which refuses to be sharded a second time.
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from torch.utils.data.distributed import DistributedSampler


def check_same(facts: Sequence[Mapping[str, Any]], nodes: Sequence[Tuple[int, ...]]) -> None:
    """A ValueError (the same on every rank) naming the first fact the ranks disagree on, who has which value, and
    the fix."""
    for name in facts[0]:
        values: Dict[object, List[int]] = {}
        for rank, fact in enumerate(facts):  # "sampler" comes first: past it, every rank has the same names
            values.setdefault(fact.get(name), []).append(rank)
        if len(values) == 1:
            continue
        node_of = {rank: i for i, ranks in enumerate(nodes) for rank in ranks}
        where = "; ".join(f"{value!r} on ranks {ranks} (nodes {sorted({node_of[r] for r in ranks})})"
                          for value, ranks in values.items())
        raise ValueError(
            f"make_loader: the ranks disagree on {name}: {where}. Every rank of the job must pass the same "
            f"{name}, since one DistributedSampler epoch is split across all of them; give every node the same "
            f"dataset and arguments (per-node choices such as num_workers are autoloader's to make)")


class ShardingSampler(DistributedSampler):
    """The ``DistributedSampler`` autoloader shards with, which refuses to be sharded a second time.

    ``accelerator.prepare(make_loader(...).loader)`` rebuilds the DataLoader with Accelerate's ``BatchSamplerShard``
    around this sampler's batches, and each process would then see ``1 / world_size**2`` of the data, silently. This
    sampler is the one object of autoloader's that survives the rebuild, so the check lives here: when Accelerate's
    shard sampler (looked up in ``sys.modules``, never imported) iterates it across several processes, it raises.
    """

    def __iter__(self) -> Iterator[int]:
        _refuse_second_sharding(self.num_replicas)
        return super().__iter__()


def _refuse_second_sharding(num_replicas: int, *, depth: int = 8) -> None:
    module = sys.modules.get("accelerate.data_loader")
    shard_type = getattr(module, "BatchSamplerShard", None)
    if not isinstance(shard_type, type):
        return
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        processes = getattr(owner, "num_processes", 1) if isinstance(owner, shard_type) else 1
        if processes > 1:
            raise RuntimeError(
                f"autoloader: accelerate shards this DataLoader again (BatchSamplerShard over "
                f"{processes} processes) although autoloader already shards it across {num_replicas} "
                f"processes with a DistributedSampler: each process would see 1/{num_replicas * processes} "
                f"of the data. Pass the PrefetchLoader itself to accelerator.prepare (it comes back unchanged), or "
                f"build it with make_loader(..., distributed=False) and prepare loader.loader")
        frame = frame.f_back
