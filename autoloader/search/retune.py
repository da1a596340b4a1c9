"""When an online loader searches again after an epoch served by its decision, and which worker counts a search that
starts from the configuration in force proposes. Pure functions of the figures measured, tested with tables.

Why search again (``retune``, after each epoch served by the decision, ``OnlineSearch.after_epoch``), and which way:
- Loading became the bottleneck: the loop waited for data ``RETUNE_STALL`` of the epoch or more, and more than when
  the decision was measured (unless loading was the bottleneck already: ``LOADING_BOUND_STALL``); or the epoch ran
  more than ``RETUNE_RATE_CHANGE`` slower than the first epoch the decision served while the loop waited for data
  ``RETUNE_STALL`` of it. The data got costlier (another job on the machine, a colder storage tier): the search
  starts from the configuration in force and goes either way. An epoch that ran slower while the loop hardly waited
  was slowed by its step (a busier GPU, another job on the CPUs): no loader makes it faster, and searching would only
  cost the loop (no re-tune churn: NOTE [ Online convergence ] in online_policy.py). A slower rate is judged against
  the first whole epoch the decision served, never its window (a few per cent of an epoch: on a busy machine 15-20 %
  off).
- The epoch ran more than ``RETUNE_RATE_CHANGE`` faster than the decision measured or its first epoch ran: the data
  got cheaper (the page cache now serves files a cold first epoch read from disk). The same rate needs no more
  workers than before, so the search only goes down.
- Fewer may do: the loop hardly waited for data (at most ``IDLE_STALL`` of the epoch) with more than one worker,
  and no search has tried fewer since the decision. A decision taken cold keeps workers a warm epoch no longer
  needs; they cost memory and CPU, not speed, so the rate alone never shows them.
- Its candidates were measured in different epochs (``spanned``: the search outlived an epoch) and it chose more
  than one worker: the smaller counts may have been measured in a slower regime (a cold first epoch), the larger
  ones in a faster one, so the comparison that chose it does not hold. Fewer are tried once, in one regime (the
  online benchmark's simulated cold files: candidates 8, 20, 40 cold, 64 and 51 warm, 51 chosen where 1 worker is
  the warm optimum, and 51 ran the warm epochs at 0.72-0.84 of its speed).
A search that only goes down never measures more workers than the configuration in force (``policy.next_count_down``
with threads, ``online_plan``'s jumps down otherwise): a candidate that climbs would cost a switch for nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


RETUNE_STALL = 0.10
"""Loading is the bottleneck when the loop waits for data this share of an epoch or more."""
RETUNE_RATE_CHANGE = 0.15
"""A regime changed when an epoch's rate moved this much from the rate measured for the decision."""
LOADING_BOUND_STALL = 0.10
"""A decision whose loop waited for data this share of its window or more was loading-bound already (it could not keep
up: ``RETUNE_STALL``): its loop waits more whenever the step gets faster or its window was short, and only a drop of
its rate says the data got costlier."""
IDLE_STALL = 0.05
"""An epoch whose loop waited for data at most this share had workers to spare, or exactly enough: half the
``RETUNE_STALL`` that makes loading the bottleneck (the hand-over of each batch from a worker counts as waiting too,
a few per cent with many workers on a busy machine)."""


@dataclass(frozen=True)
class Retune:
    """Search again: ``why`` (for ``Decision.why`` and the log), and whether only fewer workers are tried."""

    why: str
    down: bool


def retune(*, decided_samples_per_s: Optional[float], reference_samples_per_s: Optional[float],
           decided_stall: Optional[float], num_workers: int, epoch_samples_per_s: Optional[float],
           epoch_stall: Optional[float], tried_fewer: bool, spanned: bool = False) -> Optional[Retune]:
    """Whether the next epoch searches again, from the epoch just ended (steady state) and the decision in force
    (``num_workers``; ``decided_samples_per_s`` and ``decided_stall``: what its window measured, None unknown;
    ``reference_samples_per_s``: the steady rate of the first whole epoch it served, None for that epoch itself;
    ``tried_fewer``: a search already went down from it; ``spanned``: its search measured candidates in more than one
    epoch); None keeps the decision. Slower is judged against the whole epoch only (a window lasts a few per cent of an
    epoch: on a busy machine 15-20 % off, and re-tuning on it restarts workers for nothing); faster against either
    (a cold first epoch's decision, then a warm one: the regime changed right after the window)."""
    if epoch_samples_per_s is None or epoch_stall is None:
        return None
    if decided_stall is not None and epoch_stall >= RETUNE_STALL and epoch_stall > decided_stall + RETUNE_STALL \
            and decided_stall < LOADING_BOUND_STALL:
        return Retune(f"the loop waited for data {epoch_stall:.0%} of the epoch (at the decision: "
                      f"{decided_stall:.0%})", down=False)
    if reference_samples_per_s and epoch_stall >= RETUNE_STALL and \
            epoch_samples_per_s < (1.0 - RETUNE_RATE_CHANGE) * reference_samples_per_s:
        return Retune(f"the epoch ran at {epoch_samples_per_s:,.0f} samples/s, "
                      f"{epoch_samples_per_s / reference_samples_per_s - 1.0:+.0%} from the "
                      f"{reference_samples_per_s:,.0f} of the first epoch the decision served", down=False)
    known = [r for r in (decided_samples_per_s, reference_samples_per_s) if r]
    if known and num_workers > 0 and epoch_samples_per_s > (1.0 + RETUNE_RATE_CHANGE) * min(known):
        return Retune(f"the epoch ran at {epoch_samples_per_s:,.0f} samples/s, "
                      f"{epoch_samples_per_s / min(known) - 1.0:+.0%} from the {min(known):,.0f} measured for the "
                      f"decision", down=True)
    if not tried_fewer and num_workers > 1 and epoch_stall <= IDLE_STALL:
        return Retune(f"the loop waited for data {epoch_stall:.1%} of the epoch with {num_workers} workers: trying "
                      f"fewer", down=True)
    if not tried_fewer and num_workers > 1 and spanned:
        return Retune(f"the {num_workers} workers were chosen among candidates measured in different epochs: "
                      f"trying fewer in one", down=True)
    return None
