"""The search's decisions about processes, as pure functions of measurements: which worker count to try first, next,
and at most, and which trial to choose; easy to read, and tested with tables of fake trials.

Nothing here runs a trial, reads the machine or the clock; ``search.py`` feeds these functions what it measured. The
decisions about threads per process live in ``threads_policy.py`` (NOTE [ Processes x threads ]), which
``thread_search.py`` reads directly; ``select`` only borrows its ``fewest_near``. What a worker is sized at and the
memory checks are ``memory.py``'s; what the result reports of its choice (the bottleneck) is ``verdict.py``'s.
"""
from __future__ import annotations

import math
from typing import Collection, List, Mapping, Optional, Sequence, Tuple

from . import native_policy
from .capacity import DEFAULT_TOLERANCE, HEADROOM, fill_count, pool_cpus, step_cpus, step_share, worker_bound
from .memory import forecast_bytes, growth_per_sample, trial_footprint
from .threads_policy import fewest_near, rate
from .._text import mib
from ..results import TrialResult

__all__ = [
    "DEFAULT_TOLERANCE", "FIRST_STEP_WORKERS", "MEMORY_SLACK", "MEMORY_SLACK_BYTES", "climb_cap", "contenders",
    "first_count", "least_memory", "next_count_down", "next_count_near", "next_worker_count", "predict_from_serial",
    "predict_from_workers", "rate_ceiling", "select", "select_within_budget", "workers_needed", "worth_more_prefetch"]

FIRST_STEP_WORKERS = 8
"""The first worker trial starts at most at max(this, 2 x usable CPUs): it measures per-worker cost before a big
jump."""
MEMORY_SLACK = 1.25
MEMORY_SLACK_BYTES = 64 << 20
"""Worker memory within this factor (or this many bytes) of the least measured counts as equal in ``least_memory``:
USS varies by a few percent from one trial to the next."""


def select(trials: Sequence[TrialResult], *, tolerance: float = DEFAULT_TOLERANCE) -> Optional[TrialResult]:
    """Of the configs within ``tolerance`` of the best measured rate: fewest workers (processes), then fewest
    threads per process, then least worker memory (the sum of the workers' USS; ``least_memory`` treats figures
    within a few percent as equal), then smallest prefetch_factor.

    Ties beyond that keep the faster one. None when no trial measured a rate.
    """
    near = least_memory(fewest_near(trials, tolerance=tolerance))
    if not near:
        return None
    return min(near, key=lambda t: (t.config.prefetch_factor or 0, -rate(t)))


def contenders(trials: Sequence[TrialResult], *, tolerance: float = DEFAULT_TOLERANCE) -> List[TrialResult]:
    """The trials the selection chooses among: each configuration's latest (a measurement taken again, or an online
    probe measured properly, supersedes the earlier one), less the losing side of a configuration measured with and
    without its native limit (``native_policy.without_losers``)."""
    latest = {t.config: t for t in trials}
    return native_policy.without_losers([t for t in trials if latest[t.config] is t], tolerance=tolerance)


def least_memory(trials: Sequence[TrialResult]) -> List[TrialResult]:
    """``trials`` less those whose workers measured clearly more memory (``TrialResult.worker_memory_bytes``, the
    sum of their USS) than the least (see ``MEMORY_SLACK``); a trial without a measurement stays."""
    known = [t.worker_memory_bytes for t in trials if t.worker_memory_bytes is not None]
    if not known:
        return list(trials)
    least = min(known)
    bound = max(least * MEMORY_SLACK, least + MEMORY_SLACK_BYTES)
    return [t for t in trials if (t.worker_memory_bytes or 0) <= bound]


def over_budget(trial: TrialResult, *, budget_bytes: Optional[int], epoch_samples: Optional[int]) -> bool:
    """Whether ``trial``'s workers take more than ``budget_bytes``, as measured or forecast by the end of an epoch of
    ``epoch_samples`` (copy-on-read growth): ``select_within_budget`` passes it over, so the search takes its count for
    a ceiling. Pure."""
    if budget_bytes is None or trial.config.num_workers == 0:
        return False
    if (trial_footprint(trial) or 0) > budget_bytes:
        return True
    forecast = forecast_bytes(trial, epoch_samples=epoch_samples)
    return forecast is not None and forecast > budget_bytes


