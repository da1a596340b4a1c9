"""A worker's death reported outside a signal guard: an epoch served with no tuning under way, the user's own loop
between batches (inside a guard, NOTE [ Asynchronous exceptions ] in signals.py has the rules).

torch's SIGCHLD handler raises "DataLoader worker (pid X) is killed by signal" at whatever bytecode the main thread
runs. Raised inside ``Condition.__enter__`` under ``Queue.put`` (the indices an iterator's start sends its workers), it
left that queue's lock held, and the iterator's shutdown then waited for the lock forever: a loader whose dataset
crashes its workers could hang after printing its ``RuntimeError`` (tests/benchmarks/results/stress.md).
``watch_deaths`` wraps torch's handler once per process (``deferring``): where its exception would land in code that may
hold a lock outside the ``try``/``with`` that releases it (``unsafe.unsafe_to_raise``), it is kept (``Deferred``) and
raised at the first line run where neither that frame nor any caller is unsafe (a ``redelivery.LineTrap``, as a guard
does). Under a tracer of someone else's (a debugger, coverage) no trap can be set and the death is dropped instead:
torch's iterator finds its dead workers itself within ``MP_STATUS_CHECK_INTERVAL`` (5 s) and raises "exited
unexpectedly". Nothing else is kept for later: torch reports a death once (its check forgets the iterator's workers as
it raises). Nor is a death that lands inside a finalizer (``unsafe.in_finalizer``: a ``__del__`` in the chain), where
Python would drop the exception anyway: an iterator whose loop already raised the dead worker's broken connection shuts
down in its ``__del__``, its other worker's exit runs torch's check there, and torch's raise is "Exception ignored";
kept, it came out of the user's code after their ``except`` (``scripts/gpu_check.py``'s killed-while-pinning check). It
is dropped unraised, which also keeps the lock free. Ctrl-C outside a guard stays the user's and torch's: no handler of
ours is installed for it.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any, Callable, Optional

from . import torch_watch
from .redelivery import LineTrap, delivering
from .unsafe import handlers_in, in_finalizer, unsafe_anywhere, unsafe_to_raise

log = logging.getLogger("autoloader.trial")
handlers_in(__name__)

Handler = Callable[[int, Optional[FrameType]], Any]


class Deferred:
    """The death ``deferring`` kept in process ``pid`` (without its traceback, whose frames would hold the interrupted
    iterator), raised by its ``LineTrap`` at the first safe line: a ``redelivery.Keeper`` that wraps no signal."""

    active = True

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.kept: Optional[BaseException] = None
        self.trap = LineTrap(self)

    def keep(self, exc: BaseException, frame: Optional[FrameType]) -> bool:
        """Keep ``exc`` for the first safe line after ``frame``; False (nothing kept) when no trap can be set."""
        if self.kept is None:
            self.trap.arm(frame)
            if not self.trap.armed:
                return False
            exc.__context__ = None
            self.kept = exc.with_traceback(None)
        return True

    def raise_if_safe(self, frame: FrameType) -> None:
        if self.kept is None or unsafe_anywhere(frame):
            return
        kept, self.kept = self.kept, None
        self.trap.disarm()
        raise kept

    def wraps(self, signum: int) -> bool:
        return False

    def take_back(self, exc: BaseException, frame: Optional[FrameType]) -> bool:
        return False

    def give_up_kept(self) -> Optional[BaseException]:
        return None


def deferring(inner: Handler, deferred: Deferred) -> Handler:
    """``inner`` (torch's handler) in ``deferred``'s process, its exception kept by ``deferred`` where the frame it
    interrupted is unsafe to raise in and no signal guard delivers SIGCHLD (a guard's wrapper sits above this one and
    keeps it by its own rules); dropped inside a finalizer, where Python would drop it (``unsafe.in_finalizer``)."""
    def handler(signum: int, frame: Optional[FrameType]) -> None:
        if os.getpid() != deferred.pid or delivering(signum) is not None:
            inner(signum, frame)
            return
        try:
            inner(signum, frame)
        except Exception as exc:
            if not unsafe_to_raise(frame):
                raise
            dropped = in_finalizer(frame)
            kept = not dropped and deferred.keep(exc, frame)
            log.debug("%s %r: interrupted %s:%s", "kept" if kept else "dropped (Python drops it there)" if dropped
                      else "dropped (a tracer is set)", exc, frame and frame.f_code.co_filename,
                      frame and frame.f_code.co_name)
    return handler


_deferred: Optional[Deferred] = None
"""This process's, once ``watch_deaths`` wrapped its handler (a forked child inherits its parent's: ``pid`` tells)."""


def watch_deaths() -> None:
    """Install torch's SIGCHLD handler (``torch_watch.install_first``) and wrap it with ``deferring``, once per
    process, from the main thread (elsewhere signals cannot be set, and torch installs none)."""
    global _deferred
    torch_watch.install_first()
    if (_deferred is not None and _deferred.pid == os.getpid()) or not hasattr(signal, "SIGCHLD") \
            or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGCHLD)
    if callable(current) and torch_watch.is_torchs(current):
        _deferred = Deferred(os.getpid())
        signal.signal(signal.SIGCHLD, deferring(current, _deferred))
