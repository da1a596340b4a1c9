"""Worker processes of a trial: find them, read what they cost (psutil), and make sure none outlives the trial.

# NOTE [ Process cleanup ]
# A trial's DataLoader workers are reaped in its ``finally``, inside ``SignalGuard.shield()`` (no signal raises there:
# see NOTE [ Asynchronous exceptions ] in signals.py), in these steps:
# 1. Drop every reference to the DataLoader iterator, including the ones a pending exception's traceback holds
#    through its frames (``traceback.clear_frames``), then ``gc.collect()`` when one survived. The iterator's
#    ``__del__`` runs the DataLoader's own shutdown: it sets the workers' done event, sends each a stop, joins them
#    and closes its queues. This is the public way.
# 2. When the trial failed (a worker died, the limit passed, the dataset or the step raised, Ctrl-C), the shutdown must
#    run now, and it would wait up to 5 s for each stuck worker in turn (a Ctrl-C while many workers are still starting
#    would take seconds). So ``drop_failed`` drops our references as in 1. and, when something else still holds the
#    iterator (a frame of the traceback being handled), calls its ``_shutdown_workers`` itself (torch has no public
#    close); a helper thread beside it ``terminate()``s the workers still running ``KILL_AFTER_S`` later: SIGTERM (a
#    DataLoader worker then exits at once, torch's worker signal handler), then SIGKILL for one that ignores it. Never
#    before the shutdown began: a worker checks the done event under the event's lock, which is shared with this
#    process, and one killed while holding it leaves ``Event.set()`` in the shutdown blocked forever (the stress test
#    hung so when the workers were terminated first: tests/benchmarks/results/stress.md). Workers no shutdown reaches
#    (Ctrl-C while ``iter()`` was forking them: the half-built iterator's ``__del__`` fails) are terminated as soon as
#    it returned: nothing will use their event again (waiting for them instead costs torch's 5 s join).
# 3. ``reap()`` then checks, with psutil, the processes that appeared during the trial. Any still running after a
#    grace period (a worker stuck in uninterruptible user code) gets SIGTERM, then SIGKILL.
# 4. An online candidate stopped in order is shut down in a helper thread (``retire``): the next one starts
#    meanwhile. torch's SIGCHLD handler raises "DataLoader worker (pid X) is killed" in the main thread, wherever it
#    is, for any worker of an iterator whose shutdown has not ended; a retired worker dying then (a dataset that
#    kills itself, the OOM killer) raised in the next stage's setup or in the user's own loop, outside any guard,
#    and a raise inside a lock hangs (both seen in the stress test, stress.md). The candidate's outcome is decided,
#    so its workers are first taken out of what that handler watches, as the iterator's own shutdown does at its
#    end (``torch_watch.unwatch``); the helper thread still joins and reaps them. A candidate without workers (an
#    online probe) has nothing to shut down: its references are dropped at once, with no thread and no collection
#    (starting that thread beside workers just forked, and its ``gc.collect()`` holding the GIL, delays the loop's
#    next batches at an epoch's first switch).
# 5. At interpreter exit (an epoch's iterator the loop left, finalized as the modules are torn down) nothing is
#    stopped: ``exiting()``. multiprocessing's exit handler, which runs before, terminated and joined every daemonic
#    process (DataLoader workers are), torch's iterators shut down nothing then either, and no thread can start: one
#    started during finalization never runs, and ``Thread.start`` waits for it forever (a loop that broke out of an
#    online epoch after its first switch hung at exit, in ``drop_failed``), while psutil's module may be torn down.
#    The references are only dropped.
# We never ``waitpid`` a worker ourselves: multiprocessing owns that, and reaping a pid behind its back would let it
# signal a recycled pid later. ``multiprocessing.active_children()`` lets it collect what is left.
# The trial only ever touches children that did not exist when it started (less multiprocessing's resource tracker and
# fork server, which the first spawn/forkserver worker starts for the whole process), so a user's own children are safe
# (unless another thread of the user's starts processes during a trial, which autoloader cannot tell apart).
"""
from __future__ import annotations

import gc
import logging
import math
import multiprocessing
import os
import resource
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Set

import psutil

from . import torch_watch

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
        alive = _wait_gone(alive, 1.0)


