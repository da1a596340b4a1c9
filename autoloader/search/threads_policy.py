"""The tuner's decisions about threads inside each loading process (``threads.py``), as pure functions of what the
trials measured; ``thread_search.py`` drives them (``policy.select`` borrows ``least_memory``).

# NOTE [ Processes x threads ]
# After the process-only search, a loading process that keeps its CPU busy less than ``WAITING_BUSY`` of the time
# mostly waits (on storage, the network, a decoder that releases the GIL): threads can do that waiting inside fewer
# processes, with one copy of the dataset, one start-up and one batch hand-over per process instead of per worker.
# - The first candidate keeps the chosen configuration's samples in flight (n single-threaded workers: n) in at most
#   the usable CPUs' worth of processes (more only when threads are capped, below; never more than the process-only
#   choice had), each with at least the threads
#   that cover its wait (``threads_to_cover_wait``), and never more threads than ``max_threads_per_process`` (a
#   process fetches one batch at a time: no more threads than a batch has samples). By the measured per-process rate
#   that matches the best process-only rate.
# - Then measurement decides. Short of that rate (beyond the tolerance): a process whose CPU is saturated (CPU work,
#   or a GIL-bound transform whose threads cannot run in parallel) gets company (twice the processes, up to the
#   bound), any other gets twice the threads while doubling still gains, and twice the processes once its threads
#   reach the batch's size (the bound then allows as many processes as the process-only samples in flight need:
#   at batch 16, 64 waiting workers become 4 processes x 16 threads).
# - Within the tolerance, the threads must first beat their control: the same processes with one thread, measured
#   again right then, side by side (on a busy machine a rate measured seconds earlier may be far off, and a GIL-bound
#   transform then looks as if threads helped). A control that keeps up ends the search: threads do not pay. Else
#   fewer processes with the same samples in flight (when ``max_threads`` allows as many), then fewer threads:
#   halved, and once a count above one measured short, the count the two measurements predict (linear in threads:
#   the regime threads help in), tried only when it saves a quarter of the threads or more.
# - Nothing is assumed about the GIL: a transform that holds it measures short, and selection keeps the process-only
#   configuration (``policy.select``: within the tolerance, fewest processes, then fewest threads).
"""
from __future__ import annotations

import math
import numbers
from typing import List, Optional, Sequence, Tuple

from ..results import TrialResult


def threads_to_cover_wait(cpu_util: float, *, cap: int) -> int:
    """Threads per process that keep one CPU busy when a single-threaded worker keeps it ``cpu_util`` busy (the
    rest of the time it waits): ``ceil(1 / cpu_util)`` clamped to ``[1, cap]``; a worker that never uses the CPU gets
    ``cap``. Pure."""
    if isinstance(cap, bool) or not isinstance(cap, numbers.Integral) or cap < 1:
        raise ValueError(f"cap must be an int >= 1 (the most threads per process), got {cap!r}")
    if not math.isfinite(cpu_util) or cpu_util < 0:
        raise ValueError(f"cpu_util must be a finite CPU fraction >= 0 (busy CPU seconds per second), got "
                         f"{cpu_util!r}; pass the trial's measured worker_cpu_util")
    if cpu_util == 0:
        return int(cap)
    return max(1, min(int(cap), math.ceil(1.0 / cpu_util - 1e-9)))


WAITING_BUSY = 0.5
"""A loading process that keeps its CPU busy less than this share of the time mostly waits: threads may help."""
SATURATED_BUSY = 0.75
"""A loading process this busy has little idle CPU time left for more threads to use: it needs more processes (a
GIL-bound process never gets past one CPU, and on a shared machine often not that far)."""
MAX_THREADS = 64
"""The most threads per process the search tries (also capped at the batch size)."""
MAX_THREAD_TRIALS = 4
"""Thread candidates after the process-only search, at most."""
MEMORY_SLACK = 1.25
MEMORY_SLACK_BYTES = 64 << 20
"""Worker memory within this factor (or this many bytes) of the least measured counts as equal in ``least_memory``:
USS varies by a few percent from one trial to the next."""

ThreadConfig = Tuple[int, int]
"""(processes: ``num_workers``, threads per process)."""


def busy_fraction(trial: TrialResult) -> Optional[float]:
    """How busy one loading process kept its CPU: ``worker_cpu_util`` with workers, the main process's fetch CPU time
    over the fetch wall time without (the serial trial); None when not measured."""
    if not trial.ok:
        return None
    if trial.config.num_workers:
        return trial.worker_cpu_util
    if trial.fetch_s_per_batch and trial.fetch_cpu_s_per_batch is not None:
        return min(1.0, trial.fetch_cpu_s_per_batch / trial.fetch_s_per_batch)
    return None


def least_memory(trials: Sequence[TrialResult]) -> List[TrialResult]:
    """``trials`` less those whose workers measured clearly more memory (``TrialResult.worker_memory_bytes``, the
    sum of their USS) than the least (see ``MEMORY_SLACK``); a trial without a measurement stays."""
    known = [t.worker_memory_bytes for t in trials if t.worker_memory_bytes is not None]
    if not known:
        return list(trials)
    least = min(known)
    bound = max(least * MEMORY_SLACK, least + MEMORY_SLACK_BYTES)
    return [t for t in trials if (t.worker_memory_bytes or 0) <= bound]


