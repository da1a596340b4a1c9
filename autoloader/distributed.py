"""torch.distributed awareness: shard the data with DistributedSampler across every rank, and let the ranks of each
node measure together, share that node's CPUs and memory, and reach that node's decision.

# NOTE [ One decision across ranks ]
# What is global, what is per node. A DataLoader configuration changes neither the batches a rank sees nor anything
# DDP synchronises, and workers compete only for their own node's CPUs, RAM, /dev/shm and disk: so each node decides
# for itself, and only the facts that make one epoch across ranks are global.
# - Global (every rank of the job, once per ``make_loader``): the node layout (one ``all_gather_object`` of each
#   rank's node identity, ``nodes.node_layout``), and in ``shard`` the facts every rank must share (batch size, dataset
#   length, shuffle, drop_last; a mismatch raises the same ValueError on every rank) and the sampler's seed (rank 0's).
# - Per node (the node's own process group, ``Group._pg``): the machine profile (the node leader's, split among the
#   node's ranks), the cache lookup and write (the node leader, lowest global rank of the node, under the node's
#   hardware key), every figure a search reads (``Group.coordinator()``, coordination.py: the slowest rank's rate,
#   the largest cost), online switching in lockstep, and the result (the node leader's, ``broadcast``).
# Trials run on all ranks of a node at once, so they measure the contention training will see. The search must take
# the same path on every rank of the node, or one would wait forever on a collective another skips: every method here
# that talks to other ranks is called by all ranks of its scope, unconditionally, in the same order.
# Why no cross-node wait: after the layout and ``shard`` (both before any tuning), no autoloader collective spans two
# nodes; a node's trials, online candidates and decision use only its own group (with several nodes a separate
# communicator, so they never interleave with DDP's collectives; with one node the default group itself, where they
# come in the same order on every rank, between DDP's). Every exchange within a node is one all-gather at one of the
# fixed sync points of ``coordination.Coordinator``, carrying its name: ranks whose paths parted raise "ranks
# diverged" where each one was, instead of pairing two different exchanges or hanging. Collectives are called from
# two modules only: this one (the job: layout, sharding, checkpoints, ``node_decisions``) and coordination.py (a
# node), each through ``coordination.all_gather`` (NOTE [ An exchange right before exit ]). A fast node returns from
# ``make_loader`` and runs ahead until DDP's first collective, which would wait for the slow node anyway.
# ``node_decisions`` is the one global call after that, made by the user at a point where all ranks meet (an epoch's
# end).
# A node is what the launcher says (torchrun's GROUP_RANK, Slurm's SLURM_NODEID) when every rank has it, else the
# hostname; so two launches on one host are two nodes, and a cluster without those variables still works.
# Values travel through torch's object collectives, which pick the backend's device themselves: the CPU for gloo
# (or a "cpu:gloo,cuda:nccl" group), the current CUDA device for NCCL (so NCCL users must call
# ``torch.cuda.set_device(local_rank)`` first, as every NCCL program must).
"""
from __future__ import annotations

import dataclasses
import logging
import socket
from typing import Any, Dict, List, Mapping, Optional, Tuple, overload

import torch.distributed as dist
from torch.utils.data import IterableDataset

from .coordination import Coordinator, all_gather
from .nodes import Node, local_world_size_from_env, node_from_env, node_group, node_layout
from .probe.machine import MachineProfile
from .results import TuneResult
from .sharding import ShardingSampler, check_same

log = logging.getLogger("autoloader.distributed")

