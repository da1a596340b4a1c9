"""``Serving``: one DataLoader's iterator, started, read one batch at a time and stopped, whatever happens in between:
its workers are stopped and reaped as NOTE [ Process cleanup ] in procs.py says, signals land only where no lock can
leak (its ``guard``, NOTE [ Asynchronous exceptions ] in signals.py), and what the loop waited for is recorded. It
measures nothing: ``run.Run`` observes what it serves."""
from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Set, Tuple

import psutil

from ..errors import quiet_worker_count_warning
from ..loader.epochs import epoch_iter, reuses_iterator
from ..loader.native import limited_at_fork
from . import procs as _procs
from .signals import SignalGuard
from .unsafe import cleanup

log = logging.getLogger("autoloader.trial")

END = object()
"""What ``Serving.next`` returns once the DataLoader ran out."""
SETTLE_S = 2.0
"""The next candidate's window waits at most this long after a run stopped for its workers to be reaped (NOTE [ Trial
timing ], 5. in run.py): a worker stuck past it is reaped later, and its CPU time may then count for the next one."""


@dataclass
class Record:
    """What a served DataLoader did: batches handed out, whether the last error came from the user's code (the
    dataset, collate, the step), and what the loop waited for while it started and stopped."""

    delivered: int = 0
    user: bool = False
    startup_s: Optional[float] = None
    """From the run's start to its first batch."""
    start_s: float = 0.0
    """Making the iterator (forking the workers)."""
    forked: int = 0
    """Workers the start forked (0: none, or persistent workers reused: ``epochs.reuses_iterator``)."""
    first_wait_s: float = 0.0
    """Waiting for the first batch once it was asked for."""
    stop_s: float = 0.0
    elapsed: float = 0.0

    @property
    def started_s(self) -> float:
        """What the loop waited for while the DataLoader started: making the iterator, then its first batch (a
        worker's own start-up, an import or a cache it builds, counts)."""
        return self.start_s + self.first_wait_s

    @property
    def switch_s(self) -> float:
        """What the loop waited for while the DataLoader started and stopped (its workers' shutdown runs in a helper
        thread, NOTE [ Process cleanup ])."""
        return self.started_s + self.stop_s


class WorkerProcesses:
    """The worker processes a DataLoader started: those that appeared after ``before`` (or the set fixed by ``keep``),
    and the helper thread retiring them."""

    def __init__(self) -> None:
        self.before: Set[int] = _procs.child_pids()
        self.fixed: Optional[List[psutil.Process]] = None
        self.retiring: Optional[threading.Thread] = None
        self.stopped_at = math.inf

    def current(self) -> List[psutil.Process]:
        return self.fixed if self.fixed is not None else _procs.new_children(self.before)

    def settled(self) -> bool:
        """Stopped, and its workers reaped or ``SETTLE_S`` passed since."""
        if math.isinf(self.stopped_at):
            return False
        done = self.retiring is None or not self.retiring.is_alive()
        return done or time.perf_counter() - self.stopped_at >= SETTLE_S


