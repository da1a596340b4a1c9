"""torch.distributed awareness: shard the data with DistributedSampler, split the node's CPUs and memory among its
ranks, and make every rank reach the same decision.

# NOTE [ One decision across ranks ]
# Trials run on all local ranks at once, so they measure the contention training will see. The search must take the
# same path everywhere, or one rank would wait forever on a collective that another skips. So every figure a
# decision reads (rates, costs, elapsed time against the budget) goes through ``reduce_min`` (costs are negated to
# take their maximum) before it is used: the slowest rank's rate and the largest cost. The machine profile is rank
# 0's, broadcast. Rank 0 alone reads and writes the cache; the hit (or miss) is broadcast so that all ranks skip or
# run trials together, and the final result is rank 0's, broadcast, so every rank returns the same object.
# Every method here that talks to other ranks is called by all ranks, unconditionally, in the same order. Values
# travel through torch's object collectives (``broadcast_object_list``, ``all_gather_object``), which pick the
# backend's device themselves: the CPU for gloo (or a "cpu:gloo,cuda:nccl" group), the current CUDA device for NCCL
# (so NCCL users must call ``torch.cuda.set_device(local_rank)`` first, as every NCCL program must).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from typing import Any, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple

import torch.distributed as dist
from torch.utils.data import IterableDataset
from torch.utils.data.distributed import DistributedSampler

from .results import TuneResult

log = logging.getLogger("autoloader.distributed")


class Agreement(Protocol):
    """How several processes agree on one decision: every figure through ``reduce_min`` (see NOTE [ One decision
    across ranks ]); one process agrees with itself (``Alone``)."""

    def reduce_min(self, values: Sequence[float]) -> List[float]:
        ...


class Alone:
    def reduce_min(self, values: Sequence[float]) -> List[float]:
        return list(values)


def _local_world_size_from_env() -> Optional[int]:
    """Ranks on this node as the launcher says (torchrun's ``LOCAL_WORLD_SIZE``, Slurm's tasks per node)."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


class Group:
    """The default process group, seen from this rank. Build it with ``Group.current`` on every rank."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.backend = str(dist.get_backend())
        local = _local_world_size_from_env()
        if local is None:
            hosts: List[Any] = [None] * self.world_size
            dist.all_gather_object(hosts, socket.gethostname())
            local = max(1, sum(1 for h in hosts if h == socket.gethostname()))
        self.local_world_size = local
        log.debug("rank %d of %d (%d on this node), backend %s", self.rank, self.world_size, local, self.backend)

    @classmethod
    def current(cls, distributed: Optional[bool]) -> Optional["Group"]:
        """The default group, or None for a single process.

        ``distributed=None`` follows ``torch.distributed.is_initialized()``; ``True`` requires it (ValueError
        otherwise); ``False`` ignores it.
        """
        if distributed is not None and not isinstance(distributed, bool):
            raise TypeError(f"distributed must be True, False or None (auto), got {distributed!r}")
        if distributed is False:
            return None
        ready = dist.is_available() and dist.is_initialized()
        if distributed and not ready:
            raise ValueError("distributed=True needs torch.distributed.init_process_group() to have run first "
                             "(launch with torchrun); pass distributed=False (or leave it None) for a single process")
        return cls() if ready else None

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def shard(self, dataset: Any, *, shuffle: bool, drop_last: bool,
              loader_kwargs: Mapping[str, Any]) -> Tuple[Dict[str, Any], bool]:
        """Give each rank its own part of the data with ``DistributedSampler``, unless the user chose a sampler
        (or the dataset is an ``IterableDataset``, which shards itself).

        The sampler's seed is the ``generator``'s initial seed (else 0), rank 0's, since a ``DistributedSampler``
        only partitions the data when every rank shuffles with the same seed. Returns the DataLoader keywords and
        the ``shuffle`` to pass on (the sampler shuffles, the loader must not).
        """
        kwargs = dict(loader_kwargs)
        generator = kwargs.get("generator")
        seed = self.broadcast_object(int(generator.initial_seed()) if generator is not None else 0)
        if isinstance(dataset, IterableDataset) or kwargs.get("sampler") is not None \
                or kwargs.get("batch_sampler") is not None:
            return kwargs, shuffle
        kwargs["sampler"] = ShardingSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                            shuffle=shuffle, seed=seed, drop_last=drop_last)
        return kwargs, False

    def share_profile(self, profile: Any) -> Any:
        """Rank 0's machine profile, with CPUs, memory and /dev/shm divided among the ranks of a node.

        When the usable CPUs are unknown, the logical count is divided instead (what the tuner would use).
        """
        profile = self.broadcast_object(profile)
        n = self.local_world_size
        if n <= 1:
            return profile
        cpus = profile.cpu.usable if profile.cpu.usable is not None else profile.cpu.logical
        cpu = dataclasses.replace(profile.cpu, usable=None if cpus is None else max(1, cpus // n))
        memory = dataclasses.replace(profile.memory, budget_bytes=_share(profile.memory.budget_bytes, n))
        shm = dataclasses.replace(profile.shm, free_bytes=_share(profile.shm.free_bytes, n))
        return dataclasses.replace(profile, cpu=cpu, memory=memory, shm=shm)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; torch picks the backend's device)."""
        holder: List[Any] = [obj if self.is_leader else None]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def broadcast(self, result: Optional[TuneResult]) -> Optional[TuneResult]:
        """Rank 0's result (or miss) on every rank, sent as its plain JSON form."""
        data = self.broadcast_object(None if result is None else result.to_dict())
        return None if data is None else TuneResult.from_dict(data)

    def agreement(self) -> Agreement:
        """What ``tune(agreement=...)`` needs (see NOTE [ One decision across ranks ])."""
        return _MinAcrossRanks(self.world_size)


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
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if isinstance(owner, shard_type) and getattr(owner, "num_processes", 1) > 1:
            raise RuntimeError(
                f"autoloader: accelerate shards this DataLoader again (BatchSamplerShard over "
                f"{owner.num_processes} processes) although autoloader already shards it across {num_replicas} "
                f"processes with a DistributedSampler: each process would see 1/{num_replicas * owner.num_processes} "
                f"of the data. Pass the PrefetchLoader itself to accelerator.prepare (it comes back unchanged), or "
                f"build it with make_loader(..., distributed=False) and prepare loader.loader")
        frame = frame.f_back


def _share(value: Optional[int], n: int) -> Optional[int]:
    return None if value is None else value // n


class _MinAcrossRanks:
    """``reduce_min`` over all ranks (see NOTE [ One decision across ranks ])."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def reduce_min(self, values: Sequence[float]) -> List[float]:
        mine = [float(v) for v in values]
        gathered: List[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        if any(not isinstance(g, list) or len(g) != len(mine) for g in gathered):
            raise RuntimeError(
                f"autoloader ranks diverged: this rank agreed on {len(mine)} values, others sent "
                f"{[None if not isinstance(g, list) else len(g) for g in gathered]}; see NOTE [ One decision "
                f"across ranks ] in autoloader/distributed.py")
        return [min(column) for column in zip(*gathered)]
