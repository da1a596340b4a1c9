"""``DaemonPool``: the threads of one process that fetch a ``ThreadedDataset``'s samples (loader/threads.py), made in
the process that uses them and stopped when dropped or at exit, never joined (NOTE [ Threads inside workers ]).

# NOTE [ Threads inside workers ]
# Threads do not survive fork: a forked worker inherits the parent's pool object but none of its threads, so a
# wrapper never uses a pool it did not make in this process. The pool is created on the first batch, keyed by
# os.getpid() (after fork, or after unpickling in a spawn/forkserver worker, where it is never pickled) under a
# lock that is renewed in every forked child (it may have been held by a parent thread at the fork: ``pool_lock``).
# Shutdown: the threads are daemon threads (as torch's pin-memory thread). ThreadPoolExecutor's are not, and the
# interpreter joins them at exit: a process (the main one after Ctrl-C, or a worker told to stop after a sample
# raised) would wait for every sample still running, minutes for a hung request. Idle threads block on the task
# queue; dropping the pool (the wrapper collected, or replaced after a fork) or exiting queues one stop per thread.
"""
from __future__ import annotations

import os
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable

_STOP = None
_pool_lock = threading.Lock()


def _renew_lock_in_child() -> None:
    global _pool_lock
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_lock_in_child)


def pool_lock() -> threading.Lock:
    """The lock under which a process makes its pools, this process's own (renewed in every forked child)."""
    return _pool_lock


def _serve(tasks: queue.SimpleQueue) -> None:
    while True:  # one pool thread: run tasks until told to stop
        task = tasks.get()
        if task is _STOP:
            return
        future, fn, arg = task
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(arg))
            except BaseException as exc:  # handed to the caller of __getitems__, which re-raises it
                future.set_exception(exc)
        del task, future, fn, arg  # no reference to the sample or the exception while idle


def _stop_threads(tasks: queue.SimpleQueue, threads: int) -> None:
    for _ in range(threads):
        tasks.put(_STOP)


class DaemonPool:
    """``threads`` daemon threads of the process that made it (``pid``); they stop when it is dropped or at exit."""

    def __init__(self, threads: int) -> None:
        self.pid = os.getpid()
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=_serve, args=(self._tasks,), name=f"autoloader-threads-{i}", daemon=True).start()
        weakref.finalize(self, _stop_threads, self._tasks, threads)

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Future:
        """``fn(arg)`` run by one of the pool's threads: its result, or what it raised, in the ``Future``."""
        future: Future = Future()
        self._tasks.put((future, fn, arg))
        return future
