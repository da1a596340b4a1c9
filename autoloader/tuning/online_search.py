"""The search behind an online loader (``OnlineSearch``): the ``scheduler.Plan`` its epochs follow. It runs the same
model-guided search as the trials (``search.Search``), one candidate at a time as the epochs measure them, keeps the
decision in force, and starts again when the re-tune rule says so (search/retune.py)."""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Set

from ..cache.slot import Slot
from ..config import LoaderConfig, default_pin, make_config
from ..coordination import Coordinator
from ..errors import TuningError, warn_user
from ..measure.run import Run
from ..probe import MachineProfile
from ..request import Request
from ..results import Decision, TrialResult, TuneResult
from ..search.candidates import Candidate, Steps
from ..search.retune import retune
from ..search.search import Search

log = logging.getLogger("autoloader.online")

MAX_ATTEMPTS = 2
"""Epochs a candidate may be cut short by the epoch's end before its window opened, before its partial measurement is
taken as it is (a window that opened and holds a few batches is taken at once, marked not steady)."""


class SearchInProgress:
    """One search, from its start to its decision: the generator, its candidate, what it measured and what it cost."""

    def __init__(self, search: Search, *, why: str, down: bool) -> None:
        self.steps: Steps[TuneResult] = search.steps()
        self.threads = search.settings.tune_threads
        self.why, self.down = why, down
        self.candidate: Optional[Candidate] = None
        self.measured: List[TrialResult] = []
        self.epochs: Set[int] = set()
        self.attempts = 0
        self.search_s = self.switch_s = 0.0


class OnlineSearch:
    """The decision in force and the search that may replace it (NOTE [ Online epoch scheduler ] in scheduler.py).
    ``decisions``: every online decision; ``spanned``/``tried_fewer``: what the re-tune rule reads of the search that
    made the decision in force."""

    def __init__(self, request: Request, profile: MachineProfile, *, slot: Slot, coordinator: Coordinator,
                 decision: Optional[TuneResult]) -> None:
        self.request, self.profile, self.slot, self.coordinator = request, profile, slot, coordinator
        self.decision = decision or _undecided(request)
        self.decisions: List[Decision] = []
        self.current: Optional[SearchInProgress] = None
        self.epoch = 0
        self.spanned = False
        """The search that made the decision in force measured candidates in more than one epoch."""
        self.tried_fewer = False
        """The search that made the decision in force only tried fewer workers: an epoch that hardly waits does not
        start another one."""
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
                        descend=down)
        self.current = SearchInProgress(search, why=why, down=down)
        self._send(None)

    # -- scheduler.Plan ----------------------------------------------------------------------------------------------
    @property
    def threads_tuned(self) -> bool:
        return self.current is not None and self.current.threads

    def tell(self, outcome: TrialResult) -> None:
        current = self.current
        if current is None:
            raise RuntimeError("no online search is running to be told a candidate's outcome")
        current.attempts = 0
        current.measured.append(outcome)
        current.epochs.add(self.epoch)
        self._send(outcome)

    def keeps(self, config: LoaderConfig) -> bool:
        return self.current is None and self.decision.config.same_candidate(config)

    def carry(self) -> bool:
        current = self.current
        if current is None:
            return False
        current.attempts += 1
        return current.attempts < MAX_ATTEMPTS

    def spent(self, run: Run, serving_s: float) -> None:
        if self.current is not None:
            self.current.switch_s += run.record.switch_s
            self.current.search_s += serving_s

    # -- after an epoch ------------------------------------------------------------------------------------------
    def after_epoch(self, rate: Optional[float], stall: Optional[float]) -> None:
        """A steady epoch's rate and stall (every rank's, agreed): search again when the re-tune rule says so."""
        rate, stall = self.coordinator.epoch(rate, stall)
        last = self.decisions[-1] if self.decisions else None
        again = retune(decided_samples_per_s=self.decision.samples_per_s, num_workers=self.decision.config.num_workers,
                       decided_stall=last.stall_fraction if last else _stall_of(self.decision),
                       epoch_samples_per_s=rate, epoch_stall=stall, tried_fewer=self.tried_fewer,
                       spanned=self.spanned)
        log.debug("epoch %d with %s: %s samples/s, stall %s; decided %s samples/s", self.epoch,
                  self.decision.config.label(), rate, stall, self.decision.samples_per_s)
        if again is not None:
            log.info("epoch %d: %s; searching again from %s%s", self.epoch, again.why, self.decision.config.label(),
                     " (fewer workers only)" if again.down else "")
            self.start(self.decision.config, why=again.why, down=again.down)

    # -- the search generator --------------------------------------------------------------------------------------
    def _send(self, outcome: Optional[TrialResult]) -> None:
        """The search's next candidate after ``outcome``, or its decision."""
        current = self.current
        if current is None:
            raise RuntimeError("no online search is running")
        try:
            current.candidate = next(current.steps) if outcome is None else current.steps.send(outcome)
        except StopIteration as done:
            self._decide(done.value, current)
        except TuningError as err:
            warn_user(f"autoloader could not tune online ({err}); keeping {self.decision.config.label()}")
            self.current = None

    def _decide(self, result: TuneResult, current: SearchInProgress) -> None:
        group = self.request.group
        result = result.with_source("online")
        result = group.broadcast(result, point="online decision") if group is not None else result
        self.current = None
        self.spanned, self.tried_fewer = len(current.epochs) > 1, current.down
        self.decision = result
        chosen = next((t for t in reversed(current.measured) if t.ok and t.config.same_candidate(result.config)),
                      None)
        self.decisions.append(Decision(self.epoch, result.config, result.samples_per_s,
                                       chosen.stall_fraction if chosen else None, f"{current.why}: {result.reason}",
                                       len(current.measured), current.search_s, current.switch_s))
        log.info("decided online: %s, %s samples/s", result.config.label(),
                 "-" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}")
        self.slot.store(result)


def _stall_of(result: TuneResult) -> Optional[float]:
    chosen = next((t for t in result.trials if t.ok and t.config.same_candidate(result.config)), None)
    return chosen.stall_fraction if chosen else None


def _undecided(request: Request) -> TuneResult:
    config = make_config(0, fixed=request.fixed, pin_memory=default_pin(request.fixed, request.device.type),
                         threads=request.fixed_threads)
    return TuneResult(config, None, None, "online", reason="deciding online during the first epoch")
