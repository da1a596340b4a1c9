"""Which of several nested signal guards acts on a signal, and how an exception a guard kept is raised again (NOTE
[ Asynchronous exceptions ] in signals.py): the guard entered last delivers (``delivering``); ``LineTrap`` raises a
kept exception at the first line run somewhere safe; ``TakeBack`` takes back one that Python is about to drop."""
from __future__ import annotations

import inspect
import os
import sys
import threading
from types import FrameType
from typing import Any, Callable, List, Optional, Protocol

from .procs import exiting


class Keeper(Protocol):
    """What these helpers ask of a guard (``signals.SignalGuard``)."""

    active: bool
    pid: int

    def wraps(self, signum: int) -> bool:
        """It wrapped ``signum``'s handler when it was entered."""

    def raise_if_safe(self, frame: FrameType) -> None:
        """Raise the kept exception in ``frame`` when it is somewhere safe."""

    def take_back(self, exc: BaseException, frame: Optional[FrameType]) -> bool:
        """Keep ``exc``, which Python is dropping, when it is this guard's to raise."""

    def give_up_kept(self) -> Optional[BaseException]:
        """What it kept, now for a guard entered inside it to raise (that one's timer retries it)."""


_ENTERED: List[Keeper] = []
"""Guards in the order they were entered (a forked worker inherits the list: each guard's pid tells)."""


def active() -> List[Keeper]:
    """This process's active guards, the one entered last at the end."""
    pid = os.getpid()
    return [guard for guard in _ENTERED if guard.active and guard.pid == pid]


def delivering(signum: int) -> Optional[Keeper]:
    """The guard whose wrapper acts on ``signum``: the last one entered of those active that wrapped it."""
    return next((guard for guard in reversed(active()) if guard.wraps(signum)), None)


class LineTrap:
    """While its guard keeps an exception, a line tracer that raises it at the first line run somewhere safe;
    ``disarm`` removes it."""

    def __init__(self, guard: Keeper) -> None:
        self.guard = guard
        self.frames: List[FrameType] = []
        self.armed = False

    def arm(self, frame: Optional[FrameType]) -> None:
        if self.armed or frame is None or sys.gettrace() is not None:
            return
        self.armed = True
        current: Optional[FrameType] = frame
        while current is not None:
            current.f_trace = self._line
            self.frames.append(current)
            current = current.f_back
        sys.settrace(self._call)

    def disarm(self) -> None:
        if not self.armed:
            return
        self.armed = False
        if sys.gettrace() == self._call:
            sys.settrace(None)
        for frame in self.frames:
            frame.f_trace = None
        self.frames.clear()

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._line if self.armed and os.getpid() == self.guard.pid else None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if os.getpid() != self.guard.pid:  # a forked worker inherited the tracer
            sys.settrace(None)
            return None
        if not self.armed:
            return None
        if event == "line":
            self.guard.raise_if_safe(frame)
        return self._line


class TakeBack:
    """``sys.unraisablehook`` while a guard is active: an exception Python would drop in the main thread is kept by the
    innermost active guard of this process that claims it, else passed on to the hook it replaced. Guards register
    here as they enter and exit (``enter``/``exit``): the first installs the hook, the last to exit removes it."""

    def __init__(self) -> None:
        self.previous: Optional[Callable[[sys.UnraisableHookArgs], Any]] = None
        # What the hook calls, bound now: a guard left active at exit keeps the hook installed while the interpreter
        # clears this module's globals (inspect was None there: "'NoneType' object has no attribute 'currentframe'").
        self._frame, self._active, self._fallback = inspect.currentframe, active, sys.__unraisablehook__
        self._thread, self._main, self._finalizing = threading.current_thread, threading.main_thread, exiting

    def __call__(self, unraisable: sys.UnraisableHookArgs) -> None:
        exc, caller = unraisable.exc_value, self._frame()
        main = self._thread() is self._main()  # where the guard's signals are delivered
        try:
            guards = list(reversed(self._active())) if main else []
        except (AttributeError, TypeError):  # the interpreter is finalising: active()'s globals are gone, no guard
            guards = []
        for guard in guards:
            if exc is not None and guard.take_back(exc, caller.f_back if caller is not None else None):
                return
        (self.previous or self._fallback)(unraisable)

    def enter(self, guard: Keeper) -> None:
        _ENTERED[:] = [g for g in _ENTERED if g.active]
        if not _ENTERED and sys.unraisablehook is not self:  # a hook set over ours meanwhile is left in place
            self.previous, sys.unraisablehook = sys.unraisablehook, self
        _ENTERED.append(guard)

    def exit(self, guard: Keeper) -> None:
        if self._finalizing():  # a generator holding a guard closed at exit: the globals below may be gone already
            return
        if guard in _ENTERED:
            _ENTERED.remove(guard)
        if not any(g.active for g in _ENTERED) and sys.unraisablehook is self:
            sys.unraisablehook, self.previous = self.previous or sys.__unraisablehook__, None
            _ENTERED.clear()


TAKE_BACK = TakeBack()
