"""The records of a loader tuned online: each decision (``Decision``) and the trace of an epoch that searched
(``EpochTrace``)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..config import LoaderConfig


@dataclass(frozen=True)
class Decision:
    """One decision of a loader tuned online (an entry of ``loader.decisions``): the configuration that served from
    ``epoch`` on, and why.

    Attributes:
        epoch (int): The epoch whose search made it (the decision serves the rest of that epoch and the next ones).
        config (LoaderConfig): The configuration chosen.
        samples_per_s (float): The rate it measured, samples per second; None when unknown.
        stall_fraction (float): The share of its measured window the loop spent waiting for data, 0 to 1.
        why (str): Why its search ran: ``"no tuning for this dataset and machine yet"`` for the first, else the
            re-tune rule that fired after an epoch (the loop waited for data, the epoch ran slower or faster than
            the decision's rate, the loop hardly waited with several workers, or the candidates were measured in
            different epochs).
        candidates (int): Candidates measured for it, in the training loop itself.
        search_s (float): Seconds of your epochs those candidates served (not extra time).
        switch_s (float): Of ``search_s``, the seconds spent stopping one candidate's workers and starting the
            next's.
    """

    epoch: int
    config: LoaderConfig
    samples_per_s: Optional[float]
    stall_fraction: Optional[float]
    why: str
    candidates: int = 0
    search_s: float = 0.0
    switch_s: float = 0.0


@dataclass
class EpochTrace:
    """One epoch that searched online (an entry of ``loader.online_traces``): when each batch reached the loop, and
    each candidate's span; ``autoloader.cli.plot.plot_online_epoch`` draws it.

    Attributes:
        epoch (int): The epoch's number.
        start (float): When it started (``time.perf_counter()``).
        batches (list): ``(seconds since the epoch started, samples)`` for each batch handed to the loop.
        spans (list): ``(start s, end s, label, samples/s measured or None)`` for each candidate that served part
            of the epoch, the decision's last.
    """

    epoch: int
    start: float
    batches: List[Tuple[float, int]] = field(default_factory=list)
    """(seconds since the epoch started, samples) per batch handed to the loop."""
    spans: List[Tuple[float, float, str, Optional[float]]] = field(default_factory=list)
    """(start s, end s, label, samples/s measured or None) per candidate, the decision's last."""

    def span(self, start: float, config: LoaderConfig, rate: Optional[float]) -> float:
        """Close the span of ``config`` that began at ``start`` (perf_counter); returns now."""
        now = time.perf_counter()
        self.spans.append((start - self.start, now - self.start, config.label(), rate))
        return now
