"""torch.distributed awareness: shard the data with DistributedSampler, split the node's CPUs and memory among its
ranks, and make every rank reach the same decision.

# NOTE [ One decision across ranks ]
# Trials run on all local ranks at once, so they measure the contention training will see. The search must take the
# same path everywhere, or one rank would wait forever on a collective that another skips. So every figure a
# decision reads (rates, costs, elapsed time against the budget) goes through one all_reduce (``reduce_min``; costs are
# negated to take their maximum) before it is used: the slowest rank's rate and the largest cost. The machine profile
# is rank 0's, broadcast. Rank 0 alone reads and writes the cache; the hit (or miss) is broadcast so that all ranks
# skip or run trials together, and the final result is rank 0's, broadcast, so every rank returns the same object.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset
from torch.utils.data.distributed import DistributedSampler

from .results import TuneResult


def _local_world_size() -> int:
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name)
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return 1


class Group:
    """The default process group, seen from this rank."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_world_size = _local_world_size()
        self.backend = dist.get_backend()
        self.device = (torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl"
                       else torch.device("cpu"))

    @classmethod
    def current(cls, distributed: Optional[bool]) -> Optional["Group"]:
        """The group when ``distributed`` is True, or None and torch.distributed is initialised; else None."""
        if distributed is not None and not isinstance(distributed, bool):
            raise TypeError(f"distributed must be True, False or None (auto), got {distributed!r}")
        if distributed is False:
            return None
        ready = dist.is_available() and dist.is_initialized()
        if distributed and not ready:
            raise ValueError("distributed=True needs torch.distributed.init_process_group() to have run first "
                             "(launch with torchrun); pass distributed=False for a single process")
        return cls() if ready else None

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def shard(self, dataset: Any, *, shuffle: bool, drop_last: bool,
              loader_kwargs: Mapping[str, Any]) -> Tuple[Dict[str, Any], bool]:
        """Give each rank its own part of the data with ``DistributedSampler``, unless the user chose a sampler.

        Returns the DataLoader keywords and the ``shuffle`` to pass on (the sampler shuffles, the loader must not).
        """
        kwargs = dict(loader_kwargs)
        if isinstance(dataset, IterableDataset) or kwargs.get("sampler") is not None \
                or kwargs.get("batch_sampler") is not None:
            return kwargs, shuffle
        generator = kwargs.get("generator")
        seed = int(generator.initial_seed()) if generator is not None else 0
        kwargs["sampler"] = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                               shuffle=shuffle, seed=seed, drop_last=drop_last)
        return kwargs, False

    def share_profile(self, profile: Any) -> Any:
        """Rank 0's machine profile, with CPUs, memory and /dev/shm divided among the ranks of a node."""
        profile = self.broadcast_object(profile)
        n = self.local_world_size
        if n <= 1:
            return profile
        cpu = dataclasses.replace(profile.cpu, usable=None if profile.cpu.usable is None
                                  else max(1, profile.cpu.usable // n))
        memory = dataclasses.replace(profile.memory, budget_bytes=None if profile.memory.budget_bytes is None
                                     else profile.memory.budget_bytes // n)
        shm = dataclasses.replace(profile.shm, free_bytes=None if profile.shm.free_bytes is None
                                  else profile.shm.free_bytes // n)
        return dataclasses.replace(profile, cpu=cpu, memory=memory, shm=shm)

    def broadcast_object(self, obj: Any) -> Any:
        holder: List[Any] = [obj if self.is_leader else None]
        dist.broadcast_object_list(holder, src=0, device=self.device if self.backend == "nccl" else None)
        return holder[0]

    def broadcast(self, result: Optional[TuneResult]) -> Optional[TuneResult]:
        """Rank 0's result (or miss) on every rank, sent as its plain JSON form."""
        data = self.broadcast_object(None if result is None else result.to_dict())
        return None if data is None else TuneResult.from_dict(data)

    def agreement(self) -> "_AllReduce":
        return _AllReduce(self.device)


class _AllReduce:
    """``reduce_min`` over all ranks (see NOTE [ One decision across ranks ])."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reduce_min(self, values: Sequence[float]) -> List[float]:
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return tensor.cpu().tolist()
