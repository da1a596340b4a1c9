"""The search behind an online loader (``OnlineSearch``): the ``plan.Plan`` its epochs follow. It runs the online
search (search/online_plan.py; with ``threads=True`` the trials' ``search.Search``), one candidate at a time as the
epochs measure them, owns the decision in force, and starts again when the re-tune rule says so
(search/retune.py)."""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Set, Tuple

from ..cache.slot import Slot
from ..config import LoaderConfig, default_pin, make_config
from ..coordination import Coordinator
from ..errors import TuningError, warn_user
from ..measure.sample_clock import BatchEstimate
from ..probe import MachineProfile
from ..request import Request
from ..results import Decision, TrialResult, TuneResult
from ..search import online_policy, switching
from ..search.memory import overlap_guard
from ..search.candidates import Candidate, Steps
from ..search.online_plan import online_cap, online_steps, settled
from ..search.retune import retune
from ..search.search import Search
from ..search.threads_policy import rate

log = logging.getLogger("autoloader.online")

MAX_ATTEMPTS = 2
"""Epochs a candidate may be cut short by the epoch's end before its window opened, before its partial measurement is
taken as it is (a window that opened and holds a few batches is taken at once, marked not steady)."""


class SearchInProgress:
    """One search, from its start to its decision: the generator, its candidate, what it measured and what it cost."""

    def __init__(self, search: Search, steps: Steps[TuneResult], *, why: str, down: bool) -> None:
        self.search, self.steps = search, steps
        self.threads = search.settings.tune_threads
        self.why, self.down = why, down
        self.candidate: Optional[Candidate] = None
        self.measured: List[TrialResult] = []
        self.epochs: Set[int] = set()
        self.attempts = 0
        self.search_s = self.switch_s = 0.0


