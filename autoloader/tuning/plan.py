"""What the online epoch scheduler (scheduler.py) asks of the search running behind it (``Plan``), which
``online_search.OnlineSearch`` answers."""
from __future__ import annotations

from typing import Optional, Protocol

from ..config import LoaderConfig
from ..measure.sample_clock import BatchEstimate
from ..results import TrialResult
from ..search.candidates import Candidate

__all__ = ["Plan"]


class Plan(Protocol):
    """What the scheduler asks of the search running behind it (``online_search.OnlineSearch``)."""

    @property
    def threads_tuned(self) -> bool:
        """The search tries threads per process (a thread candidate's own errors are then its failure)."""

    @property
    def candidate(self) -> Optional[Candidate]:
        """What the search wants measured next; None once it decided."""

    @property
    def probes_samples(self) -> bool:
        """The candidate is a probe whose first samples may start the prior early (one process only)."""

    def tell(self, outcome: TrialResult, *, epoch: int) -> None:
        """A candidate's outcome, measured in ``epoch``: the search moves on (a next candidate, or a decision)."""

    def early(self, estimate: BatchEstimate, *, epoch: int) -> Optional[Candidate]:
        """The probe's first samples: the candidate to start now, or None (the probe goes on)."""

    def fits_beside(self, result: TrialResult) -> bool:
        """What starts next (the candidate, or the decision) fits the memory budget beside ``result``'s workers serving
        their tail: the switch may be hidden (NOTE [ Hidden switch ] in handover.py)."""

    def switch_gain(self, result: TrialResult) -> float:
        """The share by which the next candidate is predicted to beat ``result``, the run in force just measured
        (``switching.gain_over``), for ``switching.repays``."""

    def settle(self, result: TrialResult, *, epoch: int) -> bool:
        """End the search now when its choice among what it measured is ``result``'s configuration (the run in force,
        just measured in ``epoch``) and a pool with workers was measured: the next candidate would not repay its
        start even over a whole epoch. True when so decided (the run serves on as the decision)."""

    def keeps(self, config: LoaderConfig) -> bool:
        """The search decided on ``config`` itself (its run serves on)."""

    def retry_next_epoch(self) -> bool:
        """An epoch ended before the candidate's window opened: True to measure it again next epoch."""

    @property
    def fork_s(self) -> float:
        """What a switch costs the loop per worker it forks (``switching.repays``), as the largest pool started
        measured it (``switching.fork_s``)."""

    def record_start(self, *, forked: int, start_s: float) -> None:
        """A stage's start is over: it forked ``forked`` workers, the loop waiting ``start_s`` seconds for them
        (forking them, then their first batch: a worker's own start-up, an import or a cache it builds, counts). Told
        as its window completes, before the switch it decides is weighed (``fork_s``), and as it ends."""

    def record_cost(self, *, switch_s: float, serving_s: float) -> None:
        """What a stage cost the loop: what it waited for starting and stopping its run (``switch_s``), the time it
        served (``serving_s``)."""
