"""An emulated N-core host on a machine with fewer cores: the CPU proxy online tuning is iterated on (issue 45, item 5).

Per-sample work holds one of ``cores`` slots of a ``multiprocessing.Semaphore`` shared with the forked DataLoader
workers, and sleeps while it holds it: at most ``cores`` samples are worked on at once, in the main process and every
worker together, as on a host of ``cores`` CPUs whose data work is CPU-bound, yet 2 real cores serve it (the sleeps
cost nothing). Starting a worker costs what it costs on a real many-core host: ``fork_s`` in the parent before each
fork (serial, holding a slot: forking a big process copies its page tables) and ``init_s`` on a worker's first sample
(holding a slot: the worker's own set-up).

autoloader must see the emulated host as it would see a real one. ``VirtualHost.emulate()`` patches, in this process
only (and the workers it forks):

- the CPU probe: ``probe_machine().cpu.usable`` (and ``logical``, ``affinity``) read ``cores``;
- the CPU clocks the tuner reads: ``time.process_time()`` (the main process's CPU time, ``measure/cpuclock.py`` and
  ``measure/window.py``), ``psutil.Process.cpu_times()`` (a worker's, ``supervise/procs.WorkerTracker``) and
  ``procs._children_cpu_s()`` (the workers already waited for) each add the seconds the process held a slot: the
  *virtual CPU clock*. Each process adds its held seconds to its own record in a table of shared memory (mapped
  before any worker forks), so a worker busy 100 % of the time on the emulated host reads 100 % CPU;
- the run-queue clock (``cpuclock.run_delay_s``) adds the seconds the process waited for a slot: on a real host a
  process ready to run with every core busy waits on the run queue, which the tuner reads as oversubscription.

Limits: only CPU-bound work is emulated (no I/O, no memory bandwidth, no cache effects); the real per-batch costs
(DataLoader IPC, collate, Python) run on the real cores and are the same as on 2 cores, so the emulated host is
faithful only while they stay small beside the emulated work (the benchmark's rows keep the real work under ~0.5 of a
real core); a slot held is a sleep, and a sleep on a loaded 2-core machine overshoots (the overshoot is counted as
held). Only the fork start method (the dataset holds the semaphore and a memory map).
"""
from __future__ import annotations

import contextlib
import functools
import mmap
import multiprocessing
import os
import time
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import psutil
import torch
from torch.utils.data import Dataset

RECORD = np.dtype([("pid", "i8"), ("ppid", "i8"), ("start", "i8"), ("cpu", "f8"), ("wait", "f8"), ("holding", "i8")])
"""One process's virtual clocks: who it is (pid, parent, start time in clock ticks: a pid is reused), the seconds it
held a slot (``cpu``) and waited for one (``wait``), and whether it holds one now."""

REPAIR_EVERY_S = 0.5
"""How often, at most, a process waiting for a slot looks for slots held by dead processes (one look reads
``/proc/<pid>/stat`` of every holder)."""

_ACTIVE: List["VirtualHost"] = []
"""The hosts whose ``emulate()`` is in force: their fork cost is paid before every fork."""
_HOOKED = False


