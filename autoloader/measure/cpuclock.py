"""The clocks a measured batch reads besides the wall clock: this process's CPU time, how long the calling thread
has waited on a run queue for a CPU (Linux ``schedstat``), and, at a window's edges, how busy the machine's CPUs this
process may run on were, whoever kept them busy (``machine_busy_s``).

Without the second, a fetch that took 10 ms of wall time and 4 ms of CPU looks like loading that waits 60 % of the
time (for a disk, a network, a sleep) when, on a busy machine, it may have been waiting for a CPU: the two call for
opposite answers (threads that overlap waits, or fewer loading processes). The run delay tells them apart: what is
left of the wall time after the CPU time and the run-queue wait is the waiting for data.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Dict, Optional, Tuple

import psutil

_FDS: Dict[int, Optional[int]] = {}
"""An open ``/proc/self/task/<tid>/schedstat`` per thread that read it (None: unreadable there)."""


def run_delay_s() -> Optional[float]:
    """Seconds the calling thread has spent runnable but waiting for a CPU since it started; None where the kernel
    does not say (not Linux, no schedstats)."""
    tid = threading.get_native_id()
    for _ in range(2):
        fd = _FDS.get(tid, -1)
        if fd == -1:
            fd = _open(tid)
        if fd is None:
            return None
        try:
            return int(os.pread(fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):  # a reused thread id whose first thread is gone: open it again
            os.close(fd)
            del _FDS[tid]
    return None


def _open(tid: int) -> Optional[int]:
    try:
        fd: Optional[int] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
    except OSError:
        fd = None
    _FDS[tid] = fd
    return fd


def cpu_and_delay() -> Tuple[float, Optional[float]]:
    """(this process's CPU seconds, the calling thread's run-queue seconds) now."""
    return time.process_time(), run_delay_s()


def spent(start: Tuple[float, Optional[float]], end: Tuple[float, Optional[float]]) -> Tuple[float, Optional[float]]:
    """CPU seconds and run-queue seconds between two ``cpu_and_delay()`` readings (the latter None if not read)."""
    delay = None if start[1] is None or end[1] is None else max(0.0, end[1] - start[1])
    return end[0] - start[0], delay


def machine_busy_s() -> Optional[float]:
    """Seconds the CPUs this process may run on (its affinity) have been busy since boot, every process's work on them
    summed (``/proc/stat``'s user, nice, system, irq, softirq and steal); None where the platform does not say. Over a
    window, less this process tree's CPU time, it is the machine's other load on the workers' CPUs."""
    try:
        per_cpu = psutil.cpu_times(percpu=True)
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(per_cpu))
    except (OSError, AttributeError, NotImplementedError):
        return None
    busy = 0.0
    for index in allowed:
        if index < len(per_cpu):
            times = per_cpu[index]
            busy += times.user + times.system + sum(getattr(times, name, 0.0) for name in
                                                    ("nice", "irq", "softirq", "steal"))
    return busy
