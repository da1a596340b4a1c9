"""Where raising from a signal handler is unsafe: code that may hold a lock outside the ``try``/``with`` that releases
it, code where Python drops exceptions, cleanups that must start unraised and the signal handlers themselves. The
rules and why are NOTE [ Asynchronous exceptions ] in signals.py, whose ``SignalGuard`` asks these questions.
"""
from __future__ import annotations

import multiprocessing.connection
import os
import queue
import threading
from types import CodeType, FrameType
from typing import Any, Callable, Optional, Set, TypeVar

_THREADING = threading.__file__
_QUEUE = queue.__file__
_MULTIPROCESSING = os.path.dirname(multiprocessing.connection.__file__) + os.sep
_SAFE_FILES = frozenset({multiprocessing.connection.__file__, getattr(__import__("selectors"), "__file__", "")})


F = TypeVar("F", bound=Callable[..., Any])
_CLEANUP: Set[CodeType] = set()
_HANDLERS: Set[str] = set()


def cleanup(function: F) -> F:
    """Mark ``function`` as one that must start its work unraised: a signal landing in its own frame (before it
    entered ``SignalGuard.shield()``) is kept, as inside the shield (NOTE [ Asynchronous exceptions ] in signals.py)."""
    _CLEANUP.add(function.__code__)
    return function


def handlers_in(module: str) -> None:
    """Mark every frame of ``module`` unsafe: it holds signal handlers, and one handler interrupted by another must
    not raise in it (NOTE [ Asynchronous exceptions ] in signals.py)."""
    _HANDLERS.add(module)


def unsafe_to_raise(frame: Optional[FrameType]) -> bool:
    """True when ``frame`` (the innermost one a signal interrupted) is in code that may hold a lock outside a
    ``try``/``with`` that releases it, or where Python would swallow the exception (see NOTE [ Asynchronous
    exceptions ] in signals.py)."""
    if frame is None:
        return False
    if frame.f_code in _CLEANUP or frame.f_globals.get("__name__") in _HANDLERS or _swallowed_in(frame):
        return True
    path = frame.f_code.co_filename
    if path in _SAFE_FILES:
        return False
    if path == _THREADING:
        caller = frame.f_back
        in_try = frame.f_code.co_name == "wait" and "gotit" in frame.f_locals
        return not (in_try and caller is not None and caller.f_code.co_filename == _QUEUE
                    and caller.f_code.co_name == "get")
    return path == _QUEUE or path.startswith(_MULTIPROCESSING)


def unsafe_anywhere(frame: Optional[FrameType]) -> bool:
    """``unsafe_to_raise`` for ``frame`` or any frame that called it: the line tracer runs in every frame, also in
    helpers that unsafe code calls (a weak set's ``add`` inside ``threading.Thread.__init__``), where the caller's
    state would be left half-made."""
    current = frame
    while current is not None:
        if unsafe_to_raise(current):
            return True
        current = current.f_back
    return False


def _swallowed_in(frame: FrameType) -> bool:
    """An exception raised here would be printed as "Exception ignored in ..." and lost: inside a ``__del__``
    (``in_finalizer``), or in a callback ``os.fork()`` runs (``register_at_fork``: its caller is multiprocessing's
    fork)."""
    caller = frame.f_back
    if caller is not None and caller.f_code.co_filename.startswith(_MULTIPROCESSING) and \
            caller.f_code.co_filename not in _SAFE_FILES and not frame.f_code.co_filename.startswith(_MULTIPROCESSING):
        return True
    return in_finalizer(frame)


def in_finalizer(frame: Optional[FrameType], depth: int = 64) -> bool:
    """``frame`` runs inside a ``__del__`` (within ``depth`` callers), where Python drops what is raised."""
    current = frame
    for _ in range(depth):
        if current is None:
            return False
        if current.f_code.co_name == "__del__":
            return True
        current = current.f_back
    return False
