"""Where raising from a signal handler is unsafe (autoloader.supervise.unsafe): the standard library's lock code,
places where Python drops exceptions (a ``__del__``, a callback multiprocessing's fork runs), functions marked
``@cleanup``, modules holding handlers, and any frame called from one of those (``unsafe_anywhere``)."""
from __future__ import annotations

import multiprocessing.connection
import os
import queue
import sys

import pytest

from autoloader.supervise import unsafe
from autoloader.supervise.unsafe import cleanup, handlers_in, unsafe_anywhere, unsafe_to_raise

MULTIPROCESSING_DIR = os.path.dirname(multiprocessing.connection.__file__)


def _defined_in(filename: str, source: str, name: str, module: str = "stand_in"):
    """The function ``name`` of ``source``, compiled as code of ``filename`` (what the rules read of a frame)."""
    namespace = {"__name__": module, "sys": sys}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def test_unsafe_places_are_the_standard_librarys_lock_code():
    frames = {}

    def hook(frame, event, arg):
        if event == "c_call" or frame.f_code.co_filename == queue.__file__:
            frames.setdefault((frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_code.co_name),
                              []).append(unsafe_to_raise(frame))

    q = queue.Queue()
    sys.setprofile(hook)
    try:
        q.put(1)
        q.get()
        with pytest.raises(queue.Empty):
            q.get(timeout=0.01)  # blocks in Condition.wait, called by Queue.get, inside its try
    finally:
        sys.setprofile(None)
    assert all(frames[("threading.py", "__enter__")]) and all(frames[("queue.py", "put")])
    wait = frames[("threading.py", "wait")]
    assert wait[0] is True and False in wait  # unsafe before its try block, safe in the blocking acquire
    assert unsafe_to_raise(sys._getframe()) is False
    assert unsafe_to_raise(None) is False


def test_no_exception_is_raised_where_python_would_swallow_it():
    """A Ctrl-C raised in a ``__del__`` or in a callback that ``os.fork()`` runs (logging's lock release while
    workers are forked) is printed as "Exception ignored" and lost: such places are unsafe, the Ctrl-C is retried."""
    seen = []

    class Finalised:
        def __del__(self):
            seen.append(unsafe_to_raise(sys._getframe()))

    Finalised()
    assert seen == [True]

    def helper():
        return unsafe_to_raise(sys._getframe())

    assert helper() is False


def test_a_cleanup_frame_is_unsafe_and_so_is_every_frame_it_calls():
    def inner():
        return unsafe_to_raise(sys._getframe()), unsafe_anywhere(sys._getframe())

    @cleanup
    def stopping():
        return unsafe_to_raise(sys._getframe()), inner()

    own, (called_own, called_anywhere) = stopping()
    assert own is True, "a signal landing in a cleanup before its shield must be kept"
    assert (called_own, called_anywhere) == (False, True), "a helper is safe alone, not while a cleanup called it"
    assert inner() == (False, False)


def test_every_frame_of_a_module_holding_handlers_is_unsafe(monkeypatch):
    monkeypatch.setattr(unsafe, "_HANDLERS", set())
    handler = _defined_in("<handlers>", "def handler():\n    return sys._getframe()\n", "handler", "my.handlers")
    assert unsafe_to_raise(handler()) is False
    handlers_in("my.handlers")
    assert unsafe_to_raise(handler()) is True


def test_a_callback_multiprocessing_runs_is_where_python_drops_exceptions():
    call = _defined_in(os.path.join(MULTIPROCESSING_DIR, "util.py"), "def call(f):\n    return f()\n", "call")
    safe_call = _defined_in(multiprocessing.connection.__file__, "def call(f):\n    return f()\n", "call")

    def callback():
        return unsafe_to_raise(sys._getframe())

    assert call(callback) is True, "an exception raised in a fork callback is printed and lost"
    assert safe_call(callback) is False, "multiprocessing.connection's blocking reads are safe places"
    assert callback() is False


def test_unsafe_anywhere_without_a_frame_is_false():
    assert unsafe_anywhere(None) is False
    assert unsafe_anywhere(sys._getframe()) is False