class Group:
    """The default process group seen from this rank, with this rank's node and the node's own process group. Build
    it with ``Group.current`` on every rank (it gathers every rank's node identity).

    ``rank`` and ``world_size`` are global (sharding); ``is_leader``, ``broadcast`` and ``coordinator`` are the node's
    (see NOTE [ One decision across ranks ])."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.backend = str(dist.get_backend())
        identities = all_gather((node_from_env(), socket.gethostname()), size=self.world_size)
        self.nodes = node_layout(identities)
        index = next(i for i, ranks in enumerate(self.nodes) if self.rank in ranks)
        ranks = self.nodes[index]
        self.node = Node(index, len(self.nodes), ranks, identities[ranks[0]][1])
        self.local_world_size = local_world_size_from_env() or len(ranks)
        self.node_cpus: Optional[int] = None
        """The node's usable CPUs before they are split among its ranks (``share_profile``; part of the cache key)."""
        self._pg = node_group(self.nodes, index)
        log.debug("rank %d of %d, %s (%d ranks share its resources), backend %s", self.rank, self.world_size,
                  self.node.label, self.local_world_size, self.backend)

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
        """The node leader (its lowest global rank): reads and writes the node's cache entry."""
        return self.rank == self.node.ranks[0]

    @property
    def node_size(self) -> int:
        return len(self.node.ranks)

    def shard(self, dataset: Any, *, batch_size: Optional[int], shuffle: Optional[bool], drop_last: bool,
              loader_kwargs: Mapping[str, Any]) -> Tuple[Dict[str, Any], Optional[bool]]:
        """Give each rank its own part of the data with ``DistributedSampler``, unless the user chose a sampler
        (or the dataset is an ``IterableDataset``, which shards itself). Global: every rank of the job calls it.

        When autoloader shards, every rank must pass the same batch size, dataset length, shuffle and drop_last (a
        ValueError on every rank names the difference). The sampler's seed is the ``generator``'s initial seed (else
        0), rank 0's, since a ``DistributedSampler`` only partitions the data when every rank shuffles with the same
        seed. Returns the DataLoader keywords and the ``shuffle`` to pass on (the sampler shuffles, the loader must
        not).
        """
        kwargs = dict(loader_kwargs)
        generator = kwargs.get("generator")
        theirs = isinstance(dataset, IterableDataset) or kwargs.get("sampler") is not None \
            or kwargs.get("batch_sampler") is not None
        facts: Dict[str, Any] = {"sampler": "yours" if theirs else "autoloader's DistributedSampler"}
        if not theirs:  # a sharding of the user's (pre-sharded data, a sampler of theirs) may differ by rank
            facts.update({"batch_size": batch_size, "len(dataset)": len(dataset), "shuffle": shuffle,
                          "drop_last": drop_last})
        gathered = all_gather((facts, int(generator.initial_seed()) if generator is not None else 0),
                              size=self.world_size)
        check_same([f for f, _ in gathered], self.nodes)
        if theirs:
            return kwargs, shuffle
        seed = gathered[0][1]
        kwargs["sampler"] = ShardingSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                            shuffle=bool(shuffle), seed=seed, drop_last=drop_last)
        return kwargs, False

    def share_profile(self, profile: MachineProfile) -> MachineProfile:
        """The node leader's machine profile, with CPUs, memory and /dev/shm divided among the node's ranks.

        When the usable CPUs are unknown, the logical count is divided instead (what the tuner would use).
        """
        profile = self.coordinator().leader("profile", profile)
        cpus = profile.cpu.usable if profile.cpu.usable is not None else profile.cpu.logical
        self.node_cpus = cpus
        n = self.local_world_size
        if n <= 1:
            return profile
        cpu = dataclasses.replace(profile.cpu, usable=None if cpus is None else max(1, cpus // n))
        memory = dataclasses.replace(profile.memory, budget_bytes=_share(profile.memory.budget_bytes, n))
        shm = dataclasses.replace(profile.shm, free_bytes=_share(profile.shm.free_bytes, n))
        return dataclasses.replace(profile, cpu=cpu, memory=memory, shm=shm)

    @overload
    def broadcast(self, result: TuneResult, *, point: str = ...) -> TuneResult: ...
    @overload
    def broadcast(self, result: Optional[TuneResult], *, point: str = ...) -> Optional[TuneResult]: ...

    def broadcast(self, result: Optional[TuneResult], *, point: str = "decision") -> Optional[TuneResult]:
        """The node leader's result (or miss) on every rank of the node (``Coordinator.leader`` at ``point``: the
        cached, the tuned, an online decision), sent as its plain JSON form; with several nodes its reason starts with
        the node that decided (``Node.label``). Every rank passes a result of the same kind (all a miss, or all a
        result), so a result in gives a result out."""
        data = self.coordinator().leader(point, None if result is None else result.to_dict())
        if data is None:
            return None
        if self.node.count > 1:
            data = dict(data, reason=self.node.labelled(str(data.get("reason") or "")))
        return TuneResult.from_dict(data)

    def coordinator(self) -> Coordinator:
        """How this node's ranks agree while they tune (see NOTE [ One decision across ranks ])."""
        return Coordinator(self.node_size, self._pg, leader=self.is_leader)


def node_decisions(loader: object) -> List[Dict[str, Any]]:
    """Every node's decision for ``loader``, on every rank; rank 0 logs them, one line per node.

    Each node decides for itself (NOTE [ One decision across ranks ]): this gathers what each decided. A collective
    over all ranks: call it on every rank at a point where they all meet anyway (after an epoch), never inside one
    (a node tuning online may still be searching, and would wait for the others).

    Args:
        loader: A ``make_loader`` result, or anything with a ``.tuning`` (a ``TuneResult`` or None).

    Returns:
        list: One dict per node, in node order: ``node`` (its index), ``ranks`` (its global ranks), ``host`` (its
        leader's hostname), and, when it has decided, ``config`` (the configuration's label), ``num_workers``,
        ``source``, ``samples_per_s`` and ``reason`` (the node leader's ``loader.tuning``).

    Raises:
        ValueError: ``torch.distributed`` is not initialised (call ``init_process_group()`` first).
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("node_decisions needs torch.distributed.init_process_group() to have run first")
    tuning = getattr(loader, "tuning", None)
    mine = None if tuning is None else {
        "config": tuning.config.label(), "num_workers": tuning.config.num_workers, "source": tuning.source,
        "samples_per_s": tuning.samples_per_s, "reason": tuning.reason}
    gathered = all_gather((node_from_env(), socket.gethostname(), mine), size=dist.get_world_size())
    nodes = node_layout([(env, host) for env, host, _ in gathered])
    found = [dict(gathered[ranks[0]][2] or {}, node=i, ranks=list(ranks), host=gathered[ranks[0]][1])
             for i, ranks in enumerate(nodes)]
    if dist.get_rank() == 0:
        for entry in found:
            log.info("node %d (host %s, ranks %s): %s from %s, %s samples/s", entry["node"], entry["host"],
                     entry["ranks"], entry.get("config", "no decision"), entry.get("source", "-"),
                     "-" if entry.get("samples_per_s") is None else f"{entry['samples_per_s']:,.0f}")
    return found


def gather_states(own: Dict[str, Any], *, format: int) -> Dict[str, Any]:
    """Every rank's checkpoint in one dict (a collective over the job, ``PrefetchLoader.state_dict``), else ``own``
    itself in a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return own
    states = all_gather(own, size=dist.get_world_size())
    return {"format": format, "world_size": len(states), "per_rank": states}


def _share(value: Optional[int], n: int) -> Optional[int]:
    return None if value is None else value // n
