"""Tuning inside the training loop: ``OnlineLoader`` is a DataLoader-like source whose first epoch is the trial, and
which searches again when the regime changes. ``PrefetchLoader`` wraps it as it wraps a DataLoader.

# NOTE [ Online switching ]
# While a search runs (``search.Search``, the same model-guided search as the trials), an epoch is served by a
# sequence of candidate DataLoaders, each over the next consecutive slice of that epoch's batch order
# (``slices.EpochSlicer``, NOTE [ Exact epochs across candidates ]): the loop gets exactly the batches the plain
# DataLoader would give for the epoch. Each candidate is one ``measure.run.Run`` (NOTE [ Trial timing ]) in
# ``mode="candidate"``: timed from the loop's own requests, patient with a slow step, with the host paced to the GPU.
# - Decisions flow one way. The run yields ``Measured`` when its window is complete; this loader hands it to the
#   search (``Steps.send``) and answers the run: serve on when the search chose this very configuration (no restart),
#   else stop. The search's ``TuneResult`` becomes the decision: the plain DataLoader is rebuilt with it (the old
#   one's persistent workers shut down), it goes to ``history`` and to the cache slot (``source="online"``).
# - Switching. The next candidate starts while the measured one serves the batches it holds in flight (NOTE [ Hidden
#   switch ] in handover.py); then the measured one is stopped in a helper thread (``procs.retire``; a failed
#   candidate is stopped at once, NOTE [ Process cleanup ]). A failed candidate's batches the loop did not get, and a
#   measured one's when the ranks cannot hide the switch, are re-issued to the next one. What the loop waited for while
#   candidates started and stopped is ``Decision.switch_s``. When the search ends, the rest of the epoch runs with the
#   choice; later epochs use the plain DataLoader with it (``mode="serve"``). A candidate the epoch's end cuts short
#   counts with what its window measured; one whose window had not opened yet goes on next epoch (``MAX_ATTEMPTS``).
# - Failures. Signals are guarded as in trials (NOTE [ Asynchronous exceptions ]), with worker deaths held until our
#   own code checks, so they never land in the user's step. A candidate whose workers die is recorded as failed
#   (``failures.classify``); its undelivered batches are re-issued, so no sample is lost or repeated. The user's own
#   exceptions (dataset, collate) and Ctrl-C surface unchanged after the candidate's workers are reaped.
# - Ranks. Under torch.distributed, every rank agrees after each candidate batch whether to stop (all windows
#   complete, or a candidate failed anywhere) before handing the batch out, so all ranks switch at the same batch
#   index; the search agrees on every figure (NOTE [ One decision across ranks ]).
# - Re-tuning (search/retune.py). After an epoch with the decision in force, ``retune`` compares its steady rate and
#   stall (``window.Tally``) with the decision's: when loading became the bottleneck or the epoch ran slower, the
#   next epoch searches again from the configuration in force either way (``Search(start=...)``); when it ran
#   faster, or hardly waited for data with more than one worker (once per decision), it tries only fewer workers
#   (``Search(start=..., descend=True)``): a decision taken cold keeps workers a warm epoch does not need.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Generator, Iterator, List, Optional, Tuple

from torch.utils.data import DataLoader

from ..cache.slot import Slot
from ..config import LoaderConfig, default_pin, make_config
from ..agreement import Agreement, Alone
from ..errors import TuningError, warn_user
from ..loader.native import worker_pools
from ..measure.consumer import Consumer
from ..measure.failures import classify, failure_reason
from ..measure.run import Measured, Run
from ..measure.window import samples_in
from ..probe import MachineProfile
from ..request import Request
from ..results import Decision, EpochTrace, TrialResult, TuneResult
from ..search.candidates import Candidate, Steps
from ..search.retune import retune
from ..search.search import Search
from .face import DataLoaderFace
from .handover import Stage, hand_over
from .slices import EpochSlicer, EpochSource

__all__ = ["EpochTrace", "OnlineLoader"]

log = logging.getLogger("autoloader.online")

MAX_ATTEMPTS = 2
"""Epochs a candidate may be cut short by the epoch's end before its window opened, before its partial measurement is
taken as it is (a window that opened and holds a few batches is taken at once, marked not steady)."""


class OnlineLoader(DataLoaderFace):
    """The epochs of one loader tuned in its own training loop (see NOTE [ Online switching ]): from scratch when
    ``decision`` is None, else re-tuning from it when an epoch's rate or stall moves away (``retune``)."""

    def __init__(self, request: Request, profile: MachineProfile, *, slot: Slot, decision: Optional[TuneResult],
                 retune: bool) -> None:
        self.request, self.profile, self.slot, self.retune = request, profile, slot, retune
        group = request.group
        self.agreement: Agreement = group.agreement() if group is not None else Alone()
        self.consumer = Consumer(None, request.device)
        self.history: List[Decision] = []
        self.traces: List[EpochTrace] = []
        self._overrides: dict = {}
        self.decision = decision or _undecided(request)
        self.plain = self._build(self.decision.config)
        self.in_force: DataLoader = self.plain
        self.slicer = EpochSlicer(self.plain)
        self._steps: Optional[Steps[TuneResult]] = None
        self._candidate: Optional[Candidate] = None
        self._last_run: Optional[Run] = None
        self._measured: List[TrialResult] = []
        self._next_epoch = self._epoch = self.attempts = 0
        self.search_s = self.switch_s = 0.0
        self.tuning_threads = False
        self.spanned = False
        """The search that made the decision in force measured candidates in more than one epoch (``search.retune``)."""
        self._search_epochs: set = set()
        self.epoch_source: Optional[EpochSource] = None
        """The redrawn epoch serving this epoch's slices; None while the plain DataLoader serves it (a checkpoint
        then counts its pulls from its configuration: NOTE [ Exact resume ] in loader/state.py)."""
        self.tried_fewer = False
        """The search that made the decision in force only tried fewer workers (``search.retune``): an epoch that
        hardly waits does not start another one."""
        if decision is None:
            self._start_search(None, why="no tuning for this dataset and machine yet")

    @property
    def tuning(self) -> TuneResult:
        return self.decision

    @property
    def decisions(self) -> Tuple[Decision, ...]:
        return tuple(self.history)

    @property
    def searching(self) -> bool:
        return self._steps is not None

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch (its decisions and trace say it)."""
        self._next_epoch = epoch

    # -- the epochs ---------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """One epoch of raw batches: candidates while searching, else the plain DataLoader (then maybe re-tune)."""
        self._epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        if not self.searching:
            return self._steady()
        return self._searching()

    def resume(self, source: EpochSource) -> Iterator[Any]:
        """The rest of an epoch that ``source`` (``slicer.epoch()``, fast-forwarded by ``skip``) holds: candidates
        while searching, else the decision (NOTE [ Exact resume ] in loader/state.py)."""
        self._epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self._searching(source)

    def _searching(self, source: Optional[EpochSource] = None) -> Iterator[Any]:
        source = source if source is not None else self.slicer.epoch()
        self.epoch_source = source
        trace = EpochTrace(self._epoch, time.perf_counter())
        if self.searching:
            self.traces.append(trace)
        staged: Optional[Stage] = None
        while not source.done:
            candidate = self._candidate
            stage = staged or self._stage(source, after=self._last_run)
            outcome, staged = yield from self._slice(source, stage, trace)
            if outcome is not None:
                self._advance(outcome)
            elif staged is None and candidate is not None and self._candidate is candidate:
                log.info("epoch %d ended before candidate %s was measured: it goes on next epoch", self._epoch,
                         candidate.config.label())
                break
            if candidate is None and staged is None:
                break
        if source.done:
            source.finish()  # the sampler asked past its end, as the plain DataLoader's epoch ends
        self.in_force = self.plain

    def _stage(self, source: EpochSource, after: Optional[Run]) -> Stage:
        """The next slice of ``source`` and its run: the search's candidate (measured) or the decision (served)."""
        candidate = self._candidate
        config = candidate.config if candidate is not None else self.decision.config
        part = source.take(None)
        part.expect(config.in_flight())
        try:
            loader = self._build(config, sampling=part.sampling(), generator=part.private_generator(), in_order=True,
                                 persistent_workers=False, measured=candidate is not None)
        except BaseException:
            part.delivered(0)
            raise
        run = Run(loader, config, mode="candidate" if candidate is not None else "serve", consumer=self.consumer,
                  batch_size=self.request.batch_size, limit_s=candidate.limit_s if candidate is not None else math.inf,
                  agreement=self.agreement)
        if after is not None:
            run.follows(after)
        return Stage(part, run, candidate)

    def _slice(self, source: EpochSource, stage: Stage,
               trace: EpochTrace) -> Generator[Any, None, Tuple[Optional[TrialResult], Optional[Stage]]]:
        """Serve ``stage``'s slice of the epoch. Returns what the search must still be told (a failure, a window the
        epoch's end cut short), else None; and the next stage, when a hidden switch started it (NOTE [ Hidden
        switch ] in handover.py)."""
        run, part, config, candidate = stage.run, stage.part, stage.config, stage.candidate
        init = run.loader.worker_init_fn  # its workers' native pools (``with_pools``), read after the run let go
        self.in_force, self._last_run = run.loader, run
        serving = span_start = time.perf_counter()
        rate, handed, error = None, False, None
        tail, following = False, None
        batches = iter(run)
        try:
            reply: Optional[bool] = None
            while not (tail and run.delivered >= (part.limit or 0)):
                item = batches.send(reply)  # type: ignore[arg-type]
                reply = None
                if isinstance(item, Measured):
                    handed, rate = True, item.result.samples_per_s
                    reply = self._measured_now(with_pools(item.result, init), config)
                    if reply:
                        span_start = trace.span(span_start, config, rate)
                    else:
                        tail, following = hand_over(source, stage, agreement=self.agreement, stage=self._stage)
                        reply = tail
                    continue
                trace.batches.append((time.perf_counter() - trace.start, samples_in(item, self.request.batch_size)))
                yield item
            run.stop()  # the tail is served: an orderly stop, before the generator closes
        except StopIteration:
            pass
        except BaseException as exc:  # noqa: B036 - classified below; GeneratorExit and Ctrl-C re-raised there
            error = exc
        finally:
            if following is not None and error is not None:
                following.abort(error)  # the later slice first: its batches go back behind the ones below
            batches.close()
            run.stop(error)  # done already, unless a Ctrl-C landed as the run's own cleanup began
            self.in_force = self.plain
            part.delivered(run.delivered)
            self.switch_s += run.switch_s
            self.search_s += time.perf_counter() - serving
        outcome = self._outcome(run, candidate if not handed else None, error, tail=tail)
        outcome = None if outcome is None else with_pools(outcome, init)
        trace.span(span_start, config, outcome.samples_per_s if outcome is not None and outcome.ok else rate)
        return outcome, following if error is None else None

    def _outcome(self, run: Run, candidate: Optional[Candidate], error: Optional[BaseException], *,
                 tail: bool) -> Optional[TrialResult]:
        reason = failure_reason(error, workers=run.config.num_workers) if error is not None and tail else None
        if reason is not None and not isinstance(error, TuningError):
            log.warning("candidate %s failed after it was measured, while serving its last batches (%s): they go to "
                        "the next candidate", run.config.label(), reason)
            return None
        if error is not None and candidate is None:
            raise error  # the configuration in force, measured no more: its errors reach the loop as a DataLoader's do
        if error is not None:
            return classify(error, run.config, user=run.user, threads_tuned=self.tuning_threads,
                            startup_s=run.startup_s, elapsed_s=run.elapsed, batch_bytes=run.window.batch_bytes)
        if candidate is None:
            return None
        unopened = run.ended and len(run.window.marks) - run.window.skip < 3  # the window never really opened
        if not isinstance(self.agreement, Alone):  # each rank's burst ends when its previous workers are reaped
            unopened = self.agreement.reduce_min([0.0 if unopened else 1.0])[0] == 0.0
        if unopened:
            self.attempts += 1
            if self.attempts < MAX_ATTEMPTS:
                return None
        return run.result

    def _steady(self) -> Iterator[Any]:
        """An epoch with the decision in force, served by the plain DataLoader, then maybe a re-tune."""
        self.epoch_source = None
        run = Run(self.plain, self.decision.config, mode="serve", consumer=self.consumer,
                  batch_size=self.request.batch_size, owned=False)
        try:
            yield from run
        finally:
            run.stop()
        if self.retune:
            self._after_epoch(*run.rate_and_stall)

    def _after_epoch(self, rate: Optional[float], stall: Optional[float]) -> None:
        if not isinstance(self.agreement, Alone):
            low, high = self.agreement.reduce_min([-1.0 if rate is None else rate,
                                                   -(stall if stall is not None else -1.0)])
            rate, stall = (None if low < 0 else low), (None if -high < 0 else -high)
        last = self.history[-1] if self.history else None
        again = retune(decided_samples_per_s=self.decision.samples_per_s, num_workers=self.decision.config.num_workers,
                       decided_stall=last.stall_fraction if last else _stall_of(self.decision),
                       epoch_samples_per_s=rate, epoch_stall=stall, tried_fewer=self.tried_fewer,
                       spanned=self.spanned)
        log.debug("epoch %d with %s: %s samples/s, stall %s; decided %s samples/s", self._epoch,
                  self.decision.config.label(), rate, stall, self.decision.samples_per_s)
        if again is not None:
            log.info("epoch %d: %s; searching again from %s%s", self._epoch, again.why, self.decision.config.label(),
                     " (fewer workers only)" if again.down else "")
            self._start_search(self.decision.config, why=again.why, down=again.down)

    # -- the search ---------------------------------------------------------------------------------------------
    def _build(self, config: LoaderConfig, **forced: Any) -> DataLoader:
        return self.request.data_loader(config, **{**forced, **self._overrides})

    def _start_search(self, start: Optional[LoaderConfig], *, why: str, down: bool = False) -> None:
        """Search from ``start`` (None: from scratch); ``down``: only fewer workers than ``start`` are tried."""
        self._why, self.tried_fewer = why, down
        self._measured, self.search_s, self.switch_s, self._search_epochs = [], 0.0, 0.0, set()
        search = Search(self.request, self.profile, budget=math.inf, agreement=self.agreement, start=start,
                        descend=down)
        self.tuning_threads = search.tune_threads
        self._steps = search.steps()
        self._candidate = self._send(None)

    def _send(self, outcome: Optional[TrialResult]) -> Optional[Candidate]:
        """The search's next candidate after ``outcome``; None when it decided (``decision`` is then set)."""
        if self._steps is None:
            raise RuntimeError("no search is running")
        try:
            return next(self._steps) if outcome is None else self._steps.send(outcome)
        except StopIteration as done:
            self._decide(done.value)
        except TuningError as err:
            warn_user(f"autoloader could not tune online ({err}); keeping {self.decision.config.label()}")
            self._steps = None
        return None

    def _advance(self, outcome: TrialResult) -> None:
        self.attempts = 0
        self._measured.append(outcome)
        self._search_epochs.add(self._epoch)
        self._candidate = self._send(outcome)

    def _measured_now(self, result: TrialResult, config: LoaderConfig) -> bool:
        """A candidate's complete measurement, handed over before it stops: True when the search decided on
        ``config`` itself, so that the candidate in force serves on."""
        self._advance(result)
        return self._steps is None and self._candidate is None and self.decision.config.same_candidate(config)

    def _decide(self, result: TuneResult) -> None:
        result = result.with_source("online")
        group = self.request.group
        result = group.broadcast(result) if group is not None else result
        self._steps, self._candidate = None, None
        self.spanned = len(self._search_epochs) > 1
        previous, self.decision = self.plain, result
        if getattr(previous, "_iterator", None) is not None:
            previous._iterator = None  # persistent workers of the old configuration: shut down
        self.plain = self._build(result.config)
        self.slicer = EpochSlicer(self.plain)
        chosen = next((t for t in reversed(self._measured) if t.ok and t.config.same_candidate(result.config)), None)
        self.history.append(Decision(self._epoch, result.config, result.samples_per_s,
                                     chosen.stall_fraction if chosen else None, f"{self._why}: {result.reason}",
                                     len(self._measured), self.search_s, self.switch_s))
        log.info("decided online: %s, %s samples/s", result.config.label(),
                 "-" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}")
        self.slot.store(result)


def with_pools(result: TrialResult, init: Any) -> TrialResult:
    """A candidate's measurement with the native pools its workers reported through ``init``, its DataLoader's
    ``worker_init_fn`` (``native.worker_pools``)."""
    return dataclasses.replace(result, native_pools=worker_pools(init))


def _stall_of(result: TuneResult) -> Optional[float]:
    chosen = next((t for t in result.trials if t.ok and t.config.same_candidate(result.config)), None)
    return chosen.stall_fraction if chosen else None


def _undecided(request: Request) -> TuneResult:
    config = make_config(0, fixed=request.fixed, pin_memory=default_pin(request.fixed, request.device.type),
                         threads=request.fixed_threads)
    return TuneResult(config, None, None, "online", reason="deciding online during the first epoch")
