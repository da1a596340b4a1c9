"""Fakes that drive the online epoch scheduler (tuning/scheduler.py) without processes or clocks: runs over real
slices of an epoch that say when their window is complete and what they measured, a search that names scripted
candidates, and ``serve`` (one epoch: what the loop got, the runs, the moves). tests/tuning/test_scheduler.py and
tests/properties/test_scheduler_contract.py use them."""
from __future__ import annotations

import collections
import contextlib
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from torch.utils.data import DataLoader

from autoloader.config import LoaderConfig
from autoloader.coordination import BatchVerdict, Coordinator
from autoloader.search.capacity import FORK_S
from autoloader.loader.slices import EpochSlicer, EpochSource
from autoloader.measure.run import END
from autoloader.supervise.signals import SignalGuard
from autoloader.results import EpochTrace, TrialResult
from autoloader.tuning import scheduler as scheduler_module
from autoloader.tuning.handover import Stage
from autoloader.tuning.phases import TRANSITIONS
from autoloader.supervise.serving import Record
from autoloader.tuning.scheduler import EpochScheduler

BATCHES = 40
"""Batches of 2 indices in the epoch ``serve`` serves."""

@dataclass
class Window:
    batch_size: Optional[int] = 1
    skip: int = 0
    batch_bytes: Optional[int] = None
    marks: List[int] = field(default_factory=list)
    drawn_at: Optional[int] = None
    """As ``measure.window.Window.drawn_at``: marks held when the scheduler said the slice was drawn."""

    def opened(self) -> bool:
        return len(self.marks) - self.skip >= 3

    def last_drawn(self) -> None:
        if self.drawn_at is None:
            self.drawn_at = len(self.marks)


class FakeServing:
    """No process behind it: nothing to signal."""

    stopped = False
    persistent = False
    """Whether its DataLoader keeps its workers past the epoch (``persistent_workers``)."""

    def __init__(self, config: LoaderConfig) -> None:
        self.loader = types.SimpleNamespace(label=f"DataLoader({config.label()})", persistent_workers=self.persistent)
        self.processes = types.SimpleNamespace(current=list)
        self.released = False

    def keep_workers(self) -> None:
        pass

    def release(self) -> None:
        """As ``Serving.release``: the run lets its workers serve on past it."""
        self.released = True


class FakeRun:
    """A run over its slice that holds ``config.in_flight()`` batches ahead (as a DataLoader's workers do), whose
    window is complete after ``measure_after`` batches, and which fails with ``fail`` at batch ``fail_at``."""

    def __init__(self, batch_slice: Any, config: LoaderConfig, *, rate: float, measure_after: Optional[int],
                 fail_at: Optional[int] = None, fail: Optional[BaseException] = None,
                 guard: Optional[SignalGuard] = None, over_budget: bool = False, plan: Any = None) -> None:
        self.batch_slice, self.config, self.rate, self.guard = batch_slice, config, rate, guard
        self.over_budget = over_budget
        self.plan = plan
        self.measure_after, self.fail_at, self.fail = measure_after, fail_at, fail
        self.record, self.window, self.serving = Record(), Window(), FakeServing(config)
        self.result: Optional[TrialResult] = None
        self.measuring = measure_after is not None
        self.stopped: Optional[str] = None
        self._it = None
        self._ahead: Deque[Any] = collections.deque()

    def guarded(self):
        """A real guard, worker deaths held, when it has one (as ``Run.guarded``): signals are then real too."""
        return self.guard if self.guard is not None else contextlib.nullcontext()

    def start(self) -> None:
        if self._it is None:
            self._it = iter(self.batch_slice)
            self.record.forked, self.record.start_s = self.config.num_workers, 0.01 * self.config.num_workers

    def request(self) -> None:
        if self.measuring:
            self.window.marks.append(self.record.delivered)

    def complete(self) -> bool:
        return self.measuring and self.measure_after is not None and self.record.delivered >= self.measure_after

    def measure(self) -> TrialResult:
        self.result = TrialResult(self.config, status="skipped", reason="memory: stopped at its first batch") \
            if self.over_budget else TrialResult(self.config, samples_per_s=self.rate, batches=self.record.delivered)
        self.measuring = False
        return self.result

    def fetch(self) -> Tuple[Any, Optional[BaseException]]:
        self.start()
        while len(self._ahead) < self.config.in_flight() + 1:
            batch = next(self._it, END)
            if batch is END:
                break
            self._ahead.append(batch)
        if self.fail_at is not None and self.record.delivered == self.fail_at:
            return END, self.fail
        if not self._ahead:
            return END, None
        if self.guard is not None:
            try:
                self.guard.check()  # as ``Serving.next`` does after each batch: a worker's death it held
            except RuntimeError as exc:
                return END, exc
        self.record.delivered += 1
        return self._ahead.popleft(), None

    def give_back(self) -> None:
        self.record.delivered -= 1

    def measure_again(self, *, bound_s: float) -> None:
        """The scripted search named this configuration again: its next step's window counts from now."""
        step = self.plan.candidate if self.plan is not None else None
        after = step.measure_after if step is not None else None
        self.measure_after = None if after is None else self.record.delivered + after
        self.measuring, self.result = True, None

    def finish(self) -> None:
        if self.measuring and self.window.opened():
            self.measure()

    def stop(self, error: Optional[BaseException] = None) -> None:
        if self.stopped is None:
            self.stopped = "failed" if error is not None else "orderly"


