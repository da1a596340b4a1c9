"""What a search knows before it measures anything (``Settings``, frozen) and what it has measured since
(``Findings``): the facts ``search.Search`` and its thread and native parts read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

import torch

from ..config import DEFAULT_PREFETCH, LoaderConfig, default_pin
from ..probe import start_method
from ..probe.machine import MachineProfile
from ..results import TrialResult
from .memory import MemoryBudget, resolve_budget


@dataclass(frozen=True)
class Settings:
    """A search's fixed facts: the request's, the machine's bounds and budgets, and how it searches."""

    batch_size: int
    device: torch.device
    fixed: Mapping[str, Any]
    cap: int
    """The most workers any candidate has (``bounds.worker_bounds``)."""
    usable: int
    """The usable CPUs."""
    cap_reason: str
    cap_by_open_files: bool
    budget: float
    """Seconds (``math.inf`` online)."""
    memory: MemoryBudget
    """The memory budget (``memory.resolve_budget``; NOTE [ Memory budget ] in memory.py): every candidate's
    footprint stays under it."""
    shm_free: Optional[int]
    epoch_samples: Optional[int]
    """Samples in one of this rank's epochs (None: unknown), for the forecast of copy-on-read growth."""
    disk_mb_s: Optional[float]
    """The disk's sequential read speed (saved machine profile), for the ceiling an I/O-bound result reports."""
    tolerance: float
    trial_limit: float
    pin: bool
    """``pin_memory`` of the search's candidates: the user's, else the device's default; a re-tune's (``start``), the
    configuration in force's."""
    prefetch: int
    """``prefetch_factor`` of the search's candidates (a deeper one is compared last), as ``pin``."""
    tune_threads: bool
    """``threads=True``: (processes, threads) candidates, first or after the process-only search."""
    threads: int
    """Threads per process of every process-only candidate (the user's ``threads=N``, else 1)."""
    native_setting: Union[None, bool, int]
    """``native_threads=`` (None: the limit of each worker's native pools is autoloader's, ``native_policy``)."""
    start: Optional[LoaderConfig] = None
    """Search near this configuration (the one in force) instead of from the serial one."""
    descend: bool = False
    """From ``start``, try only fewer workers (``policy.next_count_down``)."""
    spawned: bool = False
    """Workers start as fresh interpreters (``spawn``, ``forkserver``: macOS's and Windows' default), each importing
    torch and unpickling the dataset, not by ``fork``: a start costs a second of CPU, not 20 ms."""

    @property
    def memory_budget(self) -> Optional[int]:
        return self.memory.bytes

    @classmethod
    def of(cls, request: Any, profile: MachineProfile, *, bounds: Any, budget: float, trial_limit: float,
           tolerance: float, start: Optional[LoaderConfig], descend: bool) -> "Settings":
        """The settings of a search for ``request`` (a ``request.Request``) on ``profile``'s machine, within the
        worker ``bounds`` (``bounds.worker_bounds``) and ``budget`` seconds, each candidate within ``trial_limit``
        (``candidates.trial_limit``); its memory budget is ``resolve_budget``'s. ``request`` and ``bounds`` are not
        named here: their modules import more than a record of facts should (tests/test_imports.py's depth)."""
        fixed = request.fixed
        memory = resolve_budget(request.memory_budget, profile.memory)
        pin, prefetch = default_pin(fixed, request.device.type), int(fixed.get("prefetch_factor") or DEFAULT_PREFETCH)
        if start is not None and start.num_workers:  # a re-tune measures the configuration in force, and its family
            pin, prefetch = start.pin_memory, start.prefetch_factor or prefetch
        return cls(request.batch_size, request.device, fixed, bounds.cap, bounds.usable_cpus, bounds.reason,
                   bounds.by_open_files, budget, memory, profile.shm.free_bytes, epoch_samples(request),
                   profile.disk.seq_read_mb_s if profile.disk else None, tolerance, trial_limit, pin, prefetch,
                   request.threads is True, request.fixed_threads, request.native_threads, start, descend,
                   start_method(request.setting("multiprocessing_context")) != "fork")


@dataclass
class Findings:
    """What a search measured so far, and what it learnt from it."""

    trials: List[TrialResult] = field(default_factory=list)
    by_config: Dict[LoaderConfig, TrialResult] = field(default_factory=dict)
    serial: Optional[TrialResult] = None
    """The serial candidate once measured (None without one: a fixed ``num_workers``, or from ``start``)."""
    consumer_rate: Optional[float] = None
    """The consumer's own rate (``batch_size / step``) once measured."""
    ceiling: Optional[float] = None
    """``policy.rate_ceiling`` once measured: no candidate climbs past one that reaches it."""
    batch_bytes: Optional[int] = None
    per_worker_bytes: Optional[int] = None
    memory_limited: bool = False


def epoch_samples(request: Any) -> Optional[int]:
    """Samples in one epoch of this rank: its sampler's length (a ``DistributedSampler`` holds the rank's share), else
    the dataset's; None when neither has a length (an ``IterableDataset`` without one)."""
    for source in (request.loader_kwargs.get("sampler"), request.dataset):
        try:
            return len(source)
        except TypeError:  # None, or no __len__
            continue
    return None
