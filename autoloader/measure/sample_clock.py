"""The first samples of an online epoch, timed as the main process loads them: a batch's cost is known a few samples
into the first batch, so the prior's workers can start while the main process finishes it (NOTE [ Online
convergence ], 1., in search/online_policy.py).

A ``SampleClock`` wraps the index lists a probe's slice hands its DataLoader (``BatchSlice.through``): torch's
fetcher iterates a batch's indices one sample at a time (``[dataset[i] for i in indices]``), so the time between two
indices is one sample's ``__getitem__``. Nothing else changes: the dataset gets the same ints, in the same order, from
the same process. A ``__getitems__`` that walks the indices (``torch.utils.data.Subset``'s) is timed the same way;
one that takes the whole batch at once (an Arrow ``take``) reads as nearly free samples, so the prior does not start
early, and a batch of fewer than ``MIN_SAMPLES`` samples is not timed: the probe's batches tell the cost instead, a
batch later.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple

from .cpuclock import cpu_and_delay, spent

__all__ = ["BatchEstimate", "MIN_SAMPLES", "SampleClock", "times_samples"]

log = logging.getLogger("autoloader.online")

MIN_SAMPLES = 4
"""Samples timed before a batch's cost is estimated (the first one alone may include what the dataset does once)."""


@dataclass(frozen=True)
class BatchEstimate:
    """A batch's loading cost in the main process, extrapolated from its first samples: ``fetch_s`` wall seconds,
    ``fetch_cpu_s`` CPU seconds (this process's, native threads included) and ``fetch_delay_s`` seconds of waiting for
    a CPU (run queue; None where the kernel does not say: ``cpuclock``) per batch of ``samples``."""

    fetch_s: float
    fetch_cpu_s: float
    fetch_delay_s: Optional[float]
    samples: int


def times_samples(loader: Any) -> bool:
    """Whether ``loader`` fetches its batches in this process (no workers): only then does a ``SampleClock`` time
    its samples."""
    return getattr(loader, "num_workers", 1) == 0


class SampleClock:
    """Times the first ``MIN_SAMPLES`` samples of the batches it wraps, once: then calls ``on_estimate`` with the
    ``BatchEstimate`` (on the loop's thread, inside the fetch of the batch being loaded) and stops timing."""

    def __init__(self, on_estimate: Callable[[BatchEstimate], None]) -> None:
        self.on_estimate = on_estimate
        self.done = False

    def wrap(self, indices: Any) -> Any:
        """``indices`` (one batch's, as the slice hands them out), timed while the clock still runs."""
        if self.done or not isinstance(indices, list) or len(indices) < MIN_SAMPLES:
            return indices
        return _TimedIndices(indices, self)

    def _report(self, walls: List[float], cpus: List[float], delays: List[Optional[float]], samples: int) -> None:
        if self.done:
            return
        self.done = True
        wall, cpu = statistics.median(walls[1:]), statistics.median(cpus[1:])
        known = [d for d in delays[1:] if d is not None]
        delay = statistics.median(known) * samples if len(known) == len(delays) - 1 else None
        estimate = BatchEstimate(wall * samples, cpu * samples, delay, samples)
        log.debug("first samples: %.2f ms each (%.0f%% CPU): a batch of %d about %.1f ms", 1e3 * wall,
                  100 * cpu / wall if wall > 0 else 0.0, samples, 1e3 * estimate.fetch_s)
        self.on_estimate(estimate)


class _TimedIndices(list):
    """A batch's indices whose iteration notes when each sample's ``__getitem__`` ended (the next index asked)."""

    def __init__(self, indices: List[Any], clock: SampleClock) -> None:
        super().__init__(indices)
        self._clock = clock

    def __iter__(self) -> Iterator[Any]:
        walls: List[float] = []
        cpus: List[float] = []
        delays: List[Optional[float]] = []
        count = len(self)
        last: Optional[Tuple[float, Tuple[float, Optional[float]]]] = None
        for index in list.__iter__(self):
            now = (time.perf_counter(), cpu_and_delay())
            if last is not None and len(walls) < MIN_SAMPLES:
                cpu, delay = spent(last[1], now[1])
                walls.append(now[0] - last[0])
                cpus.append(cpu)
                delays.append(delay)
                if len(walls) == MIN_SAMPLES:
                    self._clock._report(walls, cpus, delays, count)
            last = now
            yield index
