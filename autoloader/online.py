"""Tuning inside the training loop: the first epoch is the trial, and the loader re-tunes when the regime changes.

# NOTE [ Online switching ]
# ``OnlineTuner.epoch()`` is what ``PrefetchLoader`` iterates instead of a fixed DataLoader. While a search runs
# (``_search.Search``, the same model-guided search as the trials), the epoch is served by a sequence of candidate
# DataLoaders, each over the next consecutive slice of that epoch's batch order (``slices.EpochSlicer``, NOTE [ Exact
# epochs across candidates ]): the loop gets exactly the batches a plain DataLoader would give for the epoch.
# - Timing. Each candidate is measured by a ``Window`` (NOTE [ Trial timing ]) from the loop's own calls: the time
#   inside our ``next()`` is waiting for data, the time between our batch and the loop's next request is its step
#   (PrefetchLoader asks one batch ahead, so that is the step on the batch before). On CUDA the host may lead the
#   GPU by two steps (an event per request), and the device is synchronised when a window opens and closes, so an
#   asynchronous step counts at the GPU's pace. A slow step never cuts a candidate before it is measured
#   (``Window.complete(patient=True)``).
# - Switching. A measured candidate is stopped: its iterator is handed to a helper thread that drops it and reaps its
#   workers (``_procs.retire``: the orderly shutdown takes a few hundred ms that the next candidate's start-up now
#   overlaps; a failed candidate is stopped at once, in the loop's thread, NOTE [ Process cleanup ]); the batches its
#   workers prefetched but the loop did not get are re-issued to the next one, and the next starts.
#   Stopping and the next candidate's start-up are timed apart (``Decision.switch_s``). When the search ends, the
#   rest of the epoch runs with the choice; later epochs use a plain DataLoader with it. A candidate the epoch's end
#   cuts short counts with what its window measured (not steady); one whose window had not opened yet goes on next
#   epoch.
# - Failures. Signals are guarded as in trials (NOTE [ Asynchronous exceptions ]), with worker deaths held until our
#   own code checks, so they never land in the user's step. A candidate whose workers die is abandoned and recorded
#   as failed; its undelivered batches are re-issued, so no sample is lost or repeated. The user's own exceptions
#   (dataset, collate) and Ctrl-C surface unchanged after the candidate's workers are reaped.
# - Ranks. Under torch.distributed, every rank agrees after each candidate batch whether to stop (all windows
#   complete, or a candidate failed anywhere) before handing the batch out, so all ranks switch at the same batch
#   index; the search agrees on every figure (NOTE [ One decision across ranks ]).
# - Re-tuning. After an epoch with the decision in force, ``policy.retune_reason`` compares its steady rate and stall
#   with the decision's; when they moved, the next epoch searches again from the configuration in force and its
#   neighbours (``Search(start=...)``). Every decision goes to ``history`` and to the cache (``source="online"``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, List, Optional, Tuple

from torch.utils.data import DataLoader

from . import _procs
from ._consumer import Consumer
from ._failures import failure_reason, thread_failure
from ._search import Agreement, Alone, Candidate, Search, Steps
from ._signals import SignalGuard
from ._window import Window, samples_in
from .errors import TuningError, warn_user
from .policy import retune_reason
from .prefetch import quiet_worker_count_warning
from .results import Decision, LoaderConfig, TrialResult, TuneResult
from .slices import EpochSlicer, EpochSource

log = logging.getLogger("autoloader.online")

_END = object()
MAX_ATTEMPTS = 2
"""Epochs a candidate may be cut short by the epoch's end before its window opened, before its partial measurement is
taken as it is (a window that opened and holds a few batches is taken at once, marked not steady)."""


@dataclass
class EpochTrace:
    """One epoch that searched: when each batch reached the loop, and each candidate's span (for ``plot``)."""

    epoch: int
    start: float
    batches: List[Tuple[float, int]] = field(default_factory=list)
    """(seconds since the epoch started, samples) per batch handed to the loop."""
    spans: List[Tuple[float, float, str, Optional[float]]] = field(default_factory=list)
    """(start s, end s, label, samples/s measured or None) per candidate, the decision's last."""


