"""Signals that raise in the main thread during a trial, delivered only where raising cannot leak a lock.

# NOTE [ Asynchronous exceptions ]
# Three signals make the main thread raise at whatever bytecode it is running: SIGALRM (a trial's hard limit,
# ``TrialTimeout``), SIGINT (``KeyboardInterrupt``) and SIGCHLD (torch's DataLoader handler raises "DataLoader worker
# (pid X) is killed by signal" when a worker dies). Raising between a lock's acquire and the ``try``/``with`` that
# releases it leaks the lock for good. ``multiprocessing.Queue.put`` runs ``with self._notempty:``, and the
# Python-level ``Condition.__enter__`` returns with the lock held before the ``with`` is set up: a worker killed while
# the main thread puts indices raised exactly there (seen with a diagnostic handler: "raised at
# threading.py:__enter__ <- queues.py:put <- dataloader.py:_try_put_index"), and the iterator's shutdown then put to
# the same queue and waited forever, the queue's feeder thread with it.
# ``SignalGuard`` wraps the handlers of the three signals for the length of a trial:
# - when the interrupted frame is inside the standard library's synchronisation code (threading, queue,
#   multiprocessing), or where Python swallows exceptions ("Exception ignored in ...": a ``__del__``, a callback that
#   ``os.fork()`` runs, such as logging's lock release, where a Ctrl-C while workers were forked was lost), a
#   handler's exception is kept, not raised, and a 10 ms timer (SIGALRM) retries until the thread is somewhere safe.
#   A loop that forks workers spends nearly all its time in such code, so the retries seldom land until the workers have
#   started: while one is kept, a line tracer (``redelivery.LineTrap``) on the interrupted frames and every frame they
#   call raises it at the first line that runs where neither its frame nor any caller is unsafe
#   (``unsafe.unsafe_anywhere``), such as the DataLoader's loop between two forks. It is installed only when no other
#   tracer is (a debugger, coverage), since raising from a tracer unsets it; then the timer alone retries.
#   A handler's own code is unsafe too: the retry timer firing while the SIGINT handler still runs (a 10 ms timer on a
#   loaded machine) raised the Ctrl-C inside that handler, hence in the fork callback it interrupted, where it was
#   dropped and tuning went on (stress.md). As a last net, while a guard is active ``sys.unraisablehook`` takes back a
#   Ctrl-C (or what the guard raised) that Python is about to drop wherever ``unsafe_to_raise`` did not foresee it (a
#   weak reference's callback, a generator closed by the collector) and keeps it again.
#   Blocking reads are safe places and raise at once: multiprocessing.connection and selectors (the pipe under
#   ``Queue.get``, inside its try/finally), and a ``Condition.wait`` called by ``queue.Queue.get`` once its try block
#   is entered (the pin-memory results), which releases what it holds on the way out.
# - in a function marked ``@cleanup`` (``Run.stop``) before it entered its ``shield()``, and while entering it, a
#   handler's exception is kept the same way: a Ctrl-C that lands as a run starts its cleanup must not skip it (it
#   left a trial's workers running).
# - inside ``shield()`` (a trial's cleanup) nothing is raised. A Ctrl-C kept there is raised when the guard exits;
#   a worker's death or the limit passing is dropped, since the trial's outcome is already decided.
# - only the first process owns the guard: a forked worker inherits the wrappers and calls the original handlers,
#   and so does a wrapper left installed after its guard exited (two guards may exit out of order).
# - ``hold_worker_errors`` (online tuning, where the user's own loop runs between our batches): a worker's death is
#   never raised by the retry timer, only by ``check()`` in autoloader's own code, so it cannot land in the user's
#   training step; Ctrl-C still lands at the next safe place.
# torch installs its SIGCHLD handler once per process, in the first multi-worker iterator, on top of whatever is
# there. We make it install first (``torch_watch.install_first``, a private torch function) so that our wrapper
# sits above it. Outside any guard (an epoch served with no tuning under way) only SIGCHLD is covered, by
# ``supervise/deaths.py``: torch's handler wrapped once, a death landing in unsafe code kept and raised by a
# ``LineTrap`` at the first safe line (without it, a loader whose dataset crashes its workers could hang:
# tests/benchmarks/results/stress.md).
# Guards nest and may exit out of order. The guard entered last (of those still active in this process) delivers:
# the others' wrappers, and an exited guard's wherever it is still installed, call what they wrapped unchanged, and
# the timer is its own until it exits, then the one before's again. A guard entered inside another takes over what
# that one kept (unless it is shielded): the outer one's retries stop while the inner one owns the timer. Online
# tuning relies on this (NOTE [ Online epoch scheduler ] in tuning/phases.py): a guard spans the epoch and holds a
# worker's death between two stages, where the next stage's workers already run (a hidden switch starts them early)
# and no run's guard is active; the next stage's guard takes it and raises it as that candidate's failure (without
# it, such a death reaches torch's handler unwrapped: raised in the scheduler, or hung).
# Tuning by trials runs under one guard as well, each trial's nested in it: between two trials (the search, the next
# DataLoader's set-up, a finaliser the collector runs) a Ctrl-C is kept where it is unsafe and taken back where Python
# drops it, as within a trial (without a guard there, a Ctrl-C landing in a finaliser between trials is printed as
# "Exception ignored" and dropped).
# Which loader a death belongs to is not known to a guard (torch's handler watches every worker of the process), so
# with two loaders tuning at once (``zip(train, val)``) the guard entered last may report the other one's.
# When SIGALRM is not ours to use (not the main thread, or the user's own handler is installed) nothing is wrapped:
# kept exceptions could never be retried, so the guard stands aside and the limit is not enforced by a signal.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Dict, Optional

from . import redelivery, torch_watch
from .redelivery import TAKE_BACK, LineTrap, active, delivering
from .unsafe import cleanup, handlers_in, unsafe_anywhere, unsafe_to_raise

log = logging.getLogger("autoloader.trial")
handlers_in(__name__)
handlers_in(redelivery.__name__)  # the tracer and the hook run as handlers do: nothing is raised in their frames

RETRY_S = 0.01
"""How soon a kept exception is retried."""
Handler = Callable[[int, Optional[FrameType]], None]

def _rank(exc: BaseException) -> int:
    """Which kept exception wins: Ctrl-C, then a timeout, then anything else (a worker's death)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return 2
    return 1 if getattr(exc, "from_limit", False) else 0


def _guard_of(handler: Any) -> Optional["SignalGuard"]:
    return getattr(handler, "_autoloader_guard", None)


def _unwrapped(signum: int, handler: Any) -> Any:
    """``handler``, or what it wrapped when it belongs to a guard that has exited (guards may exit out of order)."""
    guard = _guard_of(handler)
    while guard is not None and not guard.active:
        handler = guard._previous.get(signum, signal.SIG_DFL)
        guard = _guard_of(handler)
    return handler


class SignalGuard:
    """Raise ``make_timeout()`` after ``limit_s`` seconds, and deliver SIGINT/SIGCHLD/SIGALRM exceptions only at
    safe points, for the length of a ``with`` block (see NOTE [ Asynchronous exceptions ]).

    ``make_timeout`` returns the exception to raise at the limit; it should carry ``from_limit = True``.
    """

    def __init__(self, *, limit_s: Optional[float] = None,
                 make_timeout: Optional[Callable[[], BaseException]] = None, hold_worker_errors: bool = False) -> None:
        self.limit_s, self.make_timeout, self.hold_worker_errors = limit_s, make_timeout, hold_worker_errors
        self.active = False
        self.pid = os.getpid()
        self._previous: Dict[int, Any] = {}
        self._deadline: Optional[float] = None
        self._pending: Optional[BaseException] = None
        self._shielded = 0
        self._limit_passed = False
        self._trap = LineTrap(self)
        self._raised: Optional[BaseException] = None

    # -- installing ----------------------------------------------------------------------------------------------
    def __enter__(self) -> "SignalGuard":
        self.active = (hasattr(signal, "setitimer") and hasattr(signal, "SIGCHLD")
                       and threading.current_thread() is threading.main_thread()
                       and (signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)
                            or _guard_of(signal.getsignal(signal.SIGALRM)) is not None))
        if not self.active:
            return self
        self.pid = os.getpid()
        entered = active()
        outer = entered[-1] if entered else None
        torch_watch.install_first()
        self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._owned(lambda n, f: self._on_alarm(n, f)))
        for signum in (signal.SIGINT, signal.SIGCHLD):
            inner = signal.getsignal(signum)
            if callable(inner):
                self._previous[signum] = signal.signal(signum, self._owned(self._wrap(inner)))
        if self.limit_s is not None and self.make_timeout is not None:
            self._deadline = time.monotonic() + self.limit_s
        TAKE_BACK.enter(self)
        taken = outer.give_up_kept() if outer is not None else None  # this guard's timer retries it now
        if taken is not None and (self._pending is None or _rank(taken) > _rank(self._pending)):
            self._pending = taken  # else one landing here (kept: this module is a handler's) outranks it
        self._arm()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if not self.active:
            return
        self.active = False
        self._trap.disarm()
        TAKE_BACK.exit(self)
        for signum, previous in self._previous.items():
            if _guard_of(signal.getsignal(signum)) is self:
                signal.signal(signum, _unwrapped(signum, previous))
        owner = _guard_of(signal.getsignal(signal.SIGALRM))
        if owner is not None and owner.active:
            owner._arm()  # a guard entered after this one and still running keeps its timer
        else:
            signal.setitimer(signal.ITIMER_REAL, 0)
        kept, self._pending, self._raised = self._pending, None, None
        if kept is not None and _rank(kept) == 2:
            raise kept

    def wraps(self, signum: int) -> bool:
        return signum in self._previous

    def give_up_kept(self) -> Optional[BaseException]:
        """What this guard kept, for a guard entered inside it (NOTE [ Asynchronous exceptions ]); nothing while
        shielded (raised or dropped as its shield ends)."""
        if self._shielded:
            return None
        kept, self._pending = self._pending, None
        self._trap.disarm()
        return kept

    def _owned(self, handler: Handler) -> Handler:
        handler._autoloader_guard = self  # type: ignore[attr-defined]
        return handler

    # -- delivering ----------------------------------------------------------------------------------------------
    def _wrap(self, inner: Callable[[int, Optional[FrameType]], Any]) -> Handler:
        def handler(signum: int, frame: Optional[FrameType]) -> None:
            if os.getpid() != self.pid or not self.active or delivering(signum) is not self:
                inner(signum, frame)
                return
            try:
                inner(signum, frame)
            except BaseException as exc:  # noqa: B036 - kept or re-raised by _deliver
                self._deliver(exc, frame)
        return handler

    def _on_alarm(self, signum: int, frame: Optional[FrameType]) -> None:
        if os.getpid() != self.pid or not self.active:
            return
        exc = self._pending
        if self._deadline is not None and not self._limit_passed and time.monotonic() >= self._deadline:
            self._limit_passed = True
            timeout = self.make_timeout() if self.make_timeout is not None else None
            if timeout is not None and (exc is None or _rank(timeout) >= _rank(exc)):
                exc = timeout
        if exc is not None:
            self._deliver(exc, frame)
        else:
            self._arm()

    def _deliver(self, exc: BaseException, frame: Optional[FrameType]) -> None:
        if self._shielded or unsafe_to_raise(frame) or (self.hold_worker_errors and _rank(exc) == 0):
            if self._pending is None or _rank(exc) > _rank(self._pending):
                self._pending = exc
            log.debug("kept %r: interrupted %s:%s", exc, frame and frame.f_code.co_filename,
                      frame and frame.f_code.co_name)
            self._arm()
            if self._retried():
                self._trap.arm(frame)
            return
        self._pending = None
        self._arm()
        self._raised = exc
        raise exc

    def _retried(self) -> bool:
        """A kept exception that is to be raised at the next safe place (not shielded, not a held worker error)."""
        return self._pending is not None and not self._shielded and \
            not (self.hold_worker_errors and _rank(self._pending) == 0)

    def raise_if_safe(self, frame: FrameType) -> None:
        """The line tracer's check (NOTE [ Asynchronous exceptions ]): raise the kept exception in ``frame`` when it
        is somewhere safe."""
        if not self.active or not self._retried() or unsafe_anywhere(frame):
            return
        kept, self._pending = self._pending, None
        self._trap.disarm()
        self._arm()
        self._raised = kept
        raise kept  # type: ignore[misc]

    def take_back(self, exc: BaseException, frame: Optional[FrameType]) -> bool:
        """Keep ``exc``, which Python is dropping, when it is a Ctrl-C or what this guard raised; raised again at the
        next safe line after ``frame`` (NOTE [ Asynchronous exceptions ])."""
        if _rank(exc) < 2 and exc is not self._raised:
            return False
        if self._pending is None or _rank(exc) >= _rank(self._pending):
            self._pending = exc
        log.debug("took back %r, which Python dropped", exc)
        self._arm()
        if self._retried():
            self._trap.arm(frame)
        return True

    def _arm(self) -> None:
        if not self.active:
            return
        delays = []
        if self._retried():
            delays.append(RETRY_S)
        else:
            self._trap.disarm()
        if self._deadline is not None and not self._limit_passed:
            delays.append(max(1e-4, self._deadline - time.monotonic()))
        signal.setitimer(signal.ITIMER_REAL, min(delays) if delays else 0)

    # -- the cleanup and the checkpoints ---------------------------------------------------------------------------
    def check(self) -> None:
        """Raise a kept exception now (call from a safe point in our own code)."""
        kept, self._pending = self._pending, None
        if kept is not None:
            self._arm()
            raise kept

    @cleanup
    def shield(self) -> "_Shield":
        """A block in which nothing is raised (a trial's cleanup); see NOTE [ Asynchronous exceptions ]."""
        return _Shield(self)


class _Shield:
    @cleanup
    def __init__(self, guard: SignalGuard) -> None:
        self.guard = guard

    @cleanup
    def __enter__(self) -> None:
        guard = self.guard
        guard._shielded += 1
        if guard._pending is not None and _rank(guard._pending) < 2:
            log.debug("dropped %r: the trial already ended", guard._pending)
            guard._pending = None
        guard._limit_passed = True
        guard._arm()

    def __exit__(self, *exc_info: Any) -> None:
        guard = self.guard
        guard._shielded -= 1
        if guard._pending is not None and _rank(guard._pending) < 2:
            guard._pending = None
        guard._arm()