@dataclass
class Step:
    """One candidate the scripted search names: its configuration and what its fake run does (a ``Candidate`` as the
    scheduler reads it: ``config``, ``probe``, ``gain``)."""

    workers: int
    rate: float
    measure_after: Optional[int] = 6
    fail_at: Optional[int] = None
    over_budget: bool = False
    """Its window is complete at the first batch, "skipped" for the memory budget (NOTE [ Memory budget ])."""
    probe: bool = False
    gain: float = 0.0
    too_big_beside: bool = False
    """Its workers would pass the memory budget beside the previous candidate's serving their tail (``fits_beside``
    False: the switch to it is not hidden)."""

    @property
    def config(self) -> LoaderConfig:
        return config_of(self.workers)


class ScriptedPlan:
    """A search that names ``steps`` in order, then decides on ``decide`` (workers)."""

    threads_tuned = False
    probes_samples = False
    fork_s = FORK_S

    def __init__(self, steps: Sequence[Step], decide: int) -> None:
        self.steps, self.decide = list(steps), LoaderConfig(decide, 2) if decide else LoaderConfig(0)
        self.told: List[Tuple[int, str]] = []
        self.carried = 0
        self.starts: List[Tuple[int, float]] = []
        """(workers forked, seconds the loop waited for them) of each start the scheduler recorded."""
        self.after_stage: Callable[[float], None] = lambda serving_s: None
        """Called as each stage ends, after its guard exited (where the scheduler's own code runs), with the seconds
        it served."""

    @property
    def candidate(self) -> Optional[Step]:
        return self.steps[0] if self.steps else None

    def tell(self, outcome: TrialResult, *, epoch: int) -> None:
        self.told.append((outcome.config.num_workers, outcome.status))
        self.steps.pop(0)

    def early(self, estimate: Any, *, epoch: int) -> None:
        return None

    def fits_beside(self, result: TrialResult) -> bool:
        return not (self.steps and self.steps[0].too_big_beside)

    def switch_gain(self, result: TrialResult) -> float:
        return self.steps[0].gain if self.steps else 0.0

    def settle(self, result: TrialResult, *, epoch: int) -> bool:
        return False

    def keeps(self, config: LoaderConfig) -> bool:
        return not self.steps and config.same_candidate(self.decide)

    def retry_next_epoch(self) -> bool:
        self.carried += 1
        return True

    def record_start(self, *, forked: int, start_s: float) -> None:
        self.starts.append((forked, start_s))

    def record_cost(self, *, switch_s: float, serving_s: float) -> None:
        self.after_stage(serving_s)


class Agreeing(Coordinator):
    """One process that moves as ranks do (agreeing after each measured batch, ``agrees_per_batch``), except that the
    ranks' tails never match when ``same_tail`` is False."""

    def __init__(self, *, same_tail: bool = True) -> None:
        super().__init__()
        self.same_tail = same_tail

    @property
    def agrees_per_batch(self) -> bool:
        return True

    def batch(self, **kwargs: Any) -> BatchVerdict:
        verdict = super().batch(**kwargs)
        return BatchVerdict(verdict.stop, verdict.failed_elsewhere, self.same_tail and verdict.same_tail,
                            verdict.unopened)


def config_of(workers: int) -> LoaderConfig:
    return LoaderConfig(workers, 2) if workers else LoaderConfig(0)


def serve(plan: ScriptedPlan, *, coordinator: Optional[Coordinator] = None, monkeypatch: Any,
          guarded: bool = False, repays: Any = True) -> Dict[str, Any]:
    """One epoch of ``BATCHES`` batches of 2 indices served by the scheduler: what the loop got, the stages, the moves.
    ``guarded``: each run has a real signal guard, worker deaths held (else none); ``repays``: whether every switch
    repays itself before the epoch ends (``switching.repays``: the fake epoch lasts microseconds), or the function
    that says so."""
    moves: List[Tuple[str, str]] = []

    def recording(phase: str, event: str) -> str:
        moves.append((phase, event))
        return TRANSITIONS[(phase, event)]

    monkeypatch.setattr(scheduler_module, "transition", recording)
    monkeypatch.setattr(scheduler_module, "repays", repays if callable(repays) else lambda **_: repays)
    source = EpochSlicer(DataLoader(list(range(2 * BATCHES)), batch_size=2)).epoch()
    runs: List[FakeRun] = []

    def build(epoch: EpochSource, after: Optional[FakeRun], bound_s: Callable[[int], float]) -> Stage:
        step = plan.candidate
        config = config_of(step.workers) if step is not None else plan.decide
        batch_slice = epoch.take(None)
        batch_slice.expect(config.in_flight())
        run = FakeRun(batch_slice, config, rate=step.rate if step else 0.0,
                      measure_after=step.measure_after if step else None, fail_at=step.fail_at if step else None,
                      fail=RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.") if step else None,
                      guard=SignalGuard(hold_worker_errors=True) if guarded else None,
                      over_budget=step.over_budget if step else False, plan=plan)
        runs.append(run)
        return Stage(batch_slice, run, step)

    epoch = EpochScheduler(source, plan=plan, build=build, coordinator=coordinator or Coordinator(),
                           trace=EpochTrace(0, 0.0))
    got: List[int] = []
    error: Optional[BaseException] = None
    try:
        for batch in epoch.batches():
            got.extend(int(i) for i in batch)
    except (RuntimeError, KeyboardInterrupt) as exc:  # the configuration in force failing, as a DataLoader's would
        error = exc
    return {"got": got, "runs": runs, "moves": moves, "source": source, "error": error, "kept": epoch.kept}