class Serving:
    """``loader``'s batches, one ``next()`` at a time, under ``guard``. ``owned``: stopping it stops the loader's
    workers (else it only drops its iterator, as a plain loop does: the plain loader of a decision keeps its persistent
    workers). ``retire``: an orderly stop reaps the workers in a helper thread (an online candidate: the next one's
    start-up overlaps it); else at once, after ``before_stop`` (a trial: the device's queued work first)."""

    def __init__(self, loader: Any, *, guard: SignalGuard, owned: bool = True, retire: bool = True,
                 before_stop: Callable[[], None] = lambda: None) -> None:
        self.loader, self.guard, self.owned, self.retire, self.before_stop = loader, guard, owned, retire, before_stop
        self.started = time.perf_counter()
        self.record = Record()
        self._exiting = _procs.exiting  # bound now: at exit, this module's globals may be cleared before it runs
        self.processes = WorkerProcesses()
        self._it: Optional[Iterator[Any]] = None
        self._start_error: Optional[Exception] = None

    def start(self) -> None:
        """Make the iterator (its workers fork and prefetch) now, before the first ``next()`` (the next candidate of a
        hidden switch, NOTE [ Hidden switch ] in tuning/handover.py). An error doing so is raised by ``next()``."""
        if self._it is not None or self._start_error is not None:
            return
        began = time.perf_counter()
        forks = 0 if reuses_iterator(self.loader) else int(getattr(self.loader, "num_workers", 0) or 0)
        try:
            with quiet_worker_count_warning(True):  # NOTE [ One base seed per epoch ], [ Native thread pools ]
                self._it = epoch_iter(self.loader, forking=limited_at_fork)
            self.record.forked = forks
        except Exception as exc:  # noqa: BLE001 - the run's own failure, raised (and classified) by next()
            self._start_error = exc
        finally:
            self.record.start_s = time.perf_counter() - began

    def next(self) -> Tuple[Any, Optional[BaseException]]:
        """The next batch (``END`` when the loader ran out), or the exception that came instead (the caller raises
        it, after agreeing with the other ranks)."""
        self.start()
        if self._start_error is not None:
            self.record.user = True
            return END, self._start_error
        self.record.user = True
        try:
            batch = next(self._it, END)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: B036 - returned: the caller classifies it
            return END, exc
        self.record.user = False
        try:
            self.guard.check()
        except BaseException as exc:  # noqa: B036 - a worker's death held by the guard
            return END, exc
        return batch, None

    def adopt(self, workers: Sequence[psutil.Process]) -> None:
        """Its DataLoader's persistent workers run already (a decision's, measured again): they are its workers."""
        self.processes.fixed = list(workers)

    def keep_workers(self) -> None:
        """Fix the workers a stop stops as those running now (once: another DataLoader is about to start its own)."""
        if self.processes.fixed is None:
            self.processes.fixed = _procs.new_children(self.processes.before) if self.owned else []

    def settled(self) -> bool:
        return self.processes.settled()

    @cleanup
    def stop(self, error: Optional[BaseException] = None) -> None:
        """NOTE [ Process cleanup ]: this DataLoader's workers, once; a failure's at once, an orderly stop's in a helper
        thread when ``retire``. A signal landing as it starts waits until it is done (``unsafe.cleanup``)."""
        with self.guard.shield():
            if not math.isinf(self.processes.stopped_at):
                return
            stopping = self.processes.stopped_at = time.perf_counter()
            if error is not None and error.__traceback__ is not None:
                with quiet_half_built_iterators():  # a frame may hold the only reference to one (Ctrl-C in iter())
                    traceback.clear_frames(error.__traceback__)
            if not self.owned:  # the DataLoader's own iterator: dropping it is what a plain loop does
                self._it = None
            else:
                self._stop_workers(error)
        self.record.stop_s = time.perf_counter() - stopping
        self.record.elapsed = time.perf_counter() - self.started

    def release(self) -> None:
        """Let go of the iterator without stopping the workers: its DataLoader keeps them (persistent workers) for a
        later epoch, which serves them on (the decision an online epoch ended with, NOTE [ Online switching ])."""
        self.processes.stopped_at = time.perf_counter()
        self._it = None
        self.record.elapsed = time.perf_counter() - self.started

    @property
    def stopped(self) -> bool:
        return not math.isinf(self.processes.stopped_at)

    def _stop_workers(self, error: Optional[BaseException]) -> None:
        serial = getattr(self.loader, "num_workers", None) == 0
        references = [self._it, self.loader]
        self._it = self.loader = None
        if self._exiting():  # NOTE [ Process cleanup ], 5.
            references.clear()
            return
        if not self.retire:
            self.before_stop()
        if error is None and serial:  # no worker to shut down: no helper thread, no collection beside the loop
            _procs.drop(references)
            return
        workers = self.processes.current()
        if error is None and self.retire:
            self.processes.retiring = _procs.retire(references, workers)
            return
        with quiet_half_built_iterators():
            if error is None:
                _procs.drop(references)
            else:
                _procs.drop_failed(references, workers, collect=not isinstance(error, KeyboardInterrupt))
        _procs.reap(workers)


@contextlib.contextmanager
def quiet_half_built_iterators() -> Iterator[None]:
    """Log, rather than print, the AttributeError torch's DataLoader iterator raises from ``__del__`` when its
    ``__init__`` failed part-way (e.g. out of file descriptors while starting workers): the run already reports why
    the candidate failed, and "Exception ignored in ..." on stderr would only confuse."""
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, AttributeError) and "DataLoaderIter" in repr(unraisable.object):
            log.debug("ignored while discarding a half-built DataLoader iterator: %r", unraisable.exc_value)
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
