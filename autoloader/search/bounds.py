"""The most workers a search may start for a request on this machine: one rule for trials, online tuning and the
cache lookup (a cached decision asking for more is not used)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torch.utils.data import IterableDataset

from .._shards import shard_count
from ..probe import MachineProfile, open_files_limit


def default_max_workers(*, usable_cpus: Optional[int], nofile: Optional[int]) -> int:
    """The upper bound on workers when the user sets none.

    Waiting workers may far exceed the cores (latency-bound reads want several times the core count), so the bound is
    not the core count: 64, or fewer when each worker's share of ``ulimit -n`` would drop below 32 descriptors.
    """
    bound = max(64, 8 * (usable_cpus or 1))
    if nofile is not None:
        bound = min(bound, max(1, nofile // 32))
    return bound


@dataclass(frozen=True)
class Bounds:
    """``cap`` workers at most, and why (``reason``: empty when it is only the default bound of
    ``default_max_workers``); ``by_open_files``: the open-files limit set it, and raising it might pay."""

    cap: int
    usable_cpus: int
    reason: str = ""
    by_open_files: bool = False


def usable_cpus(profile: MachineProfile) -> int:
    """The CPUs a search sizes workers (and their native pools) by: the usable ones, else the logical ones, else 1."""
    return profile.cpu.usable or profile.cpu.logical or 1


def worker_bounds(profile: MachineProfile, *, max_workers: Optional[int], dataset: Any) -> Bounds:
    """The user's ``max_workers``, else ``default_max_workers`` from the usable CPUs and the open-files limit;
    never more than the shards an IterableDataset reads (``_shards.shard_count``)."""
    usable = usable_cpus(profile)
    nofile = open_files_limit()[0]
    cap = default_max_workers(usable_cpus=usable, nofile=nofile)
    by_nofile = cap < default_max_workers(usable_cpus=usable, nofile=None)
    reason = f"at most {cap} workers: `ulimit -n` is {nofile}" if by_nofile else ""
    if max_workers is not None:
        cap, reason, by_nofile = max_workers, "", False
    shards = shard_count(dataset) if isinstance(dataset, IterableDataset) else None
    if shards is not None and shards < cap:
        cap, by_nofile, reason = shards, False, f"at most {shards} workers: the dataset reads {shards} shards"
    return Bounds(cap, usable, reason, by_nofile)
