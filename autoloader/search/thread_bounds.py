"""How far a thread search may go (NOTE [ Processes x threads ] in threads_policy.py): the most threads one process
is given, the processes thread candidates may use after the process-only search and threads first, and the
process-only candidate threads first measures beside its choice. Pure functions of a trial and the search's bounds,
tested on tables (tests/search/test_thread_bounds.py); ``threads_policy.py`` walks within them."""
from __future__ import annotations

import math
from typing import Optional, Tuple

from ..results import TrialResult

__all__ = ["MAX_THREADS", "THREADS_FIRST_PROCESSES_PER_CPU", "max_threads_per_process", "process_reference",
           "thread_processes", "threads_first_processes"]

MAX_THREADS = 64
"""The most threads per process the search tries (also capped at the batch size)."""
THREADS_FIRST_PROCESSES_PER_CPU = 4
"""Threads-first climbs to at most this many processes per usable CPU: a process's own collate and hand-over may
need company past the core count, and with one runnable thread at a time (the GIL) a process gets one task's share
of a busy machine's CPUs (the threads benchmark, at a load of 10-16 on 2 cores: 4 x 16 threads at 0.70x of 64
processes). 8 processes on 2 CPUs still hold an eighth of 64's memory."""


def max_threads_per_process(trial: TrialResult, *, batch_size: int) -> int:
    """The most threads per process worth trying: ``MAX_THREADS``, and no more than a batch's samples (a process
    fetches one batch at a time), as ``trial`` measured them (a ``batch_sampler`` decides them), else ``batch_size``."""
    samples = batch_size
    if trial.ok and trial.samples_per_s is not None and trial.batches and trial.window_s:
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


def threads_first_processes(*, cap: int, usable_cpus: int, max_threads: int) -> Tuple[int, int]:
    """The processes threads-first candidates may use: 1 to ``THREADS_FIRST_PROCESSES_PER_CPU`` x the usable CPUs,
    or as many as keep ``cap`` samples in flight at ``max_threads`` a process, never more than ``cap``."""
    if cap < 1:
        return 0, 0
    most = max(THREADS_FIRST_PROCESSES_PER_CPU * usable_cpus, math.ceil(cap / max(1, max_threads)))
    return 1, max(1, min(cap, most))


def process_reference(chosen: TrialResult, *, cap: int) -> Optional[int]:
    """The single-threaded workers that keep as many samples in flight as ``chosen`` (processes x threads), at most
    ``cap``: threads first measures that process-only candidate once before it keeps threads (a thread costs CPU per
    sample a waiting process does not, so at short waits processes can be faster); None when it would be
    no more processes than ``chosen`` has."""
    n = min(cap, chosen.config.num_workers * chosen.config.threads)
    return n if n > chosen.config.num_workers else None