def max_threads_per_process(trial: TrialResult, *, batch_size: int) -> int:
    """The most threads per process worth trying: ``MAX_THREADS``, and no more than a batch's samples (a process
    fetches one batch at a time), as ``trial`` measured them (a ``batch_sampler`` decides them), else ``batch_size``."""
    samples = batch_size
    if trial.ok and trial.batches and trial.window_s:
        samples = max(1, round(trial.samples_per_s * trial.window_s / trial.batches))
    return max(1, min(MAX_THREADS, samples))


def thread_processes(chosen_workers: int, *, fixed_workers: Optional[int], cap: int, usable_cpus: int,
                     max_threads: int) -> Tuple[int, int]:
    """The range of processes thread candidates may use: the user's ``num_workers`` when fixed; none (the main
    process) when the process-only choice or ``cap`` is 0; else 1 to the usable CPUs, or as many as it takes to keep
    the process-only choice's samples in flight when a process may not have that many threads (``max_threads``: a
    small batch), and never more than the process-only choice."""
    if fixed_workers is not None:
        return fixed_workers, fixed_workers
    if chosen_workers == 0 or cap == 0:
        return 0, 0
    needed = math.ceil(chosen_workers / max(1, max_threads))
    return 1, max(1, min(max(usable_cpus, needed), chosen_workers, cap))


def first_thread_config(chosen: TrialResult, *, processes: Tuple[int, int], max_threads: int,
                        consumer_samples_per_s: Optional[float],
                        tolerance: float) -> Optional[ThreadConfig]:
    """The first (processes, threads) candidate after the process-only search chose ``chosen`` (see NOTE [ Processes
    x threads ]); None when threads are not worth a trial: its processes do not mostly wait, a process cannot use two
    threads (``max_threads`` < 2), or it already feeds the consumer with no process to spare."""
    busy = busy_fraction(chosen)
    if busy is None or busy >= WAITING_BUSY or max_threads < 2:
        return None
    lo, hi = processes
    n = chosen.config.num_workers
    cover = threads_to_cover_wait(busy, cap=max_threads)
    in_flight = max(1, n)
    p = min(hi, max(lo, math.ceil(in_flight / cover)))
    t = min(max_threads, max(2, cover, math.ceil(in_flight / max(1, p))))
    fed = consumer_samples_per_s is not None and chosen.samples_per_s >= (1.0 - tolerance) * consumer_samples_per_s
    if p >= n and fed:
        return None
    return p, t


def next_thread_config(tried: Sequence[TrialResult], *, reference: float, processes: Tuple[int, int],
                       max_threads: int, tolerance: float) -> Optional[ThreadConfig]:
    """The next (processes, threads) candidate after the thread candidates ``tried`` (in order), or None when done
    (see NOTE [ Processes x threads ]); one thread means: measure that process-only configuration again (the
    control). ``reference``: the best process-only rate; a candidate is short when it is
    more than ``tolerance`` below it or below the best thread candidate (as ``select`` compares). A thread candidate
    that failed or was skipped ends the search (a dataset that is not thread-safe, or memory)."""
    if not tried or not tried[-1].ok:
        return None
    seen = {(t.config.num_workers, t.config.threads) for t in tried}
    ok = [t for t in tried if t.ok]
    target = (1.0 - tolerance) * max([reference] + [t.samples_per_s for t in ok])  # as ``select`` will compare
    lo, hi = processes

    def short(trial: TrialResult) -> bool:
        return not trial.ok or trial.samples_per_s < target

    def saturated(trial: TrialResult) -> bool:
        return (busy_fraction(trial) or 0.0) >= SATURATED_BUSY

    def fresh(config: ThreadConfig) -> Optional[ThreadConfig]:
        return None if config in seen else config

    good = [t for t in ok if not short(t)]
    if not good:
        best = max(ok, key=lambda t: t.samples_per_s)
        p, t = best.config.num_workers, best.config.threads
        if saturated(best):
            return fresh((min(hi, 2 * p), t)) if p < hi else None
        fewer = [x.samples_per_s for x in ok if x.config.num_workers == p and x.config.threads < t]
        gained = not fewer or best.samples_per_s > (1.0 + tolerance / 2) * max(fewer)
        more = min(max_threads, 2 * t)
        if more > t:
            return fresh((p, more)) if gained else None
        return fresh((min(hi, 2 * p), t)) if p < hi else None  # threads at the batch's size: more processes
    chosen = min(good, key=lambda x: (x.config.num_workers, x.config.threads))
    p, t = chosen.config.num_workers, chosen.config.threads
    if t == 1:  # the control keeps up: threads do not pay
        return None
    if (p, 1) not in seen:
        return p, 1
    if p > lo:
        fewer_p = max(lo, p // 2)
        keep = math.ceil(p * t / fewer_p)
        hopeless = keep > max_threads or any(
            x.config.num_workers == fewer_p and short(x) and (x.config.threads >= keep or saturated(x)) for x in tried)
        if not hopeless and (fewer_p, keep) not in seen:
            return fewer_p, keep
    below = [x for x in tried if x.config.num_workers == p and x.config.threads < t and short(x)]
    low = max(below, key=lambda x: x.config.threads)  # the control (p, 1) at least
    if low.config.threads == 1:
        return fresh((p, t // 2)) if t // 2 >= 2 else None
    if not low.ok or chosen.samples_per_s <= low.samples_per_s:
        return None
    share = (target - low.samples_per_s) / (chosen.samples_per_s - low.samples_per_s)
    middle = max(low.config.threads + 1, math.ceil(low.config.threads + share * (t - low.config.threads) - 1e-9))
    return fresh((p, middle)) if middle <= 0.75 * t else None
