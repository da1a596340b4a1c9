"""autoloader/loader/thread_pool.py: ``DaemonPool`` runs tasks on daemon threads of the process that made it, hands
back results and exceptions, stops its threads when dropped; the lock pools are made under is a new one after fork
(NOTE [ Threads inside workers ])."""
from __future__ import annotations

import gc
import os
import threading
import time

import pytest

from autoloader.loader.thread_pool import DaemonPool, pool_lock
from helpers import pool_threads


def test_tasks_run_on_daemon_threads_and_return_results_and_exceptions():
    pool = DaemonPool(3)
    assert pool.pid == os.getpid()
    names = [pool.submit(lambda _: threading.current_thread(), i).result(timeout=10) for i in range(6)]
    assert all(t.daemon and t.name.startswith("autoloader-threads-") for t in names)
    assert pool.submit(lambda x: x * 2, 21).result(timeout=10) == 42
    with pytest.raises(KeyError, match="sample 3"):
        pool.submit(lambda key: {}[key], "sample 3").result(timeout=10)


def test_the_threads_stop_when_the_pool_is_dropped():
    """This pool's own threads, told from those of pools other tests dropped (which may still be stopping: a count
    taken before made CI's run fail once)."""
    before = set(pool_threads())
    pool = DaemonPool(4)
    pool.submit(lambda _: None, 0).result(timeout=10)
    mine = set(pool_threads()) - before
    assert len(mine) == 4
    del pool
    gc.collect()
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in mine) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t for t in mine if t.is_alive()]


def test_a_cancelled_task_does_not_run():
    gate = threading.Event()
    pool = DaemonPool(1)
    busy = pool.submit(lambda _: gate.wait(10), None)
    ran = []
    waiting = pool.submit(ran.append, "ran")
    assert waiting.cancel()
    gate.set()
    busy.result(timeout=10)
    pool.submit(lambda _: None, None).result(timeout=10)
    assert ran == []


def test_a_forked_child_makes_its_pools_under_a_lock_of_its_own():
    with pool_lock():  # held by this thread when the child is forked, as a parent's thread might hold it
        pid = os.fork()
        if pid == 0:
            free = pool_lock().acquire(blocking=False)
            os._exit(0 if free else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
