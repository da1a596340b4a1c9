"""A candidate's timed window: what each batch cost, what the workers did, and the ``TrialResult`` they make (its
records are marks.py's; an epoch served by the configuration in force is counted by tally.py's ``Tally``).

``run.Run`` drives the loop; this module only records and computes, following NOTE [ Trial timing ] in run.py. The
window's constants are defined here and nowhere else; the start-up burst it skips is ``LoaderConfig.burst_batches``.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Literal, Optional, Protocol, Sequence, Tuple

from ..config import LoaderConfig
from ..loader.batch import batch_nbytes
from ..loader.epochs import stall_fraction
from ..results import TrialResult
from ..supervise.procs import WorkerTracker
from . import cow, window_rule
from .cpuclock import machine_busy_s, spent
from .marks import BatchMark, Edges, Reading, mean_delay, other_cpus, samples_in
from .window_rule import MIN_OPENED, window_open

Rule = Literal["trial", "candidate", "probe"]
"""How a window opens and closes: a trial's fixed rule (NOTE [ Trial timing ] in run.py), an online candidate's
(``window_rule``: drained, then confident or at its bound), or the first batches of an online epoch (``probe``: the
cost of a batch and of the step, from ``PROBE_MARKS`` batches, for the prior: NOTE [ Online convergence ])."""
Clocks = Tuple[float, Optional[float]]
"""``cpuclock.cpu_and_delay()``: process CPU seconds, the thread's run-queue seconds (None: not known)."""


class MemoryCheck(Protocol):
    """The search's ``memory.MemoryCheck`` (a candidate's ``memory``): (config, one worker's USS at the first batch
    (the mean of those read), the batch's bytes) -> why it must stop, or None; ``census``: read which pages a worker
    copies (``cow``)."""

    @property
    def census(self) -> bool:
        ...

    def __call__(self, config: LoaderConfig, uss_bytes: Optional[int], batch_bytes: Optional[int]) -> Optional[str]:
        ...


SAMPLE_EVERY_S = 0.1
"""How often the workers' counters are read during a trial, so a worker that exits keeps most of its figures."""
MIN_WINDOW_S = 0.5
"""A window spans at least this long ..."""
MIN_ROUNDS = 3
"""... and at least this many waves of ``num_workers`` batches ..."""
MIN_BATCHES = 6
"""... and at least this many batches (see NOTE [ Trial timing ] in run.py)."""
PROBE_MARKS = 3
"""Batches a probe window holds: the first batch's cost alone would include whatever the dataset does once ..."""
PROBE_ONE_S = 0.05
"""... unless loading it took this long: a batch that slow is measured well enough by itself, and each more serial
batch would cost as much again."""


@dataclass(frozen=True)
class WindowSpec:
    """How a window opens and closes: its ``rule`` (``Rule``), and for a candidate's the ``bound_s`` seconds it closes
    at, unless its rate is known within half the ``tolerance`` sooner (``window_rule``)."""

    rule: Rule = "trial"
    bound_s: float = math.inf
    tolerance: float = 0.05


