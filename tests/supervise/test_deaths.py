"""autoloader.supervise.deaths: outside a signal guard, a worker's death that torch's SIGCHLD handler reports where
raising would leak a lock is kept and raised at the first safe line; where raising is safe, or inside a guard, it is
left as it was. The lock window is reproduced deterministically as in test_signals.py (``in_the_lock_window``: a
profile hook plays the signal's part); the last test uses torch's handler, a real worker and a real SIGCHLD."""
from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from autoloader.supervise.deaths import Deferred, deferring, watch_deaths
from autoloader.supervise.signals import SignalGuard
from autoloader.supervise.torch_watch import install_first
from conformance_data import Segfault
from helpers import in_the_lock_window, wait_no_children

ROOT = Path(__file__).resolve().parents[2]


class WorkerDied(RuntimeError):
    pass


def _dies(signum, frame):
    raise WorkerDied("DataLoader worker (pid 1) is killed by signal: Segmentation fault.")


def _files(exc):
    return [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]


needs_no_tracer = pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer (debugger, coverage) is set: the "
                                     "line trap stands aside and a death in unsafe code is left to torch's own check")


@needs_no_tracer
def test_a_death_in_the_lock_window_is_kept_and_raised_at_the_first_safe_line():
    """Where torch's handler would raise between ``Queue.put``'s acquire and its ``with`` (leaving the lock held,
    test_signals.py), the death is kept; the put completes and releases the lock, and the next line of ours raises."""
    deferred = Deferred(os.getpid())
    handler = deferring(_dies, deferred)
    q = multiprocessing.Queue()
    try:
        with pytest.raises(WorkerDied) as raised:
            in_the_lock_window(lambda: q.put(1), lambda frame: handler(signal.SIGCHLD, frame))
        assert not q._notempty._lock.locked(), "released by the put's own with block"
        assert q.get(timeout=10) == 1, "the put completed before the death was raised"
        assert not {threading.__file__, multiprocessing.queues.__file__} & set(_files(raised.value))
        assert raised.value.__context__ is None
        assert deferred.kept is None and not deferred.trap.armed and sys.gettrace() is None, "raised once, trap gone"
    finally:
        q.close()
        q.join_thread()


def test_a_death_where_raising_is_safe_is_raised_at_once():
    deferred = Deferred(os.getpid())
    with pytest.raises(WorkerDied):
        deferring(_dies, deferred)(signal.SIGCHLD, sys._getframe())
    assert deferred.kept is None


def test_a_death_where_python_drops_exceptions_is_dropped_not_kept():
    """A death landing in a ``__del__`` (an iterator shutting down after its loop already raised the worker's broken
    connection) is what Python would print as "Exception ignored" and drop: kept, it came out of the user's code after
    their ``except`` (scripts/gpu_check.py's killed-while-pinning check, 4 of 12 runs). It is dropped: not raised in
    the finalizer (the lock stays free), not kept for later."""
    deferred = Deferred(os.getpid())
    handler = deferring(_dies, deferred)
    seen = []

    class Finalised:
        def __del__(self):
            try:
                handler(signal.SIGCHLD, sys._getframe())
                seen.append("returned")
            except WorkerDied:
                seen.append("raised")

    Finalised()  # kept, the line trap would raise it at the next line
    assert seen == ["returned"], seen
    assert deferred.kept is None and not deferred.trap.armed


def _unsafe_frame():
    """A live frame of the standard library's synchronisation code: ``Condition.wait`` under ``Event.wait``, in a
    thread that returns at once after."""
    event = threading.Event()
    thread = threading.Thread(target=event.wait, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            event.set()
            return frame
        time.sleep(0.01)
    raise AssertionError("the thread never waited")


def test_inside_a_guard_the_guard_decides():
    install_first()
    deferred = Deferred(os.getpid())
    handler = deferring(_dies, deferred)
    with SignalGuard() as guard:
        assert guard.active and guard.wraps(signal.SIGCHLD)
        with pytest.raises(WorkerDied):  # raised on: the guard's wrapper, above this one, keeps or raises it
            handler(signal.SIGCHLD, _unsafe_frame())
    assert deferred.kept is None


def test_under_another_tracer_a_death_in_unsafe_code_is_dropped_not_raised_there():
    """No line trap can be set over a debugger's tracer: raising would leak, keeping would never end; dropped, since
    torch's iterator finds its dead workers itself."""
    deferred = Deferred(os.getpid())
    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: None)
    try:
        deferring(_dies, deferred)(signal.SIGCHLD, _unsafe_frame())
    finally:
        sys.settrace(previous)
    assert deferred.kept is None and not deferred.trap.armed


_FRESH = """
import signal
from autoloader.supervise.deaths import watch_deaths
watch_deaths()
first = signal.getsignal(signal.SIGCHLD)
watch_deaths()
print(first.__module__, signal.getsignal(signal.SIGCHLD) is first)
"""


def test_watch_deaths_wraps_torchs_handler_once_per_process():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _FRESH], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["autoloader.supervise.deaths", "True"]


@needs_no_tracer
def test_a_real_workers_death_while_the_main_thread_waits_in_threading_is_raised_after_the_wait():
    """torch's handler, a real worker, a real SIGCHLD: the death lands in ``Condition.wait`` (unsafe), is kept, and is
    raised at the first line after the wait returned (3 s), never inside the standard library."""
    watch_deaths()
    it = iter(DataLoader(Segfault(delay_s=0.3), batch_size=2, num_workers=1))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="is killed by signal") as raised:
        threading.Event().wait(3.0)  # the worker dies 0.3 s after its start: 2.7 s of margin on a loaded machine
        time.sleep(0)  # the first line after the wait: raised here
    waited = time.monotonic() - started
    assert waited >= 2.9, f"raised after {waited:.2f} s: inside the wait, not after it"
    assert threading.__file__ not in _files(raised.value)
    del it, raised
    assert wait_no_children() == []