def select_within_budget(trials: Sequence[TrialResult], *, tolerance: float = DEFAULT_TOLERANCE,
                         budget_bytes: Optional[int], epoch_samples: Optional[int]
                         ) -> Tuple[Optional[TrialResult], Optional[str]]:
    """``select`` among the trials whose measured footprint fits ``budget_bytes`` (NOTE [ Memory budget ]); then, when
    the chosen one's workers are forecast past the budget by the end of an epoch of ``epoch_samples`` (copy-on-read
    growth), the selection among those forecast to fit (fewer workers, or threads), else the one forecast to take the
    least. Returns (the choice, the warning to give, naming the fix, or None)."""
    if budget_bytes is None:
        return select(trials, tolerance=tolerance), None
    fits = [t for t in trials if t.config.num_workers == 0 or (trial_footprint(t) or 0) <= budget_bytes]
    chosen = select(fits, tolerance=tolerance)
    forecast = forecast_bytes(chosen, epoch_samples=epoch_samples) if chosen is not None else None
    if chosen is None or forecast is None or forecast <= budget_bytes:
        return chosen, None
    forecasts = {id(t): forecast_bytes(t, epoch_samples=epoch_samples) for t in fits if t.ok}
    lasting = [t for t in fits if t.ok and not over_budget(t, budget_bytes=budget_bytes, epoch_samples=epoch_samples)]
    better = select(lasting, tolerance=tolerance) or \
        min((t for t in fits if t.ok), key=lambda t: (forecasts[id(t)] or 0, -rate(t)))
    slope = growth_per_sample(chosen) or 0.0
    instead = "" if better is chosen else (
        f"; choosing {better.config.label()} instead (forecast "
        f"{mib(forecasts[id(better)] or trial_footprint(better) or 0)})")
    return better, (
        f"DataLoader workers grow by about {slope / 1024:,.1f} KiB per sample read (copy-on-read, PyTorch issue "
        f"13246): by the end of an epoch of {epoch_samples:,} samples {chosen.config.label()} would take about "
        f"{mib(forecast)}, over the memory budget of {mib(budget_bytes)}{instead}. Fix the dataset: store its samples "
        f"in numpy arrays or torch tensors instead of Python lists/dicts, and call gc.freeze() before the loader "
        f"starts its workers; or use fewer workers (max_workers=) or threads=True, or raise memory_budget=")


