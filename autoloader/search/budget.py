"""The memory budget a loader must stay under, and what a candidate configuration would take of it: pure functions of
the machine's facts and of what trials measured (tested on tables).

# NOTE [ Memory budget ]
# The budget is decided here and nowhere else (``resolve_budget``): ``make_loader(memory_budget=...)`` bytes as given
# ("user"), or a fraction (default ``DEFAULT_FRACTION``) of what this process may still allocate, which the probe
# reads as the smaller of the machine's available memory and the cgroup's headroom (limit - working set), and which
# ``distributed.Group.share_profile`` already divided among the ranks of a node. Half is tf.data's anchor for its
# ``ram_budget``: the training process itself (model, optimizer, CUDA context, the batches it holds) needs the rest.
# A candidate's footprint (``footprint``) is what autoloader adds to the process tree:
#   workers      num_workers x one worker's private memory (USS) measured, plus its growth during the trial;
#   in flight    ``LoaderConfig.shm_batches``: those in flight + 2, in /dev/shm (tmpfs: RAM, charged to the cgroup),
#                which is also checked against free /dev/shm as a limit of its own (``shm_need_bytes``);
#   pinned       as many page-locked copies when pin_memory (the pin thread copies every batch it takes);
#   threads      with threads > 1, each loading process holds a batch's samples in its threads' hands before collate
#                (one per-thread share of the batch per thread: a batch per process).
# Every check uses ``footprint``: ``budget_guard`` before a candidate starts, the choice at the end (a candidate whose
# measured footprint is over the budget is not chosen), and ``policy.no_longer_fits`` on a cached result.
# Copy-on-read (NOTE [ Copy-on-read ] in measure/advice.py) makes workers grow with every sample they read; a trial
# sees the start of it. ``growth_per_sample`` is the largest worker's growth, less what a healthy worker also shows
# once (``growth_noise_bytes``: allocator warm-up, the collector's first pass over inherited objects, batches being
# built; measured 1-3 MiB in a pytest process), over the samples a worker made during the trial's growth interval
# (first batch to the window's end: about the window's batches plus the start-up burst, each worker a 1/num_workers
# share). Measured on a dataset that keeps 128 KiB per sample: 0.82-1.17 x that with 2 and 4 workers.
# ``forecast_bytes`` extends it to the end of an epoch (this rank's share of the dataset): each worker's USS + slope x
# its share of the epoch's samples, in the same ``footprint``. Linear is an upper bound: copy-on-read stops at the
# size of the objects inherited.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..config import LoaderConfig
from ..report import mib
from ..results import TrialResult

__all__ = ["DEFAULT_FRACTION", "GROWTH_NOISE_BYTES", "SHM_MARGIN", "Footprint", "MemoryBudget", "budget_guard",
           "footprint", "forecast_bytes", "growth_noise_bytes", "growth_per_sample", "resolve_budget",
           "shm_need_bytes", "trial_footprint"]

DEFAULT_FRACTION = 0.5
"""The share of this process's available memory (cgroup-aware, per local rank) the loader may take by default."""
SHM_MARGIN = 0.9
"""/dev/shm is full well before its last byte: keep this share of what is free."""
GROWTH_NOISE_BYTES = 4 * 2**20
"""A worker's USS grows this much once in any trial, whatever it reads (see NOTE [ Memory budget ])."""
BudgetArg = Union[None, int, float]


@dataclass(frozen=True)
class MemoryBudget:
    """The loader's memory budget: ``bytes`` (None: unknown, nothing is checked), the ``fraction`` of ``basis_bytes``
    it is (None for bytes the user gave), and ``source``: "user" (bytes given), "cgroup" (a fraction of the cgroup's
    headroom, the tighter), "available" (a fraction of the machine's available memory) or "unknown"."""

    bytes: Optional[int]
    fraction: Optional[float]
    source: str
    basis_bytes: Optional[int] = None
    user_fraction: bool = False

    def describe(self) -> str:
        if self.bytes is None:
            return "unknown (the memory available could not be read): nothing is checked"
        if self.source == "user":
            return f"{mib(self.bytes)} (memory_budget={self.bytes}, set by the user)"
        basis = "the cgroup's headroom (limit - used)" if self.source == "cgroup" else "the available memory"
        given = f"memory_budget={self.fraction:g}" if self.user_fraction else "the default"
        return f"{mib(self.bytes)} ({self.fraction:g} of {mib(self.basis_bytes or 0)}, {basis}; {given})"


def resolve_budget(memory_budget: BudgetArg, memory: Any) -> MemoryBudget:
    """THE memory budget: ``memory_budget`` as checked by ``_validate.check_memory_budget`` (None, bytes as an int,
    or a fraction in (0, 1]) over the profile's ``memory`` (a ``MemoryInfo``: ``budget_bytes`` is what may still be
    allocated, already divided among local ranks; ``headroom_bytes`` says whether the cgroup is the tighter)."""
    if isinstance(memory_budget, int) and not isinstance(memory_budget, bool):
        return MemoryBudget(int(memory_budget), None, "user")
    fraction = DEFAULT_FRACTION if memory_budget is None else float(memory_budget)
    basis = memory.budget_bytes
    if basis is None:
        return MemoryBudget(None, fraction, "unknown", None, memory_budget is not None)
    headroom, available = memory.headroom_bytes, memory.available_bytes
    cgroup = headroom is not None and (available is None or headroom < available)
    return MemoryBudget(int(fraction * basis), fraction, "cgroup" if cgroup else "available", basis,
                        memory_budget is not None)