class Window:
    """Everything one candidate measures, batch by batch (see NOTE [ Trial timing ] in run.py)."""

    def __init__(self, config: LoaderConfig, *, started: float, batch_size: int, min_window_s: float = MIN_WINDOW_S,
                 min_rounds: int = MIN_ROUNDS, min_batches: int = MIN_BATCHES,
                 settled: Optional[Callable[[], bool]] = None, spec: Optional["WindowSpec"] = None) -> None:
        """``settled``: the window opens only once it says True (the previous run's workers are reaped, NOTE
        [ Trial timing ], 5. in run.py); the burst is extended a batch at a time until then. ``spec``: how it opens
        and closes (``WindowSpec``; None: a trial's)."""
        n = config.num_workers
        spec = spec or WindowSpec()
        self.settled = settled
        self.config, self.started, self.batch_size, self.min_window_s = config, started, batch_size, min_window_s
        self.rule, self.bound_s, self.tolerance = spec.rule, spec.bound_s, spec.tolerance
        self.skip = config.burst_batches()
        self.need = max(min_batches, min_rounds * n) if spec.rule == "trial" else MIN_OPENED
        self.marks: List[BatchMark] = []
        self.startup_s: Optional[float] = None
        self.batch_bytes: Optional[int] = None
        self.edges = Edges(started, begun=Reading(started, time.process_time(), None, machine_busy_s())
                           if spec.rule == "probe" else None)
        self.exhausted = False
        self.drawn_at: Optional[int] = None
        """The index of the mark whose batch the loader got as it drew the last batch of its slice (``last_drawn``):
        the batches after it come from a pipeline nobody refills, and a candidate's window ends with it (NOTE [ Trial
        timing ], 6. in run.py)."""
        self.memory_check: Optional[MemoryCheck] = None
        """The memory budget the workers face at their first batch (set by the driver: ``Candidate.memory``)."""
        self.over_budget: Optional[str] = None
        """Why the candidate stopped at its first batch (``memory.first_batch_check``): the window is then complete
        at once and its result "skipped" (NOTE [ Memory budget ] in search/memory.py)."""

    def first_batch(self, batch: Any, t_got: float, *, workers: Sequence[Any], memory: bool = True) -> None:
        """The first batch arrived: start-up is over; start tracking ``workers`` (their memory too, for the budget's
        check and their growth during the window: reading it costs 2-20 ms per worker, so ``procs.MEMORY_SAMPLE`` of
        them are read)."""
        self.startup_s = t_got - self.started
        self.batch_bytes = batch_nbytes(batch)
        if workers:
            self.edges.tracker = WorkerTracker(workers)
            self.edges.memory_start = self.edges.tracker.sample(memory=memory)
            if self.memory_check is not None:
                self.over_budget = self.memory_check(self.config, self.edges.memory_start.mean_uss, self.batch_bytes)
            census = self.memory_check is not None and self.memory_check.census
            if census and memory and self.over_budget is None and len(workers) >= 2:  # cow.py: not one worker
                self.edges.census_pid = workers[0].pid
                self.edges.census = cow.take(workers[0].pid)

    def add(self, batch: Any, *, t_ask: float, c_ask: Clocks, t_got: float, c_got: Clocks, consumer: Any,
            c_done: Optional[Clocks] = None) -> None:
        """Record a batch the consumer has finished; the batch that opens the window first waits for the device.
        ``c_ask``/``c_got``/``c_done``: ``cpuclock.cpu_and_delay()`` when the batch was asked for, when it came and
        when the loop asked for the next one (its step over; None: now)."""
        if self.rule == "candidate" and self.edges.opened is None:
            self._open_early(t_ask, t_got)
        if len(self.marks) + 1 == self.skip and self.settled is not None and not self.settled():
            self.skip += 1
        if len(self.marks) + 1 == self.skip:
            consumer.synchronize()
        t_done = time.perf_counter()
        cpu, delay = spent(c_ask, c_got)
        step_cpu = (c_done[0] if c_done is not None else time.process_time()) - c_got[0]
        self.marks.append(BatchMark(t_done, samples_in(batch, self.batch_size), t_got - t_ask, cpu, t_done - t_got,
                                    delay, max(0.0, step_cpu)))
        if len(self.marks) == self.skip:
            tracker = self.edges.tracker
            self.edges.opened = Reading(time.perf_counter(), time.process_time(),
                                       tracker.sample(memory=False) if tracker else None, machine_busy_s())
        elif self.edges.tracker is not None and t_done - self.edges.tracker.last_sampled >= SAMPLE_EVERY_S:
            self.edges.tracker.sample(memory=False)

    def last_drawn(self) -> None:
        """The batch just fetched (not yet marked) is the one upon whose arrival the loader drew the last batch of its
        slice: an online candidate with workers counts no batch after it (NOTE [ Trial timing ], 6. in run.py)."""
        if self.drawn_at is None and self.rule == "candidate" and self.config.num_workers:
            self.drawn_at = len(self.marks)

    def _counted(self) -> int:
        """How many marks a window may count: all, or those up to ``drawn_at``."""
        return len(self.marks) if self.drawn_at is None else min(len(self.marks), self.drawn_at + 1)

    def _open_early(self, t_ask: float, t_got: float) -> None:
        """An online candidate's window opens at the batch being marked, before the whole burst, when the loop waited
        for it past the batches in flight at the start (the queue is drained) or when ``bound_s`` passed since every
        worker handed out its first batch (a loop that never waits is served at the step's pace): ``window_rule``. Not
        before: forked one after the other, the workers start apart, and a wait among their first batches says nothing
        of the queue; nor at a wait among the batches in flight at the start: the loop waits for one worker's batch
        while the others' prefetched ones are ready, and the window then counted them at memory speed (6 workers read
        771 samples/s where they ran 620, 25 read 2,572 where the data's service admits 1,657). (Not later either: 64
        workers hold 128 batches in flight, most of a 150-batch epoch, whose candidate would then be started again in
        the next epoch.)"""
        index, first_wave = len(self.marks), max(1, self.config.num_workers)
        if index < first_wave or index + 1 >= self.skip:
            return
        waited = index >= self.config.in_flight() and window_rule.drained([t_got - t_ask], first_wave=0) is not None
        if waited or t_got - self.marks[first_wave - 1].done >= self.bound_s:
            self.skip = index + 1

    def complete(self, *, deadline: float, patient: bool = False) -> bool:
        """Enough waves and seconds after the window opened, or the soft limit reached. ``patient``: the limit ends
        the window only once it has opened and holds a few batches (online, a slow training step must not cut a
        candidate before it is measured). A candidate's window: confident or at its bound (``window_rule``); a
        probe's: ``PROBE_MARKS`` batches, or one that took ``PROBE_ONE_S`` to load; one whose workers' memory at their
        first batch is over the budget: at once."""
        if self.over_budget is not None:
            return True
        if not self.marks:
            return False
        if self.rule == "probe":
            return len(self.marks) >= PROBE_MARKS or self.marks[0].wait_s >= PROBE_ONE_S
        last = self.marks[-1].done
        in_window = len(self.marks) - self.skip
        if last >= deadline and (not patient or self.opened()):
            return True
        if self.rule == "candidate":
            if not self.opened():
                return False
            if self.drawn_at is not None and len(self.marks) > self.drawn_at:
                return True
            done, chunk = [m.done for m in self.marks[self.skip - 1:]], self._chunk()
            if (len(done) - 1) % chunk:  # mid-wave: the batches of a wave come together, close at a wave's start
                return False
            return last - done[0] >= self.bound_s or window_rule.confident(done, chunk=chunk,
                                                                           tolerance=self.tolerance)
        return in_window >= self.need and last - self.marks[self.skip - 1].done >= self.min_window_s

    def _chunk(self) -> int:
        """Batches per chunk of a confidence estimate, and a window's granularity: a wave of the workers when the loop
        waits for them (their batches then come in waves: a window of whole waves measures their rate), else one (the
        step's pace)."""
        n = self.config.num_workers
        waits = [m.wait_s for m in self.marks[self.skip:]]
        return n if n > 1 and window_rule.drained(waits, first_wave=0) is not None else 1

    def opened(self) -> bool:
        """The window holds at least ``MIN_OPENED`` batches past the start-up burst."""
        return self._counted() - self.skip >= MIN_OPENED

    def close(self) -> None:
        """Read the counters at the window's end (after the device caught up)."""
        self.edges.end = time.perf_counter()
        if self.edges.opened is not None:
            tracker = self.edges.tracker
            self.edges.closed = Reading(self.edges.end, time.process_time(), tracker.sample() if tracker else None,
                                        machine_busy_s())
            if self.edges.census is not None and self.edges.census_pid is not None:
                last = cow.take(self.edges.census_pid)
                self.edges.copies = cow.copied(self.edges.census, last) if last is not None else None
        elif self.edges.begun is not None:
            self.edges.closed = Reading(self.edges.end, time.process_time(), None, machine_busy_s())

    def result(self, elapsed: float) -> TrialResult:
        if self.over_budget is not None:
            return self._stopped(elapsed)
        if self.rule == "probe":
            return self._probe_result(elapsed)
        config, marks = self.config, self.marks[:self._counted()]
        opened = window_open(len(marks), self.skip, self.config.num_workers)
        if opened is None:
            return TrialResult(config=config, status="failed", startup_s=self.startup_s, elapsed_s=elapsed,
                               batch_bytes=self.batch_bytes, steady=False,
                               reason=f"only {len(marks)} batches within the trial's time limit; too few to measure "
                                      f"a rate")
        if len(marks) < len(self.marks):  # the pipeline drained after it: end at a whole wave, if one fits
            chunk = self._chunk()
            marks = marks[:len(marks) - (len(marks) - 1 - opened) % chunk] if len(marks) - 1 - opened >= chunk \
                else marks
        window_marks = marks[opened + 1:]
        batches = len(window_marks)
        last = max(self.edges.end, marks[-1].done) if len(marks) == len(self.marks) else marks[-1].done
        span = last - marks[opened].done
        wait = sum(m.wait_s for m in window_marks)
        rate = sum(m.samples for m in window_marks) / span
        if config.num_workers and opened < self.skip - 1:
            # Cut inside the start-up burst: its batches were made while the workers started, so the window's rate
            # overstates the steady one; count from the trial's start instead (see NOTE [ Trial timing ], 4.).
            rate = min(rate, sum(m.samples for m in marks) / max(1e-9, last - self.started))
        result = TrialResult(
            config=config,
            samples_per_s=rate,
            batches=batches,
            window_s=span,
            startup_s=self.startup_s,
            elapsed_s=elapsed,
            stall_fraction=stall_fraction(wait, span),
            fetch_s_per_batch=wait / batches,
            fetch_cpu_s_per_batch=sum(m.wait_cpu_s for m in window_marks) / batches,
            fetch_delay_s_per_batch=mean_delay(window_marks),
            consumer_s_per_batch=sum(m.step_s for m in window_marks) / batches,
            consumer_cpu_s_per_batch=sum(m.step_cpu_s for m in window_marks) / batches,
            batch_bytes=self.batch_bytes,
            steady=opened == self.skip - 1 and batches >= self.need and not self.exhausted,
            drained=self._drained(marks[opened:]),
            **self._worker_fields(span, batches),
        )
        return result

    def _drained(self, marks: Sequence[BatchMark]) -> Optional[bool]:
        """``TrialResult.drained`` of a candidate's window with workers: whether the loop waited for one of ``marks``
        (the window's opening batch and those after it); None for a trial's window or without workers."""
        if self.rule != "candidate" or not self.config.num_workers:
            return None
        return window_rule.drained([m.wait_s for m in marks], first_wave=0) is not None

    def _probe_result(self, elapsed: float) -> TrialResult:
        """The first batches' costs, each the median of the batches it holds (``PROBE_MARKS``: the first batch alone
        may include what the dataset does once; or one slow batch): loading and step seconds per batch, not a steady
        rate."""
        marks = self.marks
        if not marks:  # the epoch ended first (or its batches raised)
            return TrialResult(config=self.config, status="failed", startup_s=self.startup_s, elapsed_s=elapsed,
                               steady=False, reason="no batch was measured: the epoch ended first")
        fetch = statistics.median(m.wait_s for m in marks)
        step = statistics.median(m.step_s for m in marks)
        samples = statistics.median(m.samples for m in marks)
        return TrialResult(config=self.config, samples_per_s=samples / max(1e-9, fetch + step), batches=len(marks),
                           window_s=marks[-1].done - self.started, startup_s=self.startup_s, elapsed_s=elapsed,
                           stall_fraction=stall_fraction(fetch, fetch + step), fetch_s_per_batch=fetch,
                           fetch_cpu_s_per_batch=statistics.median(m.wait_cpu_s for m in marks),
                           fetch_delay_s_per_batch=mean_delay(marks), consumer_s_per_batch=step,
                           consumer_cpu_s_per_batch=statistics.median(m.step_cpu_s for m in marks),
                           other_cpus=other_cpus(self.edges.begun, self.edges.closed),
                           batch_bytes=self.batch_bytes, steady=False)

    def _stopped(self, elapsed: float) -> TrialResult:
        """The result of a candidate stopped at its first batch for the memory budget: what its workers measured."""
        memory = self.edges.memory_start
        return TrialResult(config=self.config, status="skipped", reason=self.over_budget, startup_s=self.startup_s,
                           elapsed_s=elapsed, batch_bytes=self.batch_bytes, steady=False,
                           worker_rss_bytes=memory.max_rss if memory is not None else None,
                           worker_uss_bytes=memory.mean_uss if memory is not None else None,
                           worker_uss_total_bytes=memory.uss_total if memory is not None else None)

    def _worker_fields(self, span: float, batches: int) -> dict:
        start, end = self.edges.opened, self.edges.closed
        if start is None or end is None:
            return {}
        probed = max(1e-9, end.time - start.time)
        fields: dict = {"main_cpu_util": (end.main_cpu_s - start.main_cpu_s) / probed,
                        "other_cpus": other_cpus(start, end)}
        n = self.config.num_workers
        if not n or start.workers is None or end.workers is None:
            return fields
        per_batch = span / (probed * batches)
        cpu = max(0.0, end.workers.cpu_s - start.workers.cpu_s)
        first_uss = self.edges.memory_start.uss_by_pid if self.edges.memory_start is not None else {}
        growth = [uss - first_uss[pid] for pid, uss in end.workers.uss_by_pid.items() if pid in first_uss]
        read = (None if end.workers.read_bytes is None or start.workers.read_bytes is None
                else max(0, end.workers.read_bytes - start.workers.read_bytes))
        fields.update(
            worker_cpu_util=cpu / (probed * n),
            read_bytes_per_batch=None if read is None else read * per_batch,
            worker_rss_bytes=end.workers.max_rss,
            worker_uss_bytes=end.workers.mean_uss,
            worker_uss_growth_bytes=max(growth) if growth else None,
            worker_uss_total_bytes=end.workers.uss_total,
        )
        copies = self.edges.copies
        if copies is not None:
            fields.update(worker_copied_bytes=copies.copied_bytes, worker_copied_run_bytes=copies.run_bytes,
                          worker_copy_span_bytes=copies.span_bytes, worker_shared_bytes=copies.shared_bytes)
        return fields
