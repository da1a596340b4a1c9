"""The ``TuneResult`` a search returns (``conclude``, ``unmeasured``), and what it reports of its choice, as pure
functions of what the trials measured (tested on tables): what limits it (``bottleneck``), the samples/s the disk
allows (``disk_ceiling``), whether its workers stay alive between epochs (``keep_workers_alive``), and why it was
chosen (``why_chosen``). ``search.Search.result`` calls it with the search's settings and findings."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

from . import native_policy
from .memory import lasting_bytes, skipped_for_memory
from .capacity import cpu_saturated, step_cpus
from .candidates import fallback_result
from .settings import Findings, Settings
from .threads_policy import rate
from ..errors import warn_user
from ..results import Bottleneck, TrialResult, TuneResult

__all__ = ["bottleneck", "conclude", "disk_ceiling", "keep_workers_alive", "oversubscribed", "unmeasured",
           "why_chosen"]


def conclude(chosen: TrialResult, settings: Settings, found: Findings, *, consumer_rate: Optional[float],
             seconds: float, refits: Callable[[TrialResult], bool]) -> TuneResult:
    """The result of a search that chose ``chosen``: its configuration with ``persistent_workers`` decided (unless
    fixed), the bottleneck (memory when a count above it was skipped for memory and would still not fit: ``refits``
    says which would), the disk's ceiling when I/O bound, and why; warns when every worker count failed."""
    n = chosen.config.num_workers
    failures = [t for t in found.trials if t.status == "failed" and t.config.num_workers > 0]
    if n == 0 and failures and not any(t.ok and t.config.num_workers for t in found.trials):
        warn_user(f"every worker count failed ({failures[0].reason}); using num_workers=0")
    persistent = settings.fixed.get("persistent_workers")
    if persistent is None:
        persistent = keep_workers_alive(n, per_worker_bytes=found.per_worker_bytes, budget_bytes=settings.memory_budget,
                                        lasting_bytes=lasting_bytes(chosen))
    memory_limited = found.memory_limited or any(skipped_for_memory(t) and t.config.num_workers > n and not refits(t)
                                                 for t in found.trials)
    neck = bottleneck(chosen, found.trials, consumer_samples_per_s=consumer_rate, usable_cpus=settings.usable,
                      memory_limited=memory_limited)
    why = why_chosen(chosen, found.trials, tolerance=settings.tolerance, threads=settings.tune_threads,
                     cap_reason=settings.cap_reason)
    per_sample = chosen.read_bytes_per_batch / settings.batch_size if chosen.read_bytes_per_batch else None
    ceiling = disk_ceiling(read_bytes_per_sample=per_sample, seq_read_mb_s=settings.disk_mb_s) if neck == "io" else None
    config = dataclasses.replace(chosen.config, persistent_workers=bool(persistent and n > 0))
    return TuneResult(config, chosen.samples_per_s, neck, "tuned", tuple(found.trials), consumer_rate, seconds, why,
                      created=time.time(), disk_ceiling_samples_per_s=ceiling,
                      read_bytes_per_sample=per_sample if ceiling is not None else None,
                      memory_budget_bytes=settings.memory_budget, memory_budget_from=settings.memory.describe())


def unmeasured(settings: Settings, trials: Sequence[TrialResult], *, consumer_rate: Optional[float], seconds: float,
               native_threads: Optional[int]) -> TuneResult:
    """The result of a search whose trials measured no rate: the fallback configuration
    (``candidates.fallback_result``, its workers' native pools limited to ``native_threads``), with a warning that
    names why each trial did not measure."""
    reasons = "; ".join(sorted({t.reason or t.status for t in trials})) or "no trial ran"
    fallback = fallback_result(settings.fixed, device=settings.device, threads=settings.threads,
                               native_threads=native_threads, reason=f"no trial measured a rate: {reasons}")
    warn_user(f"autoloader could not measure any configuration ({reasons}); using num_workers={fallback.num_workers}")
    return dataclasses.replace(fallback, trials=tuple(trials), consumer_samples_per_s=consumer_rate, seconds=seconds,
                               memory_budget_bytes=settings.memory_budget,
                               memory_budget_from=settings.memory.describe())