@dataclass(frozen=True)
class Footprint:
    """What one configuration adds to the process tree's memory (see NOTE [ Memory budget ]); ``workers_bytes`` is
    None when one worker's memory is not known yet."""

    workers_bytes: Optional[int]
    shm_bytes: int
    pinned_bytes: int
    threads_bytes: int

    @property
    def total_bytes(self) -> Optional[int]:
        if self.workers_bytes is None:
            return None
        return self.workers_bytes + self.shm_bytes + self.pinned_bytes + self.threads_bytes

    def describe(self) -> str:
        parts = [("workers", self.workers_bytes), ("batches in /dev/shm", self.shm_bytes),
                 ("pinned copies", self.pinned_bytes), ("thread buffers", self.threads_bytes)]
        return " + ".join(f"{mib(v)} {name}" for name, v in parts if v)


def shm_need_bytes(config: LoaderConfig, batch_bytes: int) -> int:
    """/dev/shm the batches in flight take (``LoaderConfig.shm_batches``)."""
    return config.shm_batches() * batch_bytes


def footprint(config: LoaderConfig, *, per_worker_bytes: Optional[int], batch_bytes: Optional[int]) -> Footprint:
    """THE footprint of ``config`` when one worker takes ``per_worker_bytes`` (USS plus growth) and a batch
    ``batch_bytes`` (unknown: 0 for the batch parts)."""
    n, batch = config.num_workers, batch_bytes or 0
    shm = shm_need_bytes(config, batch)
    pinned = (shm if n else 2 * batch) if config.pin_memory else 0
    threads = max(1, n) * config.threads * math.ceil(batch / config.threads) if config.threads > 1 else 0
    workers = 0 if n == 0 else (None if per_worker_bytes is None else n * per_worker_bytes)
    return Footprint(workers, shm, pinned, threads)


def trial_footprint(trial: TrialResult) -> Optional[int]:
    """The footprint a trial measured: its own workers' memory (the largest USS plus growth, per worker)."""
    if trial.config.num_workers and trial.worker_uss_bytes is None:
        return None
    per_worker = None if trial.worker_uss_bytes is None else \
        trial.worker_uss_bytes + max(0, trial.worker_uss_growth_bytes or 0)
    return footprint(trial.config, per_worker_bytes=per_worker, batch_bytes=trial.batch_bytes).total_bytes


def budget_guard(config: LoaderConfig, *, per_worker_bytes: Optional[int], batch_bytes: Optional[int],
                 budget_bytes: Optional[int], shm_free_bytes: Optional[int]) -> Optional[str]:
    """Why ``config`` would not fit in the memory budget or in free /dev/shm, or None (an unknown figure passes)."""
    need = footprint(config, per_worker_bytes=per_worker_bytes, batch_bytes=batch_bytes)
    total = need.total_bytes
    if config.num_workers and total is not None and budget_bytes is not None and total > budget_bytes:
        return (f"memory: {config.num_workers} workers need {mib(total)} ({need.describe()}), over the memory "
                f"budget of {mib(budget_bytes)}; pass memory_budget= (bytes, or a fraction of the available memory) "
                f"to allow more, or max_workers= to try fewer")
    if config.num_workers and batch_bytes is not None and shm_free_bytes is not None and \
            need.shm_bytes > SHM_MARGIN * shm_free_bytes:
        return (f"/dev/shm: {config.num_workers} workers x prefetch {config.prefetch_factor} batches of "
                f"{mib(batch_bytes)} need {mib(need.shm_bytes)}, only {mib(shm_free_bytes)} free (Docker: --shm-size)")
    return None


def growth_noise_bytes(trial: TrialResult) -> int:
    """Growth any worker shows once during a trial: ``GROWTH_NOISE_BYTES``, or the batches a worker holds
    (``LoaderConfig.worker_batches``) when more (a batch built in shared memory counts as the worker's own until the
    main process maps it)."""
    return max(GROWTH_NOISE_BYTES, trial.config.worker_batches() * (trial.batch_bytes or 0))


def growth_per_sample(trial: TrialResult) -> Optional[float]:
    """Bytes one worker's USS grew per sample it made during the trial (copy-on-read) beyond the noise, or None when
    not measured (no workers, no growth figure, no batches); 0 for a worker that did not grow past the noise."""
    n, growth = trial.config.num_workers, trial.worker_uss_growth_bytes
    if n == 0 or growth is None or trial.batches <= 0:
        return None
    batch_size = trial.samples_per_s * trial.window_s / trial.batches if trial.samples_per_s and trial.window_s \
        else None
    if not batch_size:
        return None
    per_worker = (trial.batches + trial.config.burst_batches()) * batch_size / n
    return max(0, growth - growth_noise_bytes(trial)) / per_worker


def forecast_bytes(trial: TrialResult, *, epoch_samples: Optional[int]) -> Optional[int]:
    """The footprint of ``trial``'s configuration at the end of an epoch of ``epoch_samples`` (this rank's share),
    its workers growing at the measured ``growth_per_sample``; None when it cannot be told."""
    slope = growth_per_sample(trial)
    if slope is None or epoch_samples is None or trial.worker_uss_bytes is None:
        return None
    n = trial.config.num_workers
    per_worker = trial.worker_uss_bytes + int(slope * epoch_samples / n)
    return footprint(trial.config, per_worker_bytes=per_worker, batch_bytes=trial.batch_bytes).total_bytes
