"""Worker processes of a trial: find them, read what they cost (psutil), and make sure none outlives the trial.

# NOTE [ Process cleanup ]
# A trial's DataLoader workers are reaped in three steps, in this order, in the trial's ``finally``:
# 1. Drop every reference to the DataLoader iterator, including the ones a pending exception's traceback holds
#    through its frames (``traceback.clear_frames``), then ``gc.collect()``. The iterator's ``__del__`` runs the
#    DataLoader's own shutdown: it signals the workers, joins them and reaps them. This is the public way; we never
#    call ``_shutdown_workers`` ourselves.
# 2. ``reap()`` then checks, with psutil, the processes that appeared during the trial. Any still running after a
#    grace period (a worker stuck in uninterruptible user code) gets SIGTERM, then SIGKILL.
# 3. We never ``waitpid`` a worker ourselves: multiprocessing owns that, and reaping a pid behind its back would let it
#    signal a recycled pid later. ``multiprocessing.active_children()`` lets it collect what is left.
# A trial that timed out is different: its workers are stuck in the dataset, and the DataLoader's shutdown would wait
# 5 s for each of them in turn before terminating it. So ``terminate()`` signals them first, before step 1. SIGTERM
# from the parent makes a DataLoader worker exit with status 0 (torch's worker signal handler), so the DataLoader's
# SIGCHLD handler does not raise in the main thread; SIGKILL follows for one that ignores it.
# The trial only ever touches children that did not exist when it started (less multiprocessing's resource tracker and
# fork server, which the first spawn/forkserver worker starts for the whole process), so a user's own children are safe
# (unless another thread of the user's starts processes during a trial, which autoloader cannot tell apart).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set

import psutil

log = logging.getLogger("autoloader.trial")


_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _is_helper(proc: psutil.Process, me: int) -> bool:
    """multiprocessing's resource tracker or fork server: started with the first spawn/forkserver worker, then shared
    by the whole process for its lifetime, so never a trial's to stop (its own children, forkserver workers, are)."""
    try:
        return proc.ppid() == me and any(h in " ".join(proc.cmdline()) for h in _HELPERS)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def child_pids() -> Set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def new_children(before: Set[int]) -> List[psutil.Process]:
    """Descendants that did not exist in ``before``, less multiprocessing's own long-lived helpers."""
    me = os.getpid()
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before and not _is_helper(p, me)]


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: Iterable[psutil.Process], timeout: float) -> List[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if _running(p)]
    return alive


def _signal_until_gone(alive: List[psutil.Process], *, level: int, why: str) -> None:
    for sig_name in ("terminate", "kill"):
        if not alive:
            return
        log.log(level, "trial workers %s %s; sending %s", [p.pid for p in alive], why, sig_name.upper())
        for proc in alive:
            try:
                getattr(proc, sig_name)()
            except psutil.NoSuchProcess:
                continue
        alive = _wait_gone(alive, 2.0)


def terminate(procs: Iterable[psutil.Process]) -> int:
    """SIGTERM (then SIGKILL) ``procs`` now: the workers of a trial that timed out. Returns how many were running."""
    alive = [p for p in procs if _running(p)]
    _signal_until_gone(alive, level=logging.INFO, why="are stuck after a timeout")
    return len(alive)


def reap(procs: Iterable[psutil.Process], *, grace: float = 5.0) -> int:
    """Make sure ``procs`` have exited (see NOTE [ Process cleanup ]). Returns how many had to be signalled."""
    alive = _wait_gone(procs, grace)
    _signal_until_gone(alive, level=logging.WARNING, why="did not exit")
    multiprocessing.active_children()
    return len(alive)


@dataclass(frozen=True)
class WorkerSample:
    """Cumulative counters of a set of workers at one instant."""

    cpu_s: float
    read_bytes: Optional[int]
    max_rss: Optional[int]
    max_uss: Optional[int]
    uss_by_pid: Dict[int, int]


def sample_workers(procs: Iterable[psutil.Process], *, memory: bool = True) -> WorkerSample:
    """CPU seconds, bytes read and memory of ``procs``; a figure the platform refuses to report is None."""
    cpu = 0.0
    read: Optional[int] = 0
    rss: Optional[int] = None
    uss: Dict[int, int] = {}
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                if read is not None:
                    try:
                        read += proc.io_counters().read_chars
                    except (psutil.AccessDenied, AttributeError, NotImplementedError):
                        read = None
                if memory:
                    try:
                        info = proc.memory_full_info()
                        uss[proc.pid] = info.uss
                        rss = max(rss or 0, info.rss)
                    except (psutil.AccessDenied, AttributeError, NotImplementedError):
                        rss = max(rss or 0, proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return WorkerSample(cpu, read, rss, max(uss.values()) if uss else None, uss)
