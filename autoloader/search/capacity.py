"""What both searches' policies read of a candidate's capacity: the tolerance within which rates are alike, the
headroom loading should keep over the step, what starting a worker costs before one was measured, how many CPUs the
training step keeps busy, how many workers fill the CPUs left to them, and whether a candidate's processes keep the
usable CPUs busy, and whether a pool's own workers limited its rate. Pure.
"""
from __future__ import annotations

import math

from typing import Optional

from ..results import TrialResult

__all__ = ["DEFAULT_TOLERANCE", "FILL", "FORK_S", "HEADROOM", "MAIN_FREE", "STEP_CPU_FLOOR", "WAITED",
           "cpu_saturated", "fill_count", "pool_cpus", "step_cpus", "step_share", "worker_bound"]

DEFAULT_TOLERANCE = 0.05
"""Rates within this share of each other are alike: the fewest workers among them are chosen."""
HEADROOM = 1.2
"""Aim for this much more loading capacity than the consumer eats, so jitter does not stall it."""
FILL = 0.85
"""The share of the usable CPUs a pool may keep busy: at it the CPUs are saturated (``cpu_saturated``), and a climb
predicts no more workers than fill it (``online_policy.jump``)."""
FORK_S = 0.02
"""What starting one worker costs the loop's thread (the fork), before a pool was started (then measured:
``switching.fork_s``, never below this): 15-20 ms with torch imported on the 2-core VM, more for a process holding
gigabytes."""


STEP_CPU_FLOOR = 0.25
"""A step keeping less of a CPU busy than this is not counted against the workers' CPUs: a GPU step's host work, a
sleep, the loop's own bookkeeping."""


MAIN_FREE = 0.5
"""A main process keeping less of a CPU busy than this was not what a pool waited for (``worker_bound``)."""
WAITED = 0.5
"""A pool whose loop waited for data at least this share of its window waited for its workers or its hand-over."""


def step_cpus(trial: Optional[TrialResult], *, usable_cpus: int) -> float:
    """The CPUs the training step keeps busy while it runs, as ``trial`` measured it (``consumer_cpu_s_per_batch``
    over ``consumer_s_per_batch``: a step on the CPU runs torch's intra-op pool, up to the usable CPUs), at most the
    usable CPUs; 0 when not measured or below ``STEP_CPU_FLOOR``. The workers share the CPUs with it: what it takes from
    them while it runs (``online_policy.steal_s``), and at the pace they feed it (``step_share``). The machine's other
    load (``TrialResult.other_cpus``) is not among them: its processes share the CPUs with the workers at equal
    weight, so more workers take a larger share of them, not none (counted as taken, waiting-bound samples chose no
    workers on a machine kept busy by another job)."""
    if trial is None or not trial.consumer_s_per_batch or trial.consumer_cpu_s_per_batch is None:
        return 0.0
    cpus = min(float(usable_cpus), trial.consumer_cpu_s_per_batch / trial.consumer_s_per_batch)
    return cpus if cpus >= STEP_CPU_FLOOR else 0.0


def pool_cpus(trial: TrialResult) -> float:
    """The CPUs ``trial``'s workers and main process together kept busy over its window (0 for what was not
    measured)."""
    return (trial.worker_cpu_util or 0.0) * trial.config.num_workers + (trial.main_cpu_util or 0.0)


def cpu_saturated(trial: TrialResult, *, usable_cpus: int, level: float = FILL) -> bool:
    """True when the workers and the main process together keep ``level`` of the usable CPUs busy."""
    return pool_cpus(trial) >= level * usable_cpus


def fill_count(*, usable_cpus: float, share: float, step_share: float = 0.0) -> int:
    """The worker count whose CPU use comes nearest ``usable_cpus``: each worker keeps ``share`` of a CPU busy and makes
    the step spend ``step_share`` of one on its batches (the function ``step_share``); rounded, not rounded up, at least
    1. A share measured a hair under 1 must not add a worker the cores cannot run (2 / 0.998 is 2, not the 3 that ran
    6-10 % slower than 2 on the 2-core VM, the main process starved beside them), and a worker that would find half a
    CPU or less is one too many. The one rule by which both searches fill the CPUs."""
    return max(1, math.floor(usable_cpus / (min(1.0, max(0.01, share)) + max(0.0, step_share)) + 0.5))


def step_share(*, busy_cpus: float, consumer_s: Optional[float], worker_batch_s: Optional[float]) -> float:
    """The CPUs the step spends on one worker's output: its CPU per batch (``busy_cpus`` while it runs, for
    ``consumer_s``) over the seconds a worker takes to make a batch (``worker_batch_s``). The step's CPU counts
    against the workers' at the pace they feed it, not at its own while it runs: a 0.2 ms step of bookkeeping keeps
    0.8 CPUs busy while it runs, and 1 % of them beside batches that come every 15 ms (counted while it ran, it sent a
    CPU-bound pool of 2 workers on 2 CPUs down to 1, at half the rate). 0 when either is unknown. Pure."""
    if not busy_cpus or not consumer_s or not worker_batch_s or worker_batch_s <= 0:
        return 0.0
    return busy_cpus * consumer_s / worker_batch_s


def worker_bound(trial: TrialResult) -> bool:
    """Whether ``trial``'s own workers limited its rate, so more of them would make more: the loop waited for data at
    least ``WAITED`` of its window while the main process kept less than ``MAIN_FREE`` of a CPU busy (receiving
    batches, the step and the loop's own work were not the limit). A pool so bound that made less than serial serving
    lost for too few workers, not for the hand-over: one worker making 5.9 MB batches that wait 21 ms on storage
    makes fewer than the main process alone (it loads them and hands them over), 8 make four times as many. Pure."""
    return (trial.ok and trial.config.num_workers > 0 and trial.stall_fraction is not None
            and trial.stall_fraction >= WAITED and trial.main_cpu_util is not None and trial.main_cpu_util < MAIN_FREE)