class OnlineSearch:
    """THE decision in force (``decision``; every other holder reads it here: the online loader's plain DataLoader,
    the prefetcher's ``tuning``, a checkpoint's label) and the search that may replace it (NOTE [ Online epoch
    scheduler ] in phases.py). ``decisions``: every online decision; ``spanned``/``tried_fewer``: what the re-tune
    rule reads of the search that made the decision in force."""

    def __init__(self, request: Request, profile: MachineProfile, *, slot: Slot, coordinator: Coordinator,
                 decision: Optional[TuneResult]) -> None:
        self.request, self.profile, self.slot, self.coordinator = request, profile, slot, coordinator
        self.decision = decision or _undecided(request)
        self.decisions: List[Decision] = []
        self.current: Optional[SearchInProgress] = None
        self.spanned = False
        """The search that made the decision in force measured candidates in more than one epoch."""
        self.tried_fewer = False
        """The search that made the decision in force tried fewer workers (or found none would do): an epoch that
        hardly waits does not start another one."""
        self.reference: Optional[float] = None
        """The steady rate of the first whole epoch the decision in force served (the re-tune rule's reference)."""
        self._forked: Tuple[int, float] = (0, 0.0)
        """The largest pool a stage started by forking, and the seconds its start took the loop (``fork_s``)."""
        if decision is None:
            self.start(None, why="no tuning for this dataset and machine yet")

    @classmethod
    def create(cls, request: Request, profile: MachineProfile, *, slot: Slot,
               decision: Optional[TuneResult]) -> "OnlineSearch":
        """The online search for ``request``, its ranks agreeing through the request's group."""
        group = request.group
        return cls(request, profile, slot=slot, coordinator=group.coordinator() if group is not None else Coordinator(),
                   decision=decision)

    @property
    def searching(self) -> bool:
        return self.current is not None

    @property
    def candidate(self) -> Optional[Candidate]:
        """What to measure next; None: serve the decision."""
        return self.current.candidate if self.current is not None else None

    def start(self, start: Optional[LoaderConfig], *, why: str, down: bool = False) -> None:
        """Search from ``start`` (None: from scratch); ``down``: only fewer workers than ``start`` are tried."""
        search = Search(self.request, self.profile, budget=math.inf, coordinator=self.coordinator, start=start,
                        descend=down, known=self.decision.trials if start is not None else ())
        steps = search.steps() if search.settings.tune_threads else \
            online_steps(search, serial=_serial_of(self.decision) if start is not None else None)
        self.current = SearchInProgress(search, steps, why=why, down=down)
        self._send(None)

    # -- plan.Plan -------------------------------------------------------------------------------------------------
    @property
    def threads_tuned(self) -> bool:
        return self.current is not None and self.current.threads

    @property
    def probes_samples(self) -> bool:
        return self.coordinator.size == 1 and self.candidate is not None and self.candidate.probe

    def tell(self, outcome: TrialResult, *, epoch: int) -> None:
        current = self.current
        if current is None:
            raise RuntimeError("no online search is running to be told a candidate's outcome")
        current.attempts = 0
        current.measured.append(outcome)
        current.epochs.add(epoch)
        self._send(outcome, epoch=epoch)

    def early(self, estimate: BatchEstimate, *, epoch: int) -> Optional[Candidate]:
        """The probe's first samples say what a batch costs: the prior's candidate when its workers should start now
        (``online_policy.starts_early``, and within the memory budget; the probe is then told the estimate), else None
        (the probe goes on)."""
        current = self.current
        if current is None or current.candidate is None or not current.candidate.probe or \
                current.search.settings.spawned:  # spawned: a start costs seconds, never on a guess (online_cap)
            return None
        workers = online_policy.prior_workers(fetch_s=estimate.fetch_s, fetch_cpu_s=estimate.fetch_cpu_s,
                                              fetch_delay_s=estimate.fetch_delay_s, consumer_s=None,
                                              usable_cpus=current.search.settings.usable,
                                              cap=online_cap(current.search))
        search = current.search
        fills = online_policy.fills_cpus(fetch_s=estimate.fetch_s, fetch_cpu_s=estimate.fetch_cpu_s,
                                         fetch_delay_s=estimate.fetch_delay_s, usable_cpus=search.settings.usable)
        if not online_policy.starts_early(fetch_s=estimate.fetch_s, workers=workers, fills=fills) or \
                search.guard(search.config(workers), search.per_worker_estimate()) is not None:
            return None
        log.info("the first samples cost %.1f ms a batch: starting %d workers now", 1e3 * estimate.fetch_s, workers)
        self.tell(TrialResult(config=current.candidate.config, reason=f"probe: the first {estimate.samples} samples' "
                              f"cost, no rate", batches=0, fetch_s_per_batch=estimate.fetch_s,
                              fetch_cpu_s_per_batch=estimate.fetch_cpu_s,
                              fetch_delay_s_per_batch=estimate.fetch_delay_s,
                              steady=False), epoch=epoch)
        return self.candidate

    def fits_beside(self, result: TrialResult) -> bool:
        current = self.current
        if current is not None and current.candidate is not None:
            following, trials = current.candidate.config, tuple(current.search.found.trials)
            budget_bytes = current.search.settings.memory_budget
        else:
            following, trials = self.decision.config, tuple(self.decision.trials)
            budget_bytes = self.decision.memory_budget_bytes
        reason = overlap_guard(result, following, trials, budget_bytes=budget_bytes)
        if reason is not None:
            log.info("switching without a tail: %s", reason)
        return reason is None

    def switch_gain(self, result: TrialResult) -> float:
        current = self.current
        if current is None or current.candidate is None:
            return 0.0
        rates = [rate(t) for t in current.search.candidates() if t.ok]
        return switching.gain_over(gain=current.candidate.gain, best_samples_per_s=max(rates, default=None),
                                   now_samples_per_s=rate(result) if result.ok else None)

    def settle(self, result: TrialResult, *, epoch: int) -> bool:
        current = self.current
        if current is None:
            return False
        if not any(t.ok and t.config.num_workers for t in current.search.found.trials):
            return False  # no pool measured yet: the probe's serial batches are no choice
        chosen = current.search.choose()
        if chosen is None or not chosen.config.same_candidate(result.config):
            return False
        current.steps.close()
        self._decide(settled(current.search), current, epoch=epoch)
        return True

    def keeps(self, config: LoaderConfig) -> bool:
        return self.current is None and self.decision.config.same_candidate(config)

    def retry_next_epoch(self) -> bool:
        current = self.current
        if current is None:
            return False
        current.attempts += 1
        return current.attempts < MAX_ATTEMPTS

    @property
    def fork_s(self) -> float:
        settings = self.current.search.settings if self.current is not None else None
        return switching.fork_s(workers=self._forked[0], start_s=self._forked[1],
                                spawned=settings is not None and settings.spawned,
                                usable_cpus=settings.usable if settings is not None else 1)

    def record_start(self, *, forked: int, start_s: float) -> None:
        if forked and forked >= self._forked[0]:  # the largest pool: the least fixed cost in its start per worker
            self._forked = (forked, start_s)

    def record_cost(self, *, switch_s: float, serving_s: float) -> None:
        if self.current is not None:
            self.current.switch_s += switch_s
            self.current.search_s += serving_s

    # -- after an epoch ------------------------------------------------------------------------------------------
    def after_epoch(self, epoch: int, rate: Optional[float], stall: Optional[float]) -> None:
        """Epoch ``epoch`` ran with the decision: its steady rate and stall (every rank's, agreed) may start a new
        search when the re-tune rule says so."""
        rate, stall = self.coordinator.epoch(rate, stall)
        last = self.decisions[-1] if self.decisions else None
        again = retune(decided_samples_per_s=self.decision.samples_per_s, reference_samples_per_s=self.reference,
                       num_workers=self.decision.config.num_workers,
                       decided_stall=last.stall_fraction if last else _stall_of(self.decision),
                       epoch_samples_per_s=rate, epoch_stall=stall, tried_fewer=self.tried_fewer,
                       spanned=self.spanned)
        if self.reference is None:
            self.reference = rate
        log.debug("epoch %d with %s: %s samples/s, stall %s; decided %s samples/s", epoch,
                  self.decision.config.label(), rate, stall, self.decision.samples_per_s)
        if again is not None:
            log.info("epoch %d: %s; searching again from %s%s", epoch, again.why, self.decision.config.label(),
                     " (fewer workers only)" if again.down else "")
            self.start(self.decision.config, why=again.why, down=again.down)

    # -- the search generator --------------------------------------------------------------------------------------
    def _send(self, outcome: Optional[TrialResult], *, epoch: int = 0) -> None:
        """The search's next candidate after ``outcome``, or its decision."""
        current = self.current
        if current is None:
            raise RuntimeError("no online search is running")
        try:
            current.candidate = next(current.steps) if outcome is None else current.steps.send(outcome)
        except StopIteration as done:
            self._decide(done.value, current, epoch=epoch)
        except TuningError as err:
            warn_user(f"autoloader could not tune online ({err}); keeping {self.decision.config.label()}")
            self.current = None

    def _decide(self, result: TuneResult, current: SearchInProgress, *, epoch: int) -> None:
        group = self.request.group
        result = result.with_source("online")
        result = group.broadcast(result, point="online decision") if group is not None else result
        self.current = None
        self.spanned, self.tried_fewer = len(current.epochs) > 1, current.down or not current.threads
        self.decision, self.reference = result, None
        self.decisions.append(Decision(epoch, result.config, result.samples_per_s, _stall_of(result),
                                       f"{current.why}: {result.reason}", len(current.measured), current.search_s,
                                       current.switch_s))
        log.info("decided online: %s, %s samples/s", result.config.label(),
                 "-" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}")
        self.slot.store(result)


def _stall_of(result: TuneResult) -> Optional[float]:
    """The stall of the last measurement of ``result``'s configuration, as every rank of the node agreed it (the
    re-tune rule reads it: a rank's own figure would let the ranks' searches part ways, NOTE [ One decision across
    ranks ] in distributed.py)."""
    chosen = next((t for t in reversed(result.trials) if t.ok and t.config.same_candidate(result.config)), None)
    return chosen.stall_fraction if chosen else None


def _serial_of(result: TuneResult) -> Optional[TrialResult]:
    """The first batches' costs the search behind ``result`` measured (a serial trial or probe), if any."""
    return next((t for t in result.trials if t.config.num_workers == 0 and t.fetch_s_per_batch is not None), None)


def _undecided(request: Request) -> TuneResult:
    config = make_config(0, fixed=request.fixed, pin_memory=default_pin(request.fixed, request.device.type),
                         threads=request.fixed_threads)
    return TuneResult(config, None, None, "online", reason="deciding online during the first epoch")
