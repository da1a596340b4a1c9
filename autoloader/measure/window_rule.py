"""When a window opens and when it is complete: pure functions of the batches it marked (when each was done, how long
the loop waited for it). A trial keeps the fixed rule of NOTE [ Trial timing ] in run.py (the whole start-up burst,
``window_open``, then waves and seconds; ``MIN_OPENED`` batches past the burst for a window cut short); an online
candidate serves the user's own epoch, so every second it measures a slow configuration is lost (NOTE [ Online
convergence ] in search/online_policy.py, 2.):

- Opening. The burst a window must skip is the batches the workers prefetched while they started; once the loop got
  the batches in flight at the start (the workers start one after the other, and a wait among those is for one
  worker's batch while the others' are ready) and then waited for one (``DRAIN_WAIT_S`` inside ``next()``), the
  queue was empty, so the batches after it come at the workers' own pace (``drained``). A candidate the loop never
  waits for serves at the step's pace whatever it holds; its window opens after the burst, or once the bound passed
  since every worker's first batch was handed out.
- Closing. The rate is known within half the tolerance from the batches' own jitter (``relative_error``: the spread
  of the time chunks of consecutive batches took, a wave of the workers each when the loop waits for them), or the
  window reached its bound (a few per cent of the epoch: ``switching.window_bound_s``).
"""
from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

__all__ = ["CONFIDENT_BATCHES", "CONFIDENT_CHUNKS", "DRAIN_WAIT_S", "MIN_CONFIDENT_S", "MIN_OPENED", "drained",
           "relative_error", "window_open"]

DRAIN_WAIT_S = 0.002
"""A batch the loop waited this long for was not in the queue: a queued batch is handed over in well under 1 ms."""
MIN_OPENED = 3
"""Batches past the burst for a window to count as opened: a patient window cut by the limit, or an online window cut
by the epoch's end, is then taken as it is (marked not steady) rather than measured again; an epoch's tally
(tally.py) needs as many past its burst."""
CONFIDENT_BATCHES = 8
"""A window is never confident before it holds this many batches ..."""
CONFIDENT_CHUNKS = 3
"""... and this many chunks (see ``relative_error``) ..."""
MIN_CONFIDENT_S = 0.05
"""... and spans this many seconds (a fast loader's timer noise)."""


def drained(waits: Sequence[float], *, first_wave: int) -> Optional[int]:
    """The index of the first batch after the first ``first_wave`` (the workers' first batches, made as they started)
    that the loop waited for (``DRAIN_WAIT_S``): the window opens once it is done. None while there is none. Pure."""
    for index in range(max(0, first_wave), len(waits)):
        if waits[index] >= DRAIN_WAIT_S:
            return index
    return None


def relative_error(done: Sequence[float], *, chunk: int) -> Optional[float]:
    """The relative standard error of the rate the batch completion times ``done`` (the window's opening batch
    first) give: the time is cut into chunks of ``chunk`` consecutive batches, and the spread of their durations over
    the mean, over the square root of their number, is the error of the mean rate. None with fewer than
    ``CONFIDENT_CHUNKS`` chunks. Pure."""
    chunk = max(1, chunk)
    count = (len(done) - 1) // chunk
    if count < CONFIDENT_CHUNKS:
        return None
    spans = [done[(i + 1) * chunk] - done[i * chunk] for i in range(count)]
    mean = statistics.fmean(spans)
    if mean <= 0:
        return None
    return statistics.stdev(spans) / mean / math.sqrt(count)


def confident(done: Sequence[float], *, chunk: int, tolerance: float) -> bool:
    """The window's rate is known within half the ``tolerance``: at least ``CONFIDENT_BATCHES`` batches over
    ``MIN_CONFIDENT_S`` seconds whose ``relative_error`` is at most that. Pure."""
    if len(done) - 1 < CONFIDENT_BATCHES or done[-1] - done[0] < MIN_CONFIDENT_S:
        return False
    error = relative_error(done, chunk=chunk)
    return error is not None and error <= tolerance / 2


def window_open(count: int, skip: int, n: int) -> Optional[int]:
    """Index of the batch whose completion opens the timed window: after the burst if we got that far, else after
    the first wave, else after the first batch; None when fewer than two batches follow it."""
    for index in (skip - 1, n, 0):
        if count - 1 - index >= 2:
            return index
    return None