class OnlineTuner:
    """The configuration search of one loader, run in its own training loop (see NOTE [ Online switching ]).

    ``build(config)`` makes the plain DataLoader for a configuration; ``new_search(start)`` a ``Search`` (from the
    serial configuration when ``start`` is None); ``store(result)`` keeps a decision (the cache).
    """

    def __init__(self, *, slicer: EpochSlicer, batch_size: int, consumer: Consumer,
                 build: Callable[[LoaderConfig], DataLoader], new_search: Callable[[Optional[LoaderConfig]], Search],
                 store: Callable[[TuneResult], None], decision: Optional[TuneResult], retune: bool,
                 dataset_for: Callable[[LoaderConfig], Any], agreement: Optional[Agreement] = None,
                 share: Callable[[TuneResult], TuneResult] = lambda result: result, threads: int = 1) -> None:
        self.slicer, self.batch_size, self.consumer = slicer, batch_size, consumer
        self.share = share
        """Rank 0's decision on every rank (identity in one process)."""
        self.agreement: Agreement = agreement or Alone()
        self.build, self.new_search, self.store, self.retune = build, new_search, store, retune
        self.dataset_for = dataset_for
        self.history: List[Decision] = []
        self.traces: List[EpochTrace] = []
        self.decision = decision or _undecided(consumer, threads)
        self.plain = build(self.decision.config)
        self.in_force: DataLoader = self.plain
        self._steps: Optional[Steps[TuneResult]] = None
        self._candidate: Optional[Candidate] = None
        self._attempts = 0
        self._measured: List[TrialResult] = []
        self._search_s = self._switch_s = 0.0
        self._tuning_threads = False
        if decision is None:
            self._start_search(None, why="no tuning for this dataset and machine yet")

    @property
    def searching(self) -> bool:
        return self._steps is not None

    # -- the epochs ---------------------------------------------------------------------------------------------
    def epoch(self, number: int) -> Iterator[Any]:
        """One epoch of raw batches: candidates while searching, else the plain DataLoader (then maybe re-tune)."""
        if not self.searching:
            yield from self._steady(number)
            return
        source = self.slicer.epoch()
        trace = EpochTrace(number, time.perf_counter())
        self.traces.append(trace)
        while not source.done:
            candidate = self._candidate
            config = candidate.config if candidate is not None else self.decision.config
            outcome = yield from self._serve(source, config, candidate, trace, number)
            if outcome is not None:
                self._advance(outcome, epoch=number)
            elif candidate is not None and self._candidate is candidate:
                log.info("epoch %d ended before candidate %s was measured: it goes on next epoch", number,
                         candidate.config.label())
                break
            if candidate is None:
                break
        self.in_force = self.plain

    def _steady(self, number: int) -> Iterator[Any]:
        """An epoch with the decision in force, timed in steady state for the re-tune check."""
        config = self.decision.config
        self.in_force = self.plain
        skip = config.num_workers * (config.prefetch_factor or 0) + config.num_workers + 1
        waited = span_start = 0.0
        samples = count = 0
        with quiet_worker_count_warning(True):
            it = iter(self.plain)
        while True:
            asked = time.perf_counter()
            batch = next(it, _END)
            got = time.perf_counter()
            if batch is _END:
                break
            count += 1
            if count == skip:
                span_start = got
            elif count > skip:
                waited += got - asked
                samples += samples_in(batch, self.batch_size)
            yield batch
        del it
        span = time.perf_counter() - span_start if count > skip + 2 else 0.0
        self._after_epoch(number, samples / span if span > 0 else None, waited / span if span > 0 else None)

    def _after_epoch(self, number: int, rate: Optional[float], stall: Optional[float]) -> None:
        if not self.retune:
            return
        if not isinstance(self.agreement, Alone):
            low, high = self.agreement.reduce_min([-1.0 if rate is None else rate,
                                                   -(stall if stall is not None else -1.0)])
            rate, stall = (None if low < 0 else low), (None if -high < 0 else -high)
        last = self.history[-1] if self.history else None
        why = retune_reason(decided_samples_per_s=self.decision.samples_per_s,
                            decided_stall=last.stall_fraction if last else _stall_of(self.decision),
                            epoch_samples_per_s=rate, epoch_stall=stall)
        if why is not None:
            log.info("epoch %d: %s; searching again from %s", number, why, self.decision.config.label())
            self._start_search(self.decision.config, why=why)

    # -- the search ---------------------------------------------------------------------------------------------
    def _start_search(self, start: Optional[LoaderConfig], *, why: str) -> None:
        self._why = why
        self._measured, self._search_s, self._switch_s = [], 0.0, 0.0
        search = self.new_search(start)
        self._tuning_threads = search.tune_threads
        self._steps = search.steps()
        self._candidate = self._send(None)

    def _send(self, outcome: Optional[TrialResult]) -> Optional[Candidate]:
        """The search's next candidate after ``outcome``; None when it decided (``decision`` is then set)."""
        assert self._steps is not None
        try:
            return next(self._steps) if outcome is None else self._steps.send(outcome)
        except StopIteration as done:
            self._decide(done.value)
        except TuningError as err:
            warn_user(f"autoloader could not tune online ({err}); keeping {self.decision.config.label()}")
            self._steps = None
        return None

    def _advance(self, outcome: TrialResult, *, epoch: int) -> None:
        self._attempts = 0
        self._measured.append(outcome)
        self._epoch = epoch
        self._candidate = self._send(outcome)

    def _decide(self, result: TuneResult) -> None:
        result = self.share(replace(result, source="online"))
        self._steps, self._candidate = None, None
        previous, self.decision = self.plain, result
        if previous is not None and getattr(previous, "_iterator", None) is not None:
            previous._iterator = None  # persistent workers of the old configuration: shut down
        self.plain = self.build(result.config)
        chosen = next((t for t in reversed(self._measured) if t.ok and _same_knobs(t.config, result.config)), None)
        self.history.append(Decision(getattr(self, "_epoch", 0), result.config, result.samples_per_s,
                                     chosen.stall_fraction if chosen else None, f"{self._why}: {result.reason}",
                                     len(self._measured), self._search_s, self._switch_s))
        log.info("decided online: %s, %s samples/s", result.config.label(),
                 "-" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}")
        self.store(result)

    # -- one candidate over the next slice ------------------------------------------------------------------------
    def _serve(self, source: EpochSource, config: LoaderConfig, candidate: Optional[Candidate],
               trace: EpochTrace, epoch: int) -> Iterator[Any]:
        """Serve batches from ``config`` over the rest of the epoch. A candidate serves until its window is measured:
        the search then takes the measurement at once and, when it decides on this very configuration, the same
        loader serves on to the epoch's end (no restart). Returns a measurement the caller must still hand to the
        search (a failure, a window cut short by the epoch's end), else None."""
        started = span_start = time.perf_counter()
        before = _procs.child_pids()
        part = source.take(None)
        with quiet_worker_count_warning(True):
            loader = self.slicer.loader(part, config.num_workers, config.prefetch_factor,
                                        pin_memory=config.pin_memory, dataset=self.dataset_for(config))
        self.in_force = loader
        window = Window(config, started=started, batch_size=self.batch_size, min_window_s=0.5, min_rounds=3,
                        min_batches=6)
        deadline = started + (candidate.limit_s if candidate is not None else float("inf"))
        alone = isinstance(self.agreement, Alone)
        measuring = candidate is not None
        delivered, error, ended, span_rate, handed = 0, None, False, None, False
        previous: Optional[Tuple[Any, float, float, float, float]] = None
        guard = SignalGuard(hold_worker_errors=True)
        with guard:
            try:
                with quiet_worker_count_warning(True):
                    it = iter(loader)
                while True:
                    t_ask, c_ask = time.perf_counter(), time.process_time()
                    if measuring and previous is not None:
                        self.consumer.pace()
                        window.add(previous[0], t_ask=previous[1], c_ask=previous[2], t_got=previous[3],
                                   c_got=previous[4], consumer=self.consumer)
                        t_ask, c_ask = time.perf_counter(), time.process_time()
                    complete = measuring and window.complete(deadline=deadline, patient=True)
                    if complete and alone:  # decided before fetching: no batch to re-issue
                        span_rate, handed = self._measured_complete(window, started, epoch), True
                        if not self._continues(config):
                            break
                        measuring, complete, span_start = False, False, self._split_span(trace, span_start, config,
                                                                                          span_rate)
                    failure: Optional[BaseException] = None
                    batch: Any = _END
                    try:
                        batch = next(it, _END)
                        guard.check()
                    except BaseException as exc:  # noqa: B036 - classified below, re-raised if not ours
                        failure = exc
                    if measuring and not alone:  # ranks agree on stopping before anyone hands the batch out
                        stop, failed_elsewhere = _agree(self.agreement, complete=complete, failed=failure is not None)
                        if failed_elsewhere and failure is None:
                            failure = TuningError("a candidate failed on another rank")
                        if stop and failure is None:
                            span_rate, handed = self._measured_complete(window, started, epoch), True
                            if not self._continues(config):
                                break  # the batch just fetched is not handed out: re-issued
                            measuring, span_start = False, self._split_span(trace, span_start, config, span_rate)
                    if failure is not None:
                        raise failure
                    if batch is _END:
                        ended = True
                        break
                    t_got, c_got = time.perf_counter(), time.process_time()
                    if window.startup_s is None:
                        window.first_batch(batch, t_got, workers=_procs.new_children(before) if measuring else (),
                                           memory=False)
                        self._switch_s += t_got - started
                    delivered += 1
                    trace.batches.append((t_got - trace.start, samples_in(batch, self.batch_size)))
                    previous = (batch, t_ask, c_ask, t_got, c_got)
                    yield batch
                if measuring:
                    self.consumer.synchronize()
                    window.close()
            except BaseException as exc:  # noqa: B036 - the loop's own errors, GeneratorExit, Ctrl-C: re-raised
                error = exc
            finally:
                stopping = time.perf_counter()
                with guard.shield():
                    previous = batch = None
                    workers = _procs.new_children(before)
                    self.in_force = self.plain
                    references = [it, loader]
                    it = loader = None  # noqa: F841 - the only references left are in ``references``
                    if error is None:
                        _procs.retire(references, workers)
                    else:
                        _procs.terminate(workers)
                        _procs.drop(references)
                        _procs.reap(workers)
                    part.delivered(delivered)
                ended_at = time.perf_counter()
                self._switch_s += ended_at - stopping
                self._search_s += ended_at - started
        result = self._outcome(config, None if handed else candidate, window, error, ended, ended_at - started)
        if result is not None and result.ok:
            span_rate = result.samples_per_s
        trace.spans.append((span_start - trace.start, ended_at - trace.start, config.label(), span_rate))
        return result

    def _measured_complete(self, window: Window, started: float, epoch: int) -> Optional[float]:
        """The candidate's window is complete: hand its measurement to the search now (it may decide)."""
        self.consumer.synchronize()
        window.close()
        result = window.result(time.perf_counter() - started)
        self._advance(result, epoch=epoch)
        return result.samples_per_s if result.ok else None

    def _continues(self, config: LoaderConfig) -> bool:
        """The search decided on ``config`` itself: the candidate in force serves on."""
        return self._steps is None and self._candidate is None and _same_knobs(self.decision.config, config)

    @staticmethod
    def _split_span(trace: EpochTrace, start: float, config: LoaderConfig, rate: Optional[float]) -> float:
        now = time.perf_counter()
        trace.spans.append((start - trace.start, now - trace.start, config.label(), rate))
        return now

    def _outcome(self, config: LoaderConfig, candidate: Optional[Candidate], window: Window,
                 error: Optional[BaseException], ended: bool, elapsed: float) -> Optional[TrialResult]:
        if error is not None and candidate is None:
            raise error  # the configuration in force, measured no more: its errors reach the loop as a DataLoader's do
        if error is not None:
            reason = failure_reason(error, workers=config.num_workers) if not isinstance(error, TuningError) \
                else str(error)
            if reason is None and candidate is not None and self._tuning_threads and config.threads > 1 \
                    and isinstance(error, Exception):
                return thread_failure(config, error)  # its undelivered batches were re-issued: nothing is lost
            if reason is None or isinstance(error, (GeneratorExit, KeyboardInterrupt, SystemExit)):
                raise error
            log.info("online candidate %s failed: %s", config.label(), reason)
            return TrialResult(config=config, status="failed", reason=reason, startup_s=window.startup_s,
                               elapsed_s=elapsed, batch_bytes=window.batch_bytes)
        if candidate is None:
            return None
        if ended and len(window.marks) - window.skip < 3:  # the window never really opened: measure it again
            self._attempts += 1
            if self._attempts < MAX_ATTEMPTS:
                return None
        return window.result(elapsed)


def _agree(agreement: Any, *, complete: bool, failed: bool) -> Tuple[bool, bool]:
    """(stop, failed on another rank): stop when every rank's window is complete or any rank's candidate failed."""
    if isinstance(agreement, Alone):
        return complete, False
    all_complete, none_failed = agreement.reduce_min([1.0 if complete else 0.0, 0.0 if failed else 1.0])
    anyone_failed = none_failed == 0.0
    return bool(all_complete) or anyone_failed, anyone_failed and not failed


def _same_knobs(a: LoaderConfig, b: LoaderConfig) -> bool:
    """The same candidate, whatever ``persistent_workers`` the decision set."""
    return (a.num_workers, a.prefetch_factor, a.threads) == (b.num_workers, b.prefetch_factor, b.threads)


def _stall_of(result: TuneResult) -> Optional[float]:
    chosen = next((t for t in result.trials if t.ok and _same_knobs(t.config, result.config)), None)
    return chosen.stall_fraction if chosen else None


def _undecided(consumer: Consumer, threads: int = 1) -> TuneResult:
    return TuneResult(0, None, consumer.device.type == "cuda", False, None, None, "online",
                      reason="deciding online during the first epoch", threads=threads)
