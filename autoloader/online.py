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
from dataclasses import replace
from typing import Any, Callable, Iterator, List, Optional

from torch.utils.data import DataLoader

from ._consumer import Consumer
from ._search import Agreement, Alone, Candidate, Search, Steps
from ._serving import END, EpochTrace, serve
from ._window import samples_in
from .errors import TuningError, quiet_worker_count_warning, warn_user
from .policy import retune_reason
from .results import Decision, LoaderConfig, TrialResult, TuneResult
from .slices import EpochSlicer

__all__ = ["EpochTrace", "OnlineTuner"]

log = logging.getLogger("autoloader.online")


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
        self.attempts = 0
        self._measured: List[TrialResult] = []
        self.search_s = self.switch_s = 0.0
        self.tuning_threads = False
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
            outcome = yield from serve(self, source, config, candidate, trace, number)
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
            batch = next(it, END)
            got = time.perf_counter()
            if batch is END:
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
        self._measured, self.search_s, self.switch_s = [], 0.0, 0.0
        search = self.new_search(start)
        self.tuning_threads = search.tune_threads
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
        self.attempts = 0
        self._measured.append(outcome)
        self._epoch = epoch
        self._candidate = self._send(outcome)

    def measured(self, result: TrialResult, *, epoch: int, config: LoaderConfig) -> bool:
        """A candidate's complete measurement, handed over before it stops: True when the search decided on
        ``config`` itself, so that the candidate in force serves on."""
        self._advance(result, epoch=epoch)
        return self._steps is None and self._candidate is None and self.decision.config.same_candidate(config)

    def _decide(self, result: TuneResult) -> None:
        result = self.share(replace(result, source="online"))
        self._steps, self._candidate = None, None
        previous, self.decision = self.plain, result
        if previous is not None and getattr(previous, "_iterator", None) is not None:
            previous._iterator = None  # persistent workers of the old configuration: shut down
        self.plain = self.build(result.config)
        chosen = next((t for t in reversed(self._measured) if t.ok and t.config.same_candidate(result.config)), None)
        self.history.append(Decision(getattr(self, "_epoch", 0), result.config, result.samples_per_s,
                                     chosen.stall_fraction if chosen else None, f"{self._why}: {result.reason}",
                                     len(self._measured), self.search_s, self.switch_s))
        log.info("decided online: %s, %s samples/s", result.config.label(),
                 "-" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}")
        self.store(result)

def _stall_of(result: TuneResult) -> Optional[float]:
    chosen = next((t for t in result.trials if t.ok and t.config.same_candidate(result.config)), None)
    return chosen.stall_fraction if chosen else None


def _undecided(consumer: Consumer, threads: int = 1) -> TuneResult:
    return TuneResult(0, None, consumer.device.type == "cuda", False, None, None, "online",
                      reason="deciding online during the first epoch", threads=threads)
