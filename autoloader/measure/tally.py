"""The lighter count of an epoch served by the configuration in force (``Tally``): its steady rate and stall after
the start-up burst a window skips, without a mark per batch (NOTE [ Trial timing ] in run.py)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

from ..config import LoaderConfig
from ..loader.epochs import stall_fraction
from .marks import samples_in
from .window_rule import MIN_OPENED

__all__ = ["Tally"]


class Tally:
    """An epoch served by the configuration in force, counted without a mark per batch (an epoch may hold millions):
    its steady rate and stall after the same start-up burst a window skips, for the re-tune check."""

    def __init__(self, config: LoaderConfig, batch_size: int) -> None:
        self.skip, self.batch_size = config.burst_batches(), batch_size
        self.count = self.samples = 0
        self.opened: Optional[float] = None
        self.waited = 0.0

    def add(self, batch: Any, *, wait_s: float, t_got: float) -> None:
        self.count += 1
        if self.count == self.skip:
            self.opened = t_got
        elif self.count > self.skip:
            self.waited += wait_s
            self.samples += samples_in(batch, self.batch_size)

    def rate_and_stall(self, end: float) -> Tuple[Optional[float], Optional[float]]:
        """(samples/s, share of the time spent waiting) after the burst; (None, None) when too few batches followed
        it."""
        if self.opened is None or self.count < self.skip + MIN_OPENED or end <= self.opened:
            return None, None
        span = end - self.opened
        return self.samples / span, stall_fraction(self.waited, span)