def _stat(pid: int) -> Optional[Tuple[str, int]]:
    """(state letter, start time in clock ticks) of ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[19])


def _before_fork() -> None:
    for host in list(_ACTIVE):
        if host.fork_s > 0 and os.getpid() == host.creator:
            host.hold(host.fork_s)


class VirtualHost:
    """``cores`` emulated CPUs: ``work(seconds)`` is ``seconds`` of one of them, in any process forked after this
    was made. ``fork_s``: seconds of a slot the parent holds before each fork while ``emulate()`` is in force;
    ``init_s``: seconds a worker process holds a slot for its first sample, besides the sample's own work."""

    def __init__(self, cores: int, *, fork_s: float = 0.0, init_s: float = 0.0, records: int = 1 << 15) -> None:
        if cores < 1:
            raise ValueError(f"cores={cores} must be >= 1")
        context = multiprocessing.get_context("fork")
        self.cores, self.fork_s, self.init_s = cores, float(fork_s), float(init_s)
        self.creator = os.getpid()
        self.slots = context.Semaphore(cores)
        self._claim = context.Lock()
        self._claimed = context.RawValue("q", 0)
        self._repaired = context.RawValue("d", 0.0)  # when a waiting process last looked for dead holders
        # anonymous and shared: every process forked later sees it
        self._map: Optional[mmap.mmap] = mmap.mmap(-1, records * RECORD.itemsize)
        self.table = np.frombuffer(self._map, dtype=RECORD)
        self._mine = (-1, -1)  # (pid, record) of the process that claimed it; a forked child sees another pid
        self._inited = -1  # the pid whose init was paid
        self._gone = np.zeros(records, dtype=bool)  # the creator's: records of processes known to be reaped
        self._gone_cpu = 0.0

    # ------------------------------------------------------------ the work

    def record(self) -> int:
        """This process's record, claimed on its first use."""
        pid = os.getpid()
        if self._mine[0] != pid:
            with self._claim:
                index = self._claimed.value
                if index >= len(self.table):
                    raise RuntimeError(f"VirtualHost: more than {len(self.table)} processes; pass records=")
                self._claimed.value = index + 1
            stat = _stat(pid)
            self.table[index] = (pid, os.getppid(), stat[1] if stat else -1, 0.0, 0.0, 0)
            self._mine = (pid, index)
        return self._mine[1]

    def hold(self, seconds: float) -> None:
        """Hold a slot for ``seconds`` (waiting for one first), counted on this process's virtual clocks."""
        index = self.record()
        asked = time.perf_counter()
        while not self.slots.acquire(timeout=0.1):
            if time.monotonic() - self._repaired.value >= REPAIR_EVERY_S:
                self._repaired.value = time.monotonic()
                self.repair()
        self.table["holding"][index] = 1
        got = time.perf_counter()
        try:
            time.sleep(seconds)
        finally:
            held = time.perf_counter() - got
            self.table["holding"][index] = 0
            self.slots.release()
            self.table["cpu"][index] += held
            self.table["wait"][index] += got - asked

    def work(self, seconds: float) -> None:
        """``seconds`` of one emulated core; a worker's first call also pays ``init_s``."""
        pid = os.getpid()
        if pid != self.creator and self._inited != pid:
            self._inited = pid
            seconds += self.init_s
        self.hold(seconds)

    def repair(self) -> int:
        """Give back the slots of processes that died holding one (SIGKILL, or SIGTERM inside a sleep); how many."""
        freed = 0
        with self._claim:
            claimed = self._claimed.value
            for index in np.flatnonzero(self.table["holding"][:claimed]):
                rec = self.table[index]
                stat = _stat(int(rec["pid"]))
                if stat is None or stat[0] == "Z" or stat[1] != rec["start"]:
                    self.table["holding"][index] = 0
                    self.slots.release()
                    freed += 1
        return freed

    # ------------------------------------------------------------ the virtual clocks

    def _latest(self, pid: int) -> Optional[int]:
        hits = np.flatnonzero(self.table["pid"][:self._claimed.value] == pid)
        return int(hits[-1]) if len(hits) else None

    def _index(self, pid: int) -> Optional[int]:
        return self._mine[1] if pid == self._mine[0] else self._latest(pid)

    def cpu_of(self, pid: int) -> float:
        """Seconds of slots process ``pid`` has held (0 for a process that never worked)."""
        index = self._index(pid)
        return 0.0 if index is None else float(self.table["cpu"][index])

    def wait_of(self, pid: int) -> float:
        """Seconds process ``pid`` has waited for a slot."""
        index = self._index(pid)
        return 0.0 if index is None else float(self.table["wait"][index])

    def reaped_cpu_s(self) -> float:
        """Held seconds of this process's children that are gone (waited for): what ``RUSAGE_CHILDREN`` would have
        gained from them. A zombie still counts as running, as psutil reads it."""
        me, claimed = os.getpid(), self._claimed.value
        for index in np.flatnonzero(~self._gone[:claimed] & (self.table["ppid"][:claimed] == me)):
            rec = self.table[index]
            stat = _stat(int(rec["pid"]))
            if stat is None or stat[1] != rec["start"]:
                self._gone[index] = True
                self._gone_cpu += float(rec["cpu"])
        return self._gone_cpu

    @contextlib.contextmanager
    def emulate(self) -> Iterator["VirtualHost"]:
        """autoloader sees this host while the block runs (see the module's docstring); everything is put back."""
        global _HOOKED
        from autoloader.measure import cpuclock
        from autoloader.supervise import procs
        from autoloader.probe import machine

        real_probe, real_process_time = machine._probe_cpu, time.process_time
        real_delay, real_cpu_times = cpuclock.run_delay_s, psutil.Process.cpu_times
        real_children = procs._children_cpu_s
        cores, host = self.cores, self

        def probe_cpu(proc_cgroup: str) -> Any:
            found = real_probe(proc_cgroup)
            return machine.CpuInfo(usable=cores, logical=cores, physical=cores, affinity=cores, quota=None,
                                   model=f"emulated {cores}-core host ({found.usable} real: {found.model})")

        def process_time() -> float:
            return real_process_time() + host.cpu_of(os.getpid())

        def run_delay_s() -> Optional[float]:
            real = real_delay()
            return None if real is None else real + host.wait_of(os.getpid())

        @functools.wraps(real_cpu_times)  # its cache_activate/cache_deactivate: psutil's oneshot() calls them
        def cpu_times(proc: psutil.Process) -> Any:
            times = real_cpu_times(proc)
            return times._replace(user=times.user + host.cpu_of(proc.pid))

        def children_cpu_s() -> float:
            return real_children() + host.reaped_cpu_s()

        patches = [(machine, "_probe_cpu", probe_cpu), (time, "process_time", process_time),
                   (cpuclock, "run_delay_s", run_delay_s), (psutil.Process, "cpu_times", cpu_times),
                   (procs, "_children_cpu_s", children_cpu_s)]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        if not _HOOKED:
            os.register_at_fork(before=_before_fork)
            _HOOKED = True
        for owner, name, value in patches:
            setattr(owner, name, value)
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)
            for owner, name, value in saved:
                setattr(owner, name, value)

    def close(self) -> None:
        """Let go of the shared table (unmapped once no view of it is left; call it after every process that used
        it is gone)."""
        self.table = np.zeros(0, dtype=RECORD)
        self._map = None