def first_count(serial: Optional[TrialResult], *, consumer_samples_per_s: Optional[float], consumer_s: float,
                usable_cpus: int, cap: int, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """The first worker count to measure after the serial candidate: none (0) when serial loading already keeps up
    with the consumer within ``tolerance``, else ``predict_from_serial`` (beside the CPUs the step keeps busy, as the
    serial candidate measured them: ``capacity.step_cpus``); without a serial rate (it failed),
    the usable CPUs, at
    most ``cap``."""
    if serial is None:
        return max(0, min(usable_cpus, cap))
    if consumer_samples_per_s and rate(serial) >= (1 - tolerance) * consumer_samples_per_s:
        return 0
    return predict_from_serial(fetch_s=serial.fetch_s_per_batch or 0.0, fetch_cpu_s=serial.fetch_cpu_s_per_batch or 0.0,
                               consumer_s=consumer_s, usable_cpus=usable_cpus, cap=cap,
                               busy_cpus=step_cpus(serial, usable_cpus=usable_cpus))


def predict_from_serial(*, fetch_s: float, fetch_cpu_s: float, consumer_s: float, usable_cpus: int,
                        cap: int, busy_cpus: float = 0.0) -> int:
    """Workers to try first, from the ``num_workers=0`` trial.

    A worker makes one batch per ``fetch_s`` seconds and keeps a CPU busy ``fetch_cpu_s / fetch_s`` of the time.
    Loading meets the consumer at ``fetch_s / consumer_s`` workers (with headroom) and fills the CPUs beside the step
    (``busy_cpus`` of the usable ones busy while it runs, ``capacity.step_share``) at ``capacity.fill_count`` of them;
    the first trial is the smaller of the two, and at most ``FIRST_STEP_WORKERS`` (or twice the CPUs) so a large jump is
    only taken once per-worker costs are measured.
    """
    if fetch_s <= 0:
        return 1
    needed = workers_needed(fetch_s=fetch_s, fetch_cpu_s=fetch_cpu_s, consumer_s=consumer_s, usable_cpus=usable_cpus,
                            busy_cpus=busy_cpus)
    first_step = max(FIRST_STEP_WORKERS, 2 * usable_cpus)
    return _clamp(math.ceil(min(needed, first_step) - 1e-9), cap)


def workers_needed(*, fetch_s: float, fetch_cpu_s: float, consumer_s: float, usable_cpus: int,
                   busy_cpus: float = 0.0) -> float:
    """Single-threaded workers (batches in flight) that meet the consumer with ``HEADROOM`` or fill the CPUs beside the
    step (``busy_cpus`` of the usable ones busy while it runs, ``capacity.step_share``), whichever is fewer, from the
    serial trial (``predict_from_serial``; threads-first sizes its first candidate by it too); 1 when nothing was
    measured."""
    if fetch_s <= 0:
        return 1.0
    by_cpu = fill_count(usable_cpus=usable_cpus, share=fetch_cpu_s / fetch_s,
                        step_share=step_share(busy_cpus=busy_cpus, consumer_s=consumer_s, worker_batch_s=fetch_s))
    by_consumer = HEADROOM * fetch_s / consumer_s if consumer_s > 0 else math.inf
    return min(by_cpu, by_consumer)


def predict_from_workers(trial: TrialResult, *, batch_size: int, consumer_s: float, usable_cpus: int,
                         cap: int, serial_samples_per_s: Optional[float] = None,
                         tolerance: float = DEFAULT_TOLERANCE) -> Optional[int]:
    """Workers that should meet the consumer or fill the CPUs, extrapolated from a trial with workers.

    Assumes throughput grows with the worker count at the measured per-worker rate, until the measured CPU use per
    worker fills the usable CPUs (``capacity.fill_count``). None when the trial lacks the figures, or when it did not
    beat the serial rate (``serial_samples_per_s``) by more than half the ``tolerance`` while the main process was the
    limit (not ``capacity.worker_bound``): the workers added nothing, so the limit is the main process or the
    hand-over, and their low CPU use says nothing about how many more would pay (measured on an H200 machine: 16
    workers at 7 % CPU each, slower than none, extrapolated to 128, a trial that could not even start). A pool that
    lost to serial serving for its own workers is extrapolated like any other.
    """
    n = trial.config.num_workers
    if not trial.ok or n == 0:
        return None
    if serial_samples_per_s is not None and rate(trial) <= (1.0 + tolerance / 2) * serial_samples_per_s \
            and not worker_bound(trial):
        return None
    per_worker = rate(trial) / n
    target = HEADROOM * batch_size / consumer_s if consumer_s > 0 else math.inf
    by_consumer = target / per_worker if per_worker > 0 else math.inf
    util = trial.worker_cpu_util
    by_cpu = fill_count(usable_cpus=usable_cpus, share=util) if util is not None else math.inf
    estimate = min(math.ceil(by_consumer - 1e-9) if math.isfinite(by_consumer) else math.inf, by_cpu)
    if math.isinf(estimate):
        return None
    return _clamp(int(estimate), cap)


def _still_rising(measured: Mapping[int, float], workers: int, *, tolerance: float) -> bool:
    """Whether ``workers`` made more than half the ``tolerance`` over every count below it (or none was below)."""
    below = [r for n, r in measured.items() if n < workers]
    return not below or measured[workers] > (1.0 + tolerance / 2) * max(below)


def next_worker_count(rates: Mapping[int, Optional[float]], *, cap: int, tolerance: float = DEFAULT_TOLERANCE,
                      refused: Collection[int] = ()) -> Optional[int]:
    """The next worker count to try, from the rates measured so far (None = failed or skipped); None when done.

    A count that failed or was skipped (None) is a ceiling: no climb reaches it, and while no worker count has
    measured a rate, half of the smallest such count is tried next (a killed or out-of-memory candidate may fit with
    fewer workers). Climb (double) while the best is the largest count tried and gains more than half the
    ``tolerance`` over the counts below it; halfway to the lowest ceiling when it is one of ``refused`` (the memory
    budget's, as measured or forecast for a whole epoch), not to a failure's (a short trial that passes below the
    count that ran out of file descriptors can still run out over an epoch: 10 workers under ``ulimit -n 64``
    did). The climb does not stop at the core count: whether more workers than cores
    pay (they fill the gaps while others hand over batches) or lose to oversubscription is measured, and such gains
    come in small steps (2-5 % a doubling, measured on 2 cores) that a full-tolerance threshold would stop too early.
    A count more than twice the fewest workers within ``tolerance`` of the best that made no more than they did (a
    jump past a peak: a service admitting 12 requests at once, 8 workers still rising and 64 contending as slow as
    them, 12-32 a third faster) sends the search to their (geometric) middle while those fewest still rose over the
    counts below them: two counts that made as much are a plateau only when nothing between was skipped (a doubling
    skips nothing that the descent does not measure). Then descend: between the fewest workers within ``tolerance`` of
    the best and the largest count below it, try the (geometric) middle until they are within a factor of 1.5 or
    adjacent.
    """
    measured = {n: r for n, r in rates.items() if r is not None}
    if not measured:
        return None
    failed = [n for n, r in rates.items() if r is None and n > 0]
    ceiling = min(failed, default=None)
    if ceiling is not None and not any(n > 0 for n in measured):
        fewer = ceiling // 2
        return fewer if fewer >= 1 and fewer not in rates else None
    best_rate = max(measured.values())
    best = min(n for n, r in measured.items() if r == best_rate)
    if best > 0 and best == max(measured) and best < cap:
        if _still_rising(measured, best, tolerance=tolerance):
            candidate = min(cap, 2 * best)
            if ceiling is not None and candidate >= ceiling and ceiling in refused:
                candidate = (best + ceiling) // 2
            if candidate > best and candidate not in rates and (ceiling is None or candidate < ceiling):
                return candidate
    good = min(n for n, r in measured.items() if r >= (1.0 - tolerance) * best_rate)
    above = min((n for n in measured if n > good), default=None)
    if good > 0 and above is not None and above > 2 * good:
        middle = round(math.sqrt(good * above))
        if _still_rising(measured, good, tolerance=tolerance) and middle not in rates and \
                (ceiling is None or middle < ceiling):
            return middle
    lower = max((n for n in rates if n < good), default=None)
    if lower is None or good - lower <= 1:
        return None
    if lower == 0:
        middle = good // 2
    else:
        if good / lower <= 1.5:
            return None
        middle = round(math.sqrt(good * lower))
    middle = min(max(middle, lower + 1), good - 1)
    return None if middle in rates else middle


def rate_ceiling(serial: Optional[TrialResult], *, batch_size: int, usable_cpus: int,
                 consumer_samples_per_s: Optional[float], pool: Optional[TrialResult] = None) -> Optional[float]:
    """The most samples/s any worker count can deliver: the consumer's own rate (no loader makes a loop faster than
    its step), and the usable CPUs' worth of the loading's CPU per sample (workers add CPUs, not speed per CPU, and
    hand batches over at a cost on top). That CPU is ``pool``'s, a pool of workers measured with the CPU its workers
    and the main process kept busy, once there is one: a measurement, where the serial trial's
    (``batch_size * usable_cpus / fetch_cpu_s``) is a model that counts whatever else kept this process's threads busy
    while it loaded (a native pool spinning after each parallel region read 1.3x the wall time as loading CPU, and the
    ceiling it gave stopped the climb at 2 workers, each 16 % busy, at 0.19x the best count). None when neither is
    known. Pure."""
    bounds = [consumer_samples_per_s] if consumer_samples_per_s else []
    measured = pool is not None and pool.ok and pool.config.num_workers and pool.worker_cpu_util is not None
    busy = pool_cpus(pool) if pool is not None and measured else 0.0
    cpu = serial.fetch_cpu_s_per_batch if serial is not None and serial.ok else None
    if pool is not None and busy > 0 and usable_cpus > 0:
        bounds.append(rate(pool) * usable_cpus / busy)
    elif cpu and cpu > 0 and usable_cpus > 0:
        bounds.append(batch_size * usable_cpus / cpu)
    return min(bounds) if bounds else None


def climb_cap(rates: Mapping[int, Optional[float]], *, cap: int, ceiling_samples_per_s: Optional[float],
              tolerance: float = DEFAULT_TOLERANCE) -> int:
    """The most workers worth measuring next: ``cap``, or the fewest measured that already reach ``rate_ceiling``
    (within ``tolerance``): no number of workers beats it by more, so a search that reached it only looks for fewer
    (fewer candidates, fewer switches)."""
    if not ceiling_samples_per_s:
        return cap
    keeping = [n for n, r in rates.items() if n > 0 and r is not None and r >= (1.0 - tolerance) *
               ceiling_samples_per_s]
    return min(cap, min(keeping)) if keeping else cap


def next_count_near(rates: Mapping[int, Optional[float]], *, cap: int, tolerance: float = DEFAULT_TOLERANCE,
                    refused: Collection[int] = ()) -> Optional[int]:
    """``next_worker_count``, for a search that starts from the configuration in force rather than from the serial
    one: it climbs and bisects the same way, and while the fewest workers measured are still within ``tolerance`` of
    the best, it tries half as many (a regime that got cheaper, such as files now in the page cache, needs fewer)."""
    proposal = next_worker_count(rates, cap=cap, tolerance=tolerance, refused=refused)
    return proposal if proposal is not None else _half_of_fewest(rates, tolerance=tolerance)


def next_count_down(rates: Mapping[int, Optional[float]], *, cap: int, tolerance: float = DEFAULT_TOLERANCE,
                    refused: Collection[int] = ()) -> Optional[int]:
    """The next worker count of a search that only goes down from the configuration in force: never above the most
    workers measured; halve while the fewest measured keep within ``tolerance`` of the best, then bisect between the
    fewest that keep up and the most that do not (``policy.next_worker_count``'s descent)."""
    measured = [n for n, r in rates.items() if r is not None]
    if not measured:
        return None
    proposal = next_worker_count(rates, cap=min(cap, max(measured)), tolerance=tolerance, refused=refused)
    return proposal if proposal is not None else _half_of_fewest(rates, tolerance=tolerance)


def _half_of_fewest(rates: Mapping[int, Optional[float]], *, tolerance: float) -> Optional[int]:
    """Half the fewest workers measured, while they are still within ``tolerance`` of the best and half was not
    tried; None otherwise (the searches that start from the configuration in force)."""
    measured = {n: r for n, r in rates.items() if r is not None}
    if not measured:
        return None
    lowest = min(measured)
    if lowest > 0 and measured[lowest] >= (1.0 - tolerance) * max(measured.values()) and lowest // 2 not in rates:
        return lowest // 2
    return None


def worth_more_prefetch(chosen: TrialResult, *, consumer_samples_per_s: Optional[float]) -> bool:
    """A deeper queue only helps when loading keeps up on average but the consumer still waits (jitter)."""
    if chosen.config.num_workers == 0 or consumer_samples_per_s is None or chosen.stall_fraction is None:
        return False
    return chosen.stall_fraction > 0.05 and rate(chosen) >= 0.8 * consumer_samples_per_s


def _clamp(n: int, cap: int) -> int:
    return max(1, min(int(n), cap)) if cap >= 1 else 0
