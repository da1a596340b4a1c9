"""What a candidate's window records: one mark per consumed batch (``BatchMark``), the counters it reads at its edges
(``Reading``, ``Edges``), and the plain reckoning over them (a batch's samples, the mean run-queue wait, the other
processes' CPUs). ``window.py``'s ``Window`` records them; NOTE [ Trial timing ] in run.py says how."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..loader.batch import iter_tensors
from ..supervise.procs import WorkerSample, WorkerTracker
from . import cow

__all__ = ["BatchMark", "Edges", "Reading", "mean_delay", "other_cpus", "samples_in"]


@dataclass(frozen=True)
class BatchMark:
    """One consumed batch: when the consumer finished it, its samples, and where its time went."""

    done: float
    samples: int
    wait_s: float
    """Wall time inside ``next()``: waiting for data."""
    wait_cpu_s: float
    """This process's CPU time inside ``next()``."""
    step_s: float
    """Host time inside the consumer step (and the pacing after it)."""
    wait_delay_s: Optional[float] = None
    """The main thread's time inside ``next()`` waiting for a CPU (run queue), when the kernel says."""
    step_cpu_s: float = 0.0
    """This process's CPU time inside the consumer step, every thread of it (a CPU step's intra-op pool too)."""


@dataclass(frozen=True)
class Reading:
    """Counters read at one edge of the window: the wall clock, this process's CPU time, its workers', and the
    machine's busy time on this process's CPUs (``cpuclock.machine_busy_s``)."""

    time: float
    main_cpu_s: float
    workers: Optional[WorkerSample]
    machine_busy_s: Optional[float] = None


@dataclass
class Edges:
    """What a window reads at its edges: the workers' tracker and their memory at the first batch, the counters when
    it began (a probe's window spans its run from the start), opened and closed, and when it closed; one worker's
    pages copied in between (copy-on-read)."""

    end: float
    begun: Optional[Reading] = None
    tracker: Optional[WorkerTracker] = None
    memory_start: Optional[WorkerSample] = None
    opened: Optional[Reading] = None
    closed: Optional[Reading] = None
    census: Optional[cow.Census] = None
    """One worker's shared pages at the first batch (``cow.take``), and its pid, for what it copies by the end."""
    census_pid: Optional[int] = None
    copies: Optional[cow.Copies] = None


def mean_delay(marks: Sequence[BatchMark]) -> Optional[float]:
    """The mean of the marks' run-queue waits; None unless the kernel told each one."""
    delays = [m.wait_delay_s for m in marks]
    known = [d for d in delays if d is not None]
    return None if not delays or len(known) < len(delays) else sum(known) / len(known)


def samples_in(batch: Any, default: int) -> int:
    """The batch's leading dimension (its first tensor's), else its ``len()``, else ``default``."""
    for tensor in iter_tensors(batch):
        return int(tensor.shape[0]) if tensor.dim() > 0 else default
    try:
        return len(batch)
    except TypeError:
        return default


def other_cpus(start: Optional[Reading], end: Optional[Reading]) -> Optional[float]:
    """The CPUs other processes kept busy between two readings, on average: the machine's busy time on this process's
    CPUs less this process's and its workers' CPU time, over the wall time; None when the machine's time was not
    read."""
    if start is None or end is None or start.machine_busy_s is None or end.machine_busy_s is None:
        return None
    wall = end.time - start.time
    if wall <= 0:
        return None
    own = end.main_cpu_s - start.main_cpu_s
    if start.workers is not None and end.workers is not None:
        own += max(0.0, end.workers.cpu_s - start.workers.cpu_s)
    return max(0.0, (end.machine_busy_s - start.machine_busy_s - own) / wall)
