"""One online epoch as an explicit state machine (``EpochScheduler``): which run serves each slice, when a
candidate's measurement is complete and what happens then, as NOTE [ Online epoch scheduler ] in phases.py says; the
search behind it (``online_search.OnlineSearch``) answers as ``plan.Plan``."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Generator, Optional, Tuple

from ..coordination import Coordinator
from ..errors import TuningError
from ..loader.slices import BatchSlice, EpochSource
from ..measure.failures import CONTROL, classify, failure_reason, forget
from ..measure.run import END, Run, of_a_batch
from ..measure.sample_clock import BatchEstimate, SampleClock, times_samples
from ..supervise.signals import SignalGuard
from ..measure.marks import samples_in
from ..results import EpochTrace, TrialResult
from ..search.switching import repays, repays_next_epoch, window_bound_s
from .handover import Stage, tail_extra
from .phases import transition
from .plan import Plan

log = logging.getLogger("autoloader.online")

Build = Callable[[EpochSource, Optional[Run], Callable[[int], float]], Stage]
"""The next stage over the source's next slice, after the run that served before it (its window waits for it), its
window bounded to the seconds the given function names for its worker count."""


class EpochScheduler:
    """Serves one epoch of ``source`` (``batches()``), stage after stage, as NOTE [ Online epoch scheduler ] says.
    ``in_force``: the DataLoader serving the loop's current batch."""

    def __init__(self, source: EpochSource, *, plan: Plan, build: Build, coordinator: Coordinator,
                 trace: EpochTrace, after: Optional[Run] = None) -> None:
        self.source, self.plan, self.build, self.coordinator, self.trace = source, plan, build, coordinator, trace
        self.last: Optional[Run] = after
        self.in_force: Any = None
        self.started: Optional[Stage] = None
        """The stage a switch started (its workers run while this one serves its tail), until it serves."""
        self.guard = SignalGuard(hold_worker_errors=True)
        self.kept: Optional[Tuple[Run, BatchSlice]] = None
        """The run (and its closed slice) that served the decision, or a candidate carried to the next epoch, to the
        epoch's end with persistent workers, left running for the next epochs (NOTE [ Online switching ])."""
        self._pace: Optional[float] = None
        """Seconds per batch expected before the loop got two (a probe's estimate over the prior's workers)."""

    def batches(self) -> Generator[Any, None, None]:
        with self.guard:  # NOTE [ Online epoch scheduler ]: between two stages, a worker of the one started may die
            try:
                while not self.source.done:
                    stage, self.started = self.started or self._build(), None
                    phase = yield from self._serve(stage)
                    if phase == "done" or (stage.candidate is None and self.started is None):
                        break
            except BaseException as exc:  # noqa: B036 - re-raised; a Ctrl-C between two stages stops both
                self._abort_started(exc)
                raise
            if self.source.done:
                self.source.finish()  # the sampler asked past its end, as the plain DataLoader's epoch ends
            self.in_force = None

    # -- the epoch's clock -------------------------------------------------------------------------------------------
    def _per_batch_s(self, workers: int = 0) -> Optional[float]:
        """Seconds per batch the loop got this epoch so far; before two, a probe's estimate, or the one batch served
        (in the main process) over the ``workers`` of the stage to come: they make that many batches in its time at
        most (None without either)."""
        batches = self.trace.batches
        if len(batches) >= 2:
            return (batches[-1][0] - batches[0][0]) / (len(batches) - 1)
        if self._pace is not None or not batches:
            return self._pace
        return batches[0][0] / max(1, workers)

    def _remaining_s(self) -> Optional[float]:
        """The rest of the epoch at its pace so far; None when unknown (no pace yet, a sampler without a length)."""
        per_batch, left = self._per_batch_s(), self.source.unclaimed
        return None if per_batch is None or left is None else per_batch * left

    def _epoch_s(self, workers: int = 0) -> Optional[float]:
        """A whole epoch at its pace so far (before the loop got two batches, at the pace ``workers`` could serve);
        None when unknown."""
        per_batch, left = self._per_batch_s(workers), self.source.remaining
        return None if per_batch is None or left is None else per_batch * (left + len(self.trace.batches))

    def _bound_s(self, workers: int = 0) -> float:
        """The window bound of the next stage (of ``workers``): a share of the epoch as predicted now (the epoch's
        first candidate after a probe of one slow batch had the longest bound, 4 s, and measured 9 workers for 2 s of
        a 4 s epoch)."""
        return window_bound_s(self._epoch_s(workers))

    def _build(self) -> Stage:
        return self.build(self.source, self.last, self._bound_s)

    # -- one stage ---------------------------------------------------------------------------------------------------
    def _serve(self, stage: Stage) -> Generator[Any, None, str]:
        """One stage's slice, through its phases; returns the phase it ended in (a switch leaves the stage it started
        in ``started``)."""
        run, batch_slice = stage.run, stage.batch_slice
        phase = "measuring" if stage.candidate is not None else "serving"
        self.in_force, self.last = run.serving.loader, run
        self._time_first_samples(stage)
        began = span_start = time.perf_counter()
        error: Optional[BaseException] = None
        unopened, told = False, None
        try:
            with run.guarded():
                while phase not in ("next", "done"):
                    if phase == "tail" and run.record.delivered >= (batch_slice.limit or 0):
                        phase = transition(phase, "tail-served")
                        break
                    run.request()
                    if phase == "measuring" and run.complete():
                        run.measure()
                        if not self.coordinator.agrees_per_batch:
                            phase, span_start = self._decide_alone(stage, span_start)
                            if phase == "next":
                                break
                    batch, failure = run.fetch()
                    if isinstance(failure, Exception) and self._of_a_batch(stage, failure):
                        batch, failure = run.passed(failure), None  # handed out; the epoch goes on
                    if phase == "measuring" and stage.early:
                        phase = transition(phase, "early-switch")
                    if phase == "measuring":
                        event, failure, unopened = self._measured(stage, batch, failure)
                        if event is not None:
                            phase = transition(phase, event)
                            if phase == "serving":
                                span_start = self._span(span_start, stage)
                            if phase == "next":
                                run.give_back()  # the batch just fetched is not handed out: it is re-issued
                                break
                    if failure is not None:
                        raise failure
                    if batch is END:
                        run.finish()
                        phase = transition(phase, "ended")
                        break
                    self.trace.batches.append((time.perf_counter() - self.trace.start,
                                               samples_in(batch, run.window.batch_size)))
                    yield batch
                told = self._end(stage, phase, unopened=unopened)
        except BaseException as exc:  # noqa: B036 - classified below; GeneratorExit and Ctrl-C re-raised there
            error = exc
        finally:
            self._close(stage, error, cost_s=time.perf_counter() - began)
        if isinstance(error, CONTROL):
            try:  # raised as they are; no local keeps it (its traceback holds this frame: a cycle through the runs)
                raise error
            finally:
                del error
        outcome = self._after(stage, error, phase=phase) if error is not None else told
        if error is not None:  # classified and kept from the loop (a raise above would have left)
            forget(error)
        rate = outcome if outcome is not None else run.result
        self.trace.span(span_start, stage.config, rate.samples_per_s if rate is not None and rate.ok else None)
        return "next" if error is not None else phase

    def _close(self, stage: Stage, error: Optional[BaseException], *, cost_s: float) -> None:
        """A stage's slice ended (``error``: how, if it raised): the started stage aborted, the slice told what it
        delivered, the stage's cost recorded."""
        run, batch_slice = stage.run, stage.batch_slice
        batch_slice.through = None
        if error is not None:  # the run stopped already, unless a Ctrl-C landed as its own cleanup began
            self._abort_started(error, also=run)  # the later slice first: its batches go back behind this one's
        self.in_force = None
        batch_slice.delivered(run.record.delivered)
        self._record_start(run)
        self.plan.record_cost(switch_s=run.record.switch_s, serving_s=cost_s)

    def _record_start(self, run: Run) -> None:
        self.plan.record_start(forked=run.record.forked, start_s=run.record.started_s)

    def _of_a_batch(self, stage: Stage, error: BaseException) -> bool:
        """The dataset's or ``collate_fn``'s error from one batch, which the loop gets in its place (NOTE [ A batch that
        raises ] in loader/source.py), the epoch going on; not when threads are tuned and the candidate has several (a
        dataset that is not thread-safe: the candidate's failure)."""
        if self.plan.threads_tuned and stage.candidate is not None and stage.config.threads > 1:
            return False
        return of_a_batch(error)

    def _measured(self, stage: Stage, batch: Any, failure: Optional[BaseException]
                  ) -> Tuple[Optional[str], Optional[BaseException], bool]:
        """After a measuring stage's batch (its window told when it was the one upon which the slice's last batch was
        drawn): the ranks agree (``Coordinator.batch``) whether its window is complete
        everywhere or a candidate failed anywhere; returns the event that follows (None: measure on), the failure to
        raise, and whether the window had not opened on some rank."""
        run, batch_slice = stage.run, stage.batch_slice
        if failure is None and batch is not END and batch_slice.drawn_all:
            run.window.last_drawn()  # NOTE [ Trial timing ], 6. in measure/run.py
        verdict = self.coordinator.batch(complete=run.result is not None, failed=failure is not None,
                                         opened=run.window.opened(),
                                         in_flight=batch_slice.pulled - run.record.delivered,
                                         last=_ends_in_tail(self.source, stage))
        if verdict.failed_elsewhere and failure is None:
            failure = TuningError("a candidate failed on another rank")
        event = None
        if verdict.stop and failure is None and batch is not END:
            event = self._decide(stage, same_tail=verdict.same_tail)
        return event, failure, verdict.unopened

    def _time_first_samples(self, stage: Stage) -> None:
        """A probe's first samples are timed as they load, for the prior's early start (``_early``)."""
        if stage.candidate is not None and stage.candidate.probe and self.plan.probes_samples and \
                times_samples(stage.run.serving.loader):
            stage.batch_slice.through = SampleClock(lambda estimate: self._early(stage, estimate)).wrap

    def _decide_alone(self, stage: Stage, span_start: float) -> Tuple[str, float]:
        """A single process's move once a window is complete, as the loop asks for the next batch and before it is
        loaded (NOTE [ Online epoch scheduler ]): the phase that follows, and where the stage's span of serving
        starts."""
        phase = transition("measuring", self._decide(stage, same_tail=True))
        if phase == "serving":
            span_start = self._span(span_start, stage)
        if phase != "next":
            stage.run.request()  # a switch's forks are not a wait for the batch asked for
        return phase, span_start

    def _end(self, stage: Stage, phase: str, *, unopened: bool) -> Optional[TrialResult]:
        """A stage that handed out its batches: stopped (orderly; under the guard: a worker's death held), unless it
        served the decision to the epoch's end with persistent workers, which serve the next epochs (``kept``). A
        candidate whose window the epoch's end cut short is told first (returned), so that a decision on this very
        configuration keeps its workers; unless its window never opened (on some rank) and it goes on next epoch: its
        persistent workers are kept for it too (the next epoch measures it without forking them again)."""
        run, told, carried = stage.run, None, False
        if phase == "done" and stage.candidate is not None and not stage.reported:
            if unopened and self.plan.retry_next_epoch():
                log.info("the epoch ended before candidate %s was measured: it goes on next epoch",
                         stage.config.label())
                carried = True
            elif run.result is not None:
                told = stage.with_pools(run.result)
                self.plan.tell(told, epoch=self.trace.epoch)
                stage.reported = True
        if phase == "done" and (carried or self.plan.keeps(stage.config)) and \
                getattr(run.serving.loader, "persistent_workers", False):
            run.serving.release()
            self.kept = (run, stage.batch_slice)
        else:
            run.stop()
        return told

    def _abort_started(self, error: BaseException, *, also: Optional[Run] = None) -> None:
        """A failure or Ctrl-C: the stage a switch started stops, then ``also`` (each DataLoader's workers told to stop,
        stragglers terminated: NOTE [ Process cleanup ], 2.), in the epoch guard's shield (its workers dying as they
        stop are no later stage's failure)."""
        started, self.started = self.started, None
        with self.guard.shield():
            if started is not None:
                started.abort(error)
            if also is not None:
                also.stop(error)

    def _early(self, stage: Stage, estimate: BatchEstimate) -> None:
        """The probe's first samples (called inside its first batch's fetch, on the loop's thread): when the search
        says so, the prior's stage starts now and the probe serves the batch being loaded as its tail."""
        if stage.reported or self.started is not None or stage.run.record.delivered:
            return
        candidate = self.plan.early(estimate, epoch=self.trace.epoch)
        if candidate is None:
            return
        self._pace = estimate.fetch_s / max(1, candidate.config.num_workers)
        stage.reported = stage.early = True
        self._start_next(stage, extra=0)

    def _decide(self, stage: Stage, *, same_tail: bool) -> str:
        """The candidate's window is complete (every rank's): the search is told; the event that follows: the run
        serves on (keep), measures on (again), serves its tail while the next stage starts (switch), serves the rest of
        the epoch (defer) or stops now (the ranks' tails differ)."""
        run = stage.run
        result = run.result
        if result is None:
            raise RuntimeError("a candidate's window was agreed complete before it was measured")
        self._record_start(run)  # the switch weighed below counts what starting this run cost
        self.plan.tell(stage.with_pools(result), epoch=self.trace.epoch)
        stage.reported = True
        if self.plan.keeps(stage.config):
            return "keep"
        if result.status == "skipped":  # stopped at its first batch for the memory budget: no tail beside the next
            return "plain-switch"
        following = self.plan.candidate
        if following is not None and following.config == stage.config and not run.config.num_workers:
            run.measure_again(bound_s=self._bound_s())
            stage.reported, stage.candidate = False, following
            return "again"
        gain = self.plan.switch_gain(result) if following is not None else 0.0
        if following is not None and self.coordinator.size == 1 and not repays(
                remaining_s=self._remaining_s(), gain=gain, workers=following.config.num_workers,
                window_s=self._bound_s(), fork_s=self.plan.fork_s):
            if not repays_next_epoch(epoch_s=self._epoch_s(), gain=gain, workers=following.config.num_workers,
                                     fork_s=self.plan.fork_s) and self.plan.settle(result, epoch=self.trace.epoch):
                log.info("a switch to %s would not repay itself over a whole epoch either: %s serves on, decided",
                         following.config.label(), stage.config.label())
                return "keep"
            log.info("the rest of the epoch is too short to repay a switch to %s: it goes first next epoch",
                     following.config.label())
            return "defer"
        if not same_tail:
            log.info("the ranks' candidates hold different numbers of batches in flight: switching without a tail")
            return "plain-switch"
        if self.coordinator.size == 1 and not self.plan.fits_beside(result):
            return "plain-switch"  # both pools at once would pass the memory budget (logged by the plan)
        self._start_next(stage, extra=tail_extra(stage.config))
        return "switch"

    def _start_next(self, stage: Stage, *, extra: int) -> None:
        """Cap ``stage``'s slice ``extra`` batches past what its DataLoader pulled, and start the next stage over what
        follows (NOTE [ Hidden switch ]); nothing starts when the tail ends the epoch."""
        stage.batch_slice.cap(extra)
        stage.run.serving.keep_workers()
        if self.source.unclaimed == 0:
            return  # the tail ends the epoch: nothing to start
        self.started = self._build()
        self.started.run.start()  # an Exception is kept by the run (its failure, measured as such); a Ctrl-C stops both

    def _after(self, stage: Stage, error: BaseException, *, phase: str) -> Optional[TrialResult]:
        """What the search must still be told once a stage ended in ``error`` (its failure: returned), and the errors
        the loop must see raised (NOTE [ Online epoch scheduler ])."""
        run = stage.run
        if phase == "tail":
            reason = failure_reason(error, workers=run.config.num_workers)
            if reason is not None and not isinstance(error, TuningError):
                transition("tail", "failed")
                log.warning("candidate %s failed after it was measured, while serving its last batches (%s): they go "
                            "to the next candidate", run.config.label(), reason)
                return None
        if stage.candidate is None or stage.reported:
            raise error  # the configuration in force, measured no more: its errors reach the loop as a DataLoader's
        transition("measuring", "failed")
        record = run.record
        failed = classify(error, run.config, user=record.user, threads_tuned=self.plan.threads_tuned,
                          startup_s=record.startup_s, elapsed_s=record.elapsed, batch_bytes=run.window.batch_bytes)
        self.plan.tell(stage.with_pools(failed), epoch=self.trace.epoch)
        return failed

    def _span(self, start: float, stage: Stage) -> float:
        result = stage.run.result
        return self.trace.span(start, stage.config, result.samples_per_s if result is not None and result.ok else None)


def _ends_in_tail(source: EpochSource, stage: Stage) -> bool:
    """No batch is left for another stage once this one's tail is served."""
    left = source.unclaimed
    return left is not None and left <= tail_extra(stage.config)
