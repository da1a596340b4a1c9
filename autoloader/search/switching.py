"""The epoch scheduler's rules of time (NOTE [ Online convergence ], 2. and 4., in online_policy.py): whether switching
an online epoch to another candidate repays itself before the epoch ends (``repays``) or over the next
(``repays_next_epoch``), the gain a switch is weighed at (``gain_over``), what starting a worker costs
(``fork_s``, ``spawn_cap``), and how long a candidate's window may last (``window_bound_s``). Pure functions,
tested on tables (tests/search/test_switching.py).
"""
from __future__ import annotations

import math
from typing import Optional

from .capacity import DEFAULT_TOLERANCE, FORK_S

__all__ = ["MAX_WINDOW_BOUND_S", "MIN_WINDOW_BOUND_S", "SPAWN_S", "SPAWN_START_SHARE", "WINDOW_SHARE", "fork_s",
           "gain_over", "repays", "repays_next_epoch", "spawn_cap", "window_bound_s"]

WINDOW_SHARE = 0.03
"""A candidate's window lasts at most this share of the epoch ..."""
MIN_WINDOW_BOUND_S = 0.25
"""... but at least this long (a few batches of any rate) ..."""
MAX_WINDOW_BOUND_S = 4.0
"""... and at most this long."""
SPAWN_S = 1.0
"""The CPU seconds starting one spawned (or forkserver) worker costs: a fresh interpreter importing torch and
unpickling the dataset (0.8-1.5 s on the 2-core VM, where 30 spawned at once took 32 s of a 3 s epoch's loop)."""
SPAWN_START_SHARE = 0.25
"""Spawned workers an online candidate starts cost at most this share of an epoch served serially (``spawn_cap``)."""


def repays(*, remaining_s: Optional[float], gain: float, workers: int, window_s: float,
           tolerance: float = DEFAULT_TOLERANCE, fork_s: float = FORK_S) -> bool:
    """Whether switching to an unmeasured candidate now repays itself before the epoch ends (NOTE [ Online
    convergence ], 4.): its predicted ``gain`` (a share; a count that only saves workers is worth ``tolerance``) over
    the ``remaining_s`` seconds covers forking its ``workers`` on the loop's thread and a window of ``window_s`` at the
    risk of being ``tolerance`` slower. Unknown ``remaining_s`` (a sampler without a length): True. Pure."""
    if remaining_s is None:
        return True
    worth = max(gain, tolerance) * max(0.0, remaining_s - window_s)
    return worth >= workers * fork_s + tolerance * window_s


def repays_next_epoch(*, epoch_s: Optional[float], gain: float, workers: int, tolerance: float = DEFAULT_TOLERANCE,
                      fork_s: float = FORK_S) -> bool:
    """Whether a candidate that does not repay a switch before this epoch ends repays starting its ``workers`` at the
    next one (in place of the run in force, whose workers persist): its predicted ``gain`` (at least ``tolerance``)
    over a whole epoch of ``epoch_s`` covers forking them. When not, the search settles on what it measured (drawn
    seed 21: 18 workers predicted 6 % over the 17 in force, a 0.4 s epoch, 212 ms to start each worker on 2 CPUs;
    the next epoch, started on them, took 3.2 s). Unknown ``epoch_s``: True. Pure."""
    if epoch_s is None:
        return True
    return max(gain, tolerance) * epoch_s >= workers * fork_s


def gain_over(*, gain: float, best_samples_per_s: Optional[float], now_samples_per_s: Optional[float]) -> float:
    """The share by which a candidate is predicted to beat the run in force (``now_samples_per_s``, just measured):
    its predicted ``gain`` over the best measured so far (``best_samples_per_s``; 0 for a count that only saves
    workers: predicted at the best's rate), times the best over the run in force. After a candidate that fell short
    of the best, switching away gains what it lost (16 workers at 12,341 samples/s beside 26 at 16,836: 36 %, where
    the jump's own 0 deferred the count between them to the next epoch, which started on it). ``gain`` when either
    rate is unknown. Pure."""
    if not best_samples_per_s or not now_samples_per_s or now_samples_per_s <= 0:
        return gain
    return max(gain, (1.0 + gain) * best_samples_per_s / now_samples_per_s - 1.0)


def fork_s(*, workers: int, start_s: float, spawned: bool = False, usable_cpus: int = 1) -> float:
    """What ``repays`` counts per worker a switch forks, as a start of ``workers`` took ``start_s`` seconds of the
    loop's thread (``iter()`` forking them, then the wait for their first batch: a worker's own start-up, a cache it
    builds or an import, counts, not only its fork): never below ``FORK_S``, the constant the online benchmarks'
    switches were measured with (on the 2-core VM 16 workers started in 130-200 ms, 8-13 ms each); a host that forks
    slower raises it (on the H200, 16 and 32 workers took 0.064-0.074 s each from ``iter()`` to their first batch, the
    forks' share of it not measured). ``FORK_S`` when nothing was forked. Spawned workers (``spawned``) return from
    ``iter()`` at once and start on every CPU meanwhile, each a fresh interpreter: never below ``SPAWN_S`` over the
    ``usable_cpus``. Pure."""
    floor = max(FORK_S, SPAWN_S / max(1, usable_cpus)) if spawned else FORK_S
    return max(floor, start_s / workers) if workers > 0 else floor


def window_bound_s(epoch_s: Optional[float]) -> float:
    """The longest a candidate's window lasts: ``WINDOW_SHARE`` of an epoch of ``epoch_s`` seconds (predicted), within
    ``MIN_WINDOW_BOUND_S`` and ``MAX_WINDOW_BOUND_S``; the upper bound when the epoch's length is unknown. Pure."""
    if epoch_s is None or not math.isfinite(epoch_s):
        return MAX_WINDOW_BOUND_S
    return min(MAX_WINDOW_BOUND_S, max(MIN_WINDOW_BOUND_S, WINDOW_SHARE * epoch_s))


def spawn_cap(*, epoch_serial_s: Optional[float], usable_cpus: int) -> Optional[int]:
    """The most spawned workers an online candidate starts: their start (``SPAWN_S`` each, on the usable CPUs) at most
    ``SPAWN_START_SHARE`` of an epoch served serially (``epoch_serial_s``), at least two (one worker beside a step
    that takes no time makes what the main process does alone: a cap of one could never measure that workers pay,
    and 960 samples of 3 ms kept serial serving at 315 samples/s where two spawned workers make twice that); None
    when the epoch's length is unknown. Pure."""
    if epoch_serial_s is None or not math.isfinite(epoch_serial_s):
        return None
    return max(2, int(SPAWN_START_SHARE * epoch_serial_s * max(1, usable_cpus) / SPAWN_S))