TIMED_SAMPLES = 5
"""Samples of each batch held one by one (see ``CoresDataset.__getitems__``)."""


class CoresDataset(Dataset):
    """``n`` samples, each ``sample_s`` of one emulated core of ``host``; sample ``i`` is ``features`` floats equal to
    ``i`` (small: the real cost of passing it between processes stays small beside the emulated work)."""

    def __init__(self, host: VirtualHost, n: int, *, sample_s: float, features: int = 16) -> None:
        self.host, self.n, self.sample_s, self.features = host, n, sample_s, features

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: List[int]) -> List[torch.Tensor]:
        """A batch's samples (a DataLoader's fetcher calls this), worked on as the indices are walked, as a dataset
        that decodes sample by sample is: the first ``TIMED_SAMPLES`` one hold of a core each (what online tuning's
        sample clock times, measure/sample_clock.py), the rest in one hold (one wake-up per batch rather than per
        sample keeps the real cost of the emulation small beside the emulated work)."""
        samples = []
        for k, i in enumerate(indices):
            if not 0 <= i < self.n:
                raise IndexError(i)
            if k < TIMED_SAMPLES:
                self.host.work(self.sample_s)
            samples.append(torch.full((self.features,), float(i)))
        if len(samples) > TIMED_SAMPLES:
            self.host.work(self.sample_s * (len(samples) - TIMED_SAMPLES))
        return samples