def bottleneck(chosen: TrialResult, trials: Sequence[TrialResult], *, consumer_samples_per_s: Optional[float],
               usable_cpus: int, memory_limited: bool) -> Bottleneck:
    """What limits the chosen configuration, from what it measured: ``consumer-cpu`` where it is the step and the
    step keeps at least half the usable CPUs busy itself (``capacity.step_cpus``), or where no workers were chosen
    because those measured lost beside such a step."""
    on_cpu = step_cpus(chosen, usable_cpus=usable_cpus) >= 0.5 * usable_cpus
    if on_cpu and chosen.config.num_workers == 0 and any(t.ok and t.config.num_workers > 0 for t in trials):
        return "consumer-cpu"
    if consumer_samples_per_s and rate(chosen) >= 0.9 * consumer_samples_per_s:
        return "consumer-cpu" if on_cpu else "consumer"
    if chosen.consumer_s_per_batch and chosen.window_s and \
            chosen.consumer_s_per_batch * chosen.batches >= 0.75 * chosen.window_s:
        return "consumer-cpu" if on_cpu else "consumer"
    if chosen.stall_fraction is not None and chosen.stall_fraction < 0.1 and consumer_samples_per_s:
        return "consumer-cpu" if on_cpu else "consumer"
    if memory_limited:
        return "memory"
    n = chosen.config.num_workers
    if n == 0:
        slower_with_workers = [t for t in trials if t.ok and t.config.num_workers > 0]
        if slower_with_workers:
            if oversubscribed(chosen, slower_with_workers, usable_cpus=usable_cpus):
                return "oversubscription"
            return "cpu" if native_policy.native_in_use(chosen) else "ipc"
        fetch, cpu = chosen.fetch_s_per_batch, chosen.fetch_cpu_s_per_batch
        if fetch and cpu is not None and cpu / fetch < 0.5:
            return "io"
        return "cpu"
    if cpu_saturated(chosen, usable_cpus=usable_cpus):
        return "cpu"
    if (chosen.main_cpu_util or 0.0) >= 0.9:
        return "ipc"
    if chosen.worker_cpu_util is not None and chosen.worker_cpu_util < 0.5:
        return "io"
    return "cpu"


def oversubscribed(serial: TrialResult, with_workers: Sequence[TrialResult], *, usable_cpus: int) -> bool:
    """Workers lost to serial loading because their native pools oversubscribed the CPUs: the serial loading ran
    native threads (``native_policy.native_in_use``: its CPU time above its wall time), and a configuration with
    workers was not seen held to a limit that fits (its pools unknown, as without threadpoolctl, or a limit not held),
    or its workers' pools kept several threads each, more in all than the usable CPUs (single-threaded workers
    beyond the CPUs are not the pools' doing)."""
    if not native_policy.native_in_use(serial):
        return False
    for trial in with_workers:
        if trial.native_pools is None or trial.native_limit_held is False:
            return True
        kept = max((p.kept for p in trial.native_pools), default=1)
        if kept > 1 and trial.config.num_workers * kept > usable_cpus:
            return True
    return False


def disk_ceiling(*, read_bytes_per_sample: Optional[float], seq_read_mb_s: Optional[float]) -> Optional[float]:
    """Samples per second the disk's sequential read speed allows at the bytes the workers read per sample (1 MB =
    10**6 bytes, as the probe measures it); None when either is unknown or nothing was read."""
    if not read_bytes_per_sample or read_bytes_per_sample <= 0 or not seq_read_mb_s or seq_read_mb_s <= 0:
        return None
    return seq_read_mb_s * 1e6 / read_bytes_per_sample


def keep_workers_alive(num_workers: int, *, per_worker_bytes: Optional[int], budget_bytes: Optional[int],
                       lasting_bytes: Optional[int] = None) -> bool:
    """``persistent_workers``: on with workers, unless they would hold more than half the memory budget between
    epochs, or their footprint once copy-on-read copied all it can reach (``memory.lasting_bytes``: workers kept
    across epochs get there, fresh ones each epoch start over) is over the budget."""
    if num_workers == 0:
        return False
    if budget_bytes is not None and lasting_bytes is not None and lasting_bytes > budget_bytes:
        return False
    if per_worker_bytes is None or budget_bytes is None:
        return True
    return num_workers * per_worker_bytes <= budget_bytes // 2


def why_chosen(chosen: TrialResult, trials: Sequence[TrialResult], *, tolerance: float, threads: bool,
               cap_reason: str) -> str:
    """The words a result gives for ``chosen`` among ``trials``: the rule (fewest workers, then threads per process
    with ``threads``) within ``tolerance`` of the best rate measured, the worker cap's reason, and the native limit's
    decision (``native_policy.decision_words``)."""
    best = max(rate(t) for t in trials if t.ok)
    fewest = "fewest workers, then threads per process," if threads else "fewest workers"
    why = (f"{fewest} within {tolerance:.0%} of the best measured rate ({best:,.0f} samples/s) in {len(trials)} "
           f"trials" + (f"; {cap_reason}" if cap_reason else ""))
    native = native_policy.decision_words(trials, chosen.config, tolerance=tolerance)
    return why + (f"; {native}" if native else "")