def terminate(procs: Iterable[psutil.Process], *, why: str = "belong to a failed trial") -> int:
    """SIGTERM (then SIGKILL) ``procs`` now: the workers of a trial that failed. Returns how many were running."""
    alive = [p for p in procs if _running(p)]
    _signal_until_gone(alive, level=logging.INFO, why=why)
    return len(alive)


def reap(procs: Iterable[psutil.Process], *, grace: float = 5.0) -> int:
    """Make sure ``procs`` have exited (see NOTE [ Process cleanup ]). Returns how many had to be signalled."""
    alive = _wait_gone(procs, grace)
    _signal_until_gone(alive, level=logging.WARNING, why="did not exit")
    multiprocessing.active_children()
    return len(alive)


exiting: Callable[[], bool] = sys.is_finalizing
"""Whether the interpreter is finalizing: nothing is stopped or reaped then (see NOTE [ Process cleanup ], 5.). The
builtin itself: a caller that bound it keeps a working one while the interpreter clears the globals of the modules
(this one, the caller's) before a generator holding a run is finalized."""


def drop(references: List[Any], *, collect: bool = False) -> None:
    """Drop ``references``: a DataLoader iterator (or None), then what the caller lets go of with it (its loader, never
    one with persistent workers here), so that the iterator's ``__del__`` runs the DataLoader's shutdown now. A full
    ``gc.collect()`` (0.1-0.3 s in a process holding torch, and it holds the GIL) runs only when the iterator survived,
    held by a reference cycle (a traceback's frames), or when ``collect`` (a failure: what a failed ``iter()`` built
    holds pipes the next trial needs; a retired candidate, see ``retire``). Whether the others survive is not ours to
    change: the online scheduler still holds a candidate's loader, and collecting for it cost every Ctrl-C 0.25 s."""
    watched = _watch(references)
    references.clear()
    if collect or (watched is not None and watched() is not None):
        gc.collect()


def _watch(references: List[Any]) -> Optional[weakref.ref]:
    """A weak reference to the iterator ``references`` starts with, to see whether it outlives their drop; None when
    there is none (or it takes no weak reference)."""
    try:
        return weakref.ref(references[0]) if references else None
    except TypeError:  # None, or a type without weak references
        return None


KILL_AFTER_S = 0.25
"""How long a failed run's DataLoader shutdown waits for a worker before it is terminated (see NOTE
[ Process cleanup ], 2.): a worker that is not stuck stops within milliseconds of being told to, one busy with a sample
once that sample is done."""


def drop_failed(references: List[Any], workers: List[psutil.Process], *, collect: bool) -> None:
    """``drop`` for a run that failed (NOTE [ Process cleanup ], 2.): the DataLoader iterator's own shutdown tells
    ``workers`` to stop, now, and a helper thread terminates those still running ``KILL_AFTER_S`` later while the
    shutdown joins them; any left once it returned (a half-built iterator's, which no shutdown reaches) at once. Their
    deaths are first taken out of what torch's SIGCHLD handler watches (the run's outcome is decided). ``collect``:
    then a full ``gc.collect()`` (what a failed ``iter()`` built holds pipes)."""
    if references:
        torch_watch.unwatch(references[0])
    watched = _watch(references)
    dropped = threading.Event()

    def stragglers() -> None:
        if not dropped.wait(KILL_AFTER_S):
            terminate(workers, why=f"still ran {KILL_AFTER_S} s into their DataLoader's shutdown")

    killer = threading.Thread(target=stragglers, name="autoloader-stragglers", daemon=True)
    killer.start()
    try:
        references.clear()  # the public way: the iterator's __del__ runs its shutdown here, when ours were the last
        survivor = watched() if watched is not None else None
        if survivor is not None:
            _shut_down(survivor)
            del survivor
    finally:
        dropped.set()
        killer.join()
    # Workers no shutdown reaches: an iterator half built when Ctrl-C came (it had forked some; its __del__ ran as the
    # traceback's frames were cleared, and failed), or none at all. Nothing will set their event now.
    terminate(workers, why="outlived their DataLoader's shutdown")
    if collect:
        gc.collect()


