"""``measure.cpuclock``: a spinning thread that shares its CPU with another process is either running or waiting
for the CPU, and the run delay says how long it waited (what tells waiting for a CPU from waiting for data)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from autoloader.measure.cpuclock import cpu_and_delay, machine_busy_s, run_delay_s, spent
from autoloader.measure.marks import Reading, other_cpus


def test_spent_is_the_difference_and_none_when_unread():
    assert spent((1.0, 2.0), (1.5, 2.25)) == (0.5, 0.25)
    assert spent((1.0, None), (1.5, 2.25)) == (0.5, None)


def test_run_delay_counts_the_time_a_spinning_thread_waits_for_its_cpu():
    if run_delay_s() is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("this kernel gives no per-thread schedstat (or no CPU affinity)")
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    seen = {}

    def spin() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        time.sleep(0.3)  # the hog is running by now
        wall0, clocks0 = time.perf_counter(), cpu_and_delay()
        while time.perf_counter() - wall0 < 1.0:
            pass
        seen["wall"], seen["spent"] = time.perf_counter() - wall0, spent(clocks0, cpu_and_delay())

    try:
        thread = threading.Thread(target=spin)
        thread.start()
        thread.join(timeout=30)
    finally:
        hog.kill()
        hog.wait()
    wall, (cpu_s, delay_s) = seen["wall"], seen["spent"]
    assert delay_s is not None and delay_s >= 0.25 * wall, (wall, cpu_s, delay_s)
    assert 0.75 * wall <= cpu_s + delay_s <= 1.15 * wall + 0.05, (wall, cpu_s, delay_s)


def test_the_machines_busy_time_counts_another_process_on_this_processs_cpus():
    """``machine_busy_s`` counts every process's work on the CPUs this process may use: a busy child adds about its
    CPU seconds, which ``marks.other_cpus`` then counts as the machine's other load (generous margins: a shared
    machine adds its own)."""
    before = machine_busy_s()
    if before is None:
        pytest.skip("the platform does not report the CPUs' busy time")
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"])
    started = time.perf_counter()
    hog.wait(timeout=30)
    wall = time.perf_counter() - started
    busy = machine_busy_s() - before
    assert busy >= 0.6, (busy, wall)
    start = Reading(0.0, 0.0, None, 0.0)
    assert other_cpus(start, Reading(wall, 0.0, None, busy)) == pytest.approx(busy / wall)
    assert other_cpus(start, Reading(wall, busy, None, busy)) == 0.0, "all of it this process's own"
    assert other_cpus(start, Reading(wall, 0.0, None, None)) is None
