"""The tuner's decisions about threads inside each loading process (``threads.py``), as pure functions of what the
trials measured: whether loading waits, the first (processes, threads) candidate and the next; ``thread_search.py``
drives them, within the bounds ``thread_bounds.py`` sets (``policy.select`` borrows ``fewest_near``).

# NOTE [ Processes x threads ]
# Threads first. With ``threads=True``, when the serial trial shows loading that mostly waits (its CPU
# share below ``WAITING_BUSY``), the search tries processes x threads before any process-only climb
# (``first_threads_first``, ``next_threads_first``): few processes (up to the usable CPUs), each with the threads
# that cover its wait (up to a batch's samples), as many samples in flight as the serial trial says fill the CPUs or
# feed the consumer. Then it climbs while the most samples in flight measure the best rate and gain over fewer:
# short with a saturated process (collate, hand-over, GIL) -> twice the processes at the same threads; short with
# an idle one -> twice the threads, and twice the processes once threads reach the batch's size or stop gaining (a
# process short of CPU on a shared machine never looks saturated), up to ``threads_first_processes``
# (thread_bounds.py). When the climb stops, the descent below runs on the climb's own rates, the control first, then
# fewer processes with the same samples in flight, never fewer threads: an idle thread costs a stack, not a process's
# memory, and on a busy machine a thread count measured within the tolerance once may be well short of it the next
# time (the threads benchmark's first run: 4 x 16 chosen at 0.98x of 4 x 32, 0.77x side by side). Last, one
# process-only candidate with the same samples in flight (``process_reference``): a thread costs CPU per sample that
# a waiting process does not, so at short waits processes can be faster (1 ms waits, 1 KB samples: 2 x 50 threads ran
# at 0.37x of 64 processes).
# The process-only climb is the fallback: it runs only when the control keeps up (threads do not pay), that
# reference is faster beyond the tolerance, or a thread candidate fails (a dataset that is not thread-safe).
#
# Threads after processes (a serial trial that does not wait, workers that do). After the process-only search, a
# loading process that keeps its CPU busy less than ``WAITING_BUSY`` of the time
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
MAX_THREAD_TRIALS = 4
"""Thread candidates after the process-only search, at most."""
THREADS_FIRST_TRIALS = 8
"""Candidates of the threads-first search (controls included), at most; its climb and descent end sooner."""

ThreadConfig = Tuple[int, int]
"""(processes: ``num_workers``, threads per process)."""


def rate(trial: TrialResult) -> float:
    """The rate an ok trial measured (``TrialResult.ok`` says it has one); a ``ValueError`` for any other trial."""
    if trial.samples_per_s is None:
        raise ValueError(f"the trial of {trial.config.label()} measured no rate ({trial.status})")
    return trial.samples_per_s


def busy_fraction(trial: TrialResult) -> Optional[float]:
    """How busy one loading process kept its CPU: ``worker_cpu_util`` with workers, the main process's fetch CPU time
    over the fetch wall time without (the serial trial), less the time the fetch waited for a CPU when the kernel says
    (``fetch_delay_s_per_batch``): on a busy machine that wait is not loading that waits for data, and threads would
    not overlap it. None when not measured."""
    if not trial.ok:
        return None
    if trial.config.num_workers:
        return trial.worker_cpu_util
    if trial.fetch_s_per_batch and trial.fetch_cpu_s_per_batch is not None:
        running = trial.fetch_s_per_batch - (trial.fetch_delay_s_per_batch or 0.0)
        return min(1.0, trial.fetch_cpu_s_per_batch / max(running, trial.fetch_cpu_s_per_batch, 1e-12))
    return None


def fewest_near(trials: Sequence[TrialResult], *, tolerance: float) -> List[TrialResult]:
    """The trials within ``tolerance`` of the best measured rate with the fewest processes, then the fewest threads
    (``policy.select`` picks among them; threads-first asks whether they have threads); [] when none has a rate."""
    ok = [t for t in trials if t.ok]
    if not ok:
        return []
    best = max(rate(t) for t in ok)
    near = [t for t in ok if rate(t) >= (1.0 - tolerance) * best]
    fewest = min((t.config.num_workers, t.config.threads) for t in near)
    return [t for t in near if (t.config.num_workers, t.config.threads) == fewest]


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
    fed = consumer_samples_per_s is not None and rate(chosen) >= (1.0 - tolerance) * consumer_samples_per_s
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
    target = (1.0 - tolerance) * max([reference] + [rate(t) for t in ok])  # as ``select`` will compare
    lo, hi = processes

    def short(trial: TrialResult) -> bool:
        return not trial.ok or rate(trial) < target

    def saturated(trial: TrialResult) -> bool:
        return (busy_fraction(trial) or 0.0) >= SATURATED_BUSY

    def fresh(config: ThreadConfig) -> Optional[ThreadConfig]:
        return None if config in seen else config

    good = [t for t in ok if not short(t)]
    if not good:
        best = max(ok, key=rate)
        p, t = best.config.num_workers, best.config.threads
        if saturated(best):
            return fresh((min(hi, 2 * p), t)) if p < hi else None
        fewer = [rate(x) for x in ok if x.config.num_workers == p and x.config.threads < t]
        gained = not fewer or rate(best) > (1.0 + tolerance / 2) * max(fewer)
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
    if not low.ok or rate(chosen) <= rate(low):
        return None
    share = (target - rate(low)) / (rate(chosen) - rate(low))
    middle = max(low.config.threads + 1, math.ceil(low.config.threads + share * (t - low.config.threads) - 1e-9))
    return fresh((p, middle)) if middle <= 0.75 * t else None


def waits(serial: TrialResult, *, max_threads: int) -> bool:
    """Whether the serial trial shows loading that mostly waits (see NOTE [ Processes x threads ], threads first):
    its CPU share below ``WAITING_BUSY``, and a batch of at least two samples (two threads to share it)."""
    busy = busy_fraction(serial)
    return busy is not None and busy < WAITING_BUSY and max_threads >= 2


def first_threads_first(serial: TrialResult, *, workers_needed: float, processes: Tuple[int, int],
                        max_threads: int, usable_cpus: int) -> Optional[ThreadConfig]:
    """The first threads-first candidate from the serial trial: the threads that cover a process's wait (at least
    2, at most ``max_threads`` and no more than ``workers_needed``, the single-threaded workers that fill the CPUs or
    feed the consumer), in as many processes as ``workers_needed`` takes, at most the usable CPUs. None when the
    serial trial does not wait (``waits``)."""
    if not waits(serial, max_threads=max_threads) or processes[1] < 1:
        return None
    busy = busy_fraction(serial) or 0.0
    needed = max(2.0, workers_needed)
    t = min(max_threads, threads_to_cover_wait(busy, cap=max_threads), math.ceil(needed - 1e-9))
    t = max(2, t)
    lo, hi = processes
    p = max(lo, min(hi, max(1, usable_cpus), math.ceil(needed / t - 1e-9)))
    return p, t


def climb_threads(tried: Sequence[TrialResult], *, most_processes: int, max_threads: int, tolerance: float,
                  consumer_samples_per_s: Optional[float]) -> Optional[ThreadConfig]:
    """The threads-first climb (NOTE [ Processes x threads ]): while the most samples in flight (processes x
    threads) measured the best rate and gained more than half the ``tolerance`` over fewer, the next bigger candidate
    (more processes when the process is saturated or its threads reach ``max_threads``, else more threads); once more
    threads stop gaining, more processes at the best's threads (a process short of CPU on a shared machine never
    looks saturated), once. None when a control (one thread) ran, the consumer is fed, or the climb is over."""
    ok = [t for t in tried if t.ok]
    if not ok or len(ok) < len(tried) or any(t.config.threads == 1 for t in tried):
        return None
    best = max(ok, key=rate)
    p, t = best.config.num_workers, best.config.threads
    if consumer_samples_per_s is not None and rate(best) >= consumer_samples_per_s:
        return None
    more_processes = (min(most_processes, 2 * p), t) if 0 < p < most_processes else None
    fewer = [rate(x) for x in ok if x.config.num_workers * x.config.threads < p * t]
    climbing = p * t >= max(x.config.num_workers * x.config.threads for x in ok) and \
        (not fewer or rate(best) > (1.0 + tolerance / 2) * max(fewer))
    if not climbing:
        proposal = None if any(x.config.num_workers > p for x in ok) else more_processes
    elif (busy_fraction(best) or 0.0) >= SATURATED_BUSY or t >= max_threads:
        proposal = more_processes
    else:
        proposal = (p, min(max_threads, 2 * t))
    seen = {(x.config.num_workers, x.config.threads) for x in tried}
    return None if proposal is None or proposal in seen else proposal


def next_threads_first(tried: Sequence[TrialResult], *, processes: Tuple[int, int], max_threads: int,
                       tolerance: float, consumer_samples_per_s: Optional[float]) -> Optional[ThreadConfig]:
    """The next threads-first candidate after ``tried`` (in order), or None when done: the climb
    (``climb_threads``), then the descent of ``next_thread_config`` on the climb's own rates (its control first),
    short of its fewer threads in flight. A failed candidate ends the search (the caller falls back to processes)."""
    if not tried or not tried[-1].ok:
        return None
    climb = climb_threads(tried, most_processes=processes[1], max_threads=max_threads, tolerance=tolerance,
                          consumer_samples_per_s=consumer_samples_per_s)
    if climb is not None:
        return climb
    proposal = next_thread_config(tried, reference=0.0, processes=processes, max_threads=max_threads,
                                  tolerance=tolerance)
    chosen = fewest_near(tried, tolerance=tolerance)[0]
    if proposal is not None and proposal[1] > 1 and \
            proposal[0] * proposal[1] < chosen.config.num_workers * chosen.config.threads:
        return None  # fewer threads in flight: they save no memory worth the risk to the rate
    return proposal