def _shut_down(iterator: Any) -> None:
    """The shutdown of a DataLoader iterator that something else still references (a frame of the traceback being
    handled), called directly: torch has no public way to close an iterator. Its ``__del__`` does nothing more later."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


def retire(references: List[Any], workers: List[psutil.Process]) -> threading.Thread:
    """Shut down a DataLoader iterator that is no longer used, in a helper thread: ``references`` holds the only
    references to it (and its loader), which the thread drops (``drop``), so that the DataLoader's own shutdown
    (signalling and joining ``workers``) runs there; then the workers are reaped (see NOTE [ Process cleanup ]). The
    caller (the main thread) must not keep another reference."""
    if references:
        torch_watch.unwatch(references[0])

    def run() -> None:
        drop(references, collect=True)  # as before: the stress runs that skipped it failed (stress.md)
        reap(workers)

    thread = threading.Thread(target=run, name="autoloader-retire", daemon=True)
    thread.start()
    return thread


MEMORY_SAMPLE = 8
"""Workers whose memory one reading reads, spread over the pool (the first always among them): each read costs
milliseconds of the loop's thread (``/proc/PID/smaps_rollup``), twice per candidate (its first batch, its window's
end), so a large pool's reading every worker would cost an epoch a visible share; the others are taken to be as large
as those read."""


@dataclass(frozen=True)
class WorkerSample:
    """Cumulative counters of a set of workers at one instant; memory of ``MEMORY_SAMPLE`` of them at most
    (``uss_by_pid``), ``uss_total`` scaled to every worker running; ``mean_uss``: one worker's size, the mean of those
    read (what the pool's total is made of: NOTE [ Memory budget ] in search/memory.py)."""

    cpu_s: float
    read_bytes: Optional[int]
    max_rss: Optional[int]
    mean_uss: Optional[int]
    uss_by_pid: Dict[int, int]
    uss_total: Optional[int] = None


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class WorkerTracker:
    """Cumulative CPU time and bytes read of a trial's workers, including those that exit during the trial.

    A finite IterableDataset's workers exit, and the DataLoader joins them, before the trial ends: a sample taken then
    finds no process and would miss all their work (every WebDataset trial read 0 % worker CPU that way). A worker
    still running (or a zombie not yet waited for) is read with psutil; once it has been waited for, its whole CPU time
    is in this process's ``RUSAGE_CHILDREN``, so the total is the running workers' readings plus what
    ``RUSAGE_CHILDREN`` gained since the tracker started (the only children waited for during a trial are its own
    workers). Bytes read of a vanished worker stay at its last reading."""

    def __init__(self, procs: Iterable[psutil.Process]) -> None:
        self.procs = list(procs)
        step = max(1, math.ceil(len(self.procs) / MEMORY_SAMPLE))
        self._memory_pids = {p.pid for p in self.procs[::step]}
        self._cpu: Dict[int, float] = {}
        self._read: Dict[int, Optional[int]] = {}
        self._children_at_start = _children_cpu_s()
        self.last_sampled = -float("inf")

    def sample(self, *, memory: bool = True) -> WorkerSample:
        """CPU seconds, bytes read and memory of the workers; a figure the platform refuses to report is None.
        Memory is that of the workers still running."""
        rss: Optional[int] = None
        uss: Dict[int, int] = {}
        running = 0
        for proc in self.procs:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    self._cpu[proc.pid] = times.user + times.system
                    try:
                        self._read[proc.pid] = proc.io_counters().read_chars
                    except (psutil.AccessDenied, AttributeError, NotImplementedError):
                        self._read[proc.pid] = None
                    running += 1
                    if memory and proc.pid in self._memory_pids:
                        try:
                            info = proc.memory_full_info()
                            uss[proc.pid] = info.uss
                            rss = max(rss or 0, info.rss)
                        except (psutil.AccessDenied, AttributeError, NotImplementedError):
                            rss = max(rss or 0, proc.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                self._cpu.pop(proc.pid, None)  # waited for: its CPU time is in RUSAGE_CHILDREN now
                continue
        self.last_sampled = time.perf_counter()
        reads = list(self._read.values())
        read = None if any(r is None for r in reads) else sum(r for r in reads if r is not None)
        cpu = sum(self._cpu.values()) + max(0.0, _children_cpu_s() - self._children_at_start)
        total = sum(uss.values()) * running // len(uss) if uss else None
        return WorkerSample(cpu, read, rss, sum(uss.values()) // len(uss) if uss else None, uss, total)
