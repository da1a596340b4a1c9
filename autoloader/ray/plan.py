"""The Ray engine's decisions, as pure functions of measurements and the cluster's shape (tested on tables in
tests/ray_engine/test_plan.py): how many CPUs the pool may hold (the guard), how many tasks to try first and next,
how many batches each task loads, how far the driver reads ahead, and which candidate to keep.

# NOTE [ Sizing the Ray pool ]
# The pool is sized as the DataLoader search sizes workers (search/policy.py), against the step:
# - The guard (``pool_cap``): a driver's pool holds at most its share of the cluster's CPUs (under torchrun every rank
#   is a driver on the same cluster), and Ray Data holds each run to it (``ExecutionResources(cpu=...)`` on the run's
#   own context, pipeline.py). Nothing more is kept back: a run has one stage, its read tasks, which load the batches
#   themselves, so no other stage of it can wait for a CPU the pool holds. (The engine used to keep one CPU free
#   after a hang measured with an actor pool behind an input stage; with ray 2.60.0 neither that layout nor read
#   tasks holding every CPU hung in tests/benchmarks/results/ray.md's runs, and the kept CPU cost the one-host pool
#   half its cores.)
# - First candidate (``first_pool``): from the cost of one batch loaded in the driver (``serial_s``) and the step's
#   (``step_s``): loading meets the step at ``HEADROOM * serial_s / step_s`` tasks, capped by the guard.
# - Block (``batches_per_task``): a task hands back its whole block at once, so the epoch's first batch waits for one
#   block (measured: Ray Data's default blocks made it wait 18-37 s, almost the whole epoch; 100-row blocks
#   1.4-2.3 s). The block is the fewest batches whose task overhead stays under ``OVERHEAD_SHARE`` of the task,
#   capped so a block loads within ``FIRST_BATCH_S`` and every task of the pool gets several blocks of an epoch
#   (``BLOCKS_PER_TASK``), so that loading overlaps the step.
# - Prefetch (``prefetch_for``): the driver reads one block ahead per task, so a pool that keeps up is never starved
#   by the driver's own queue.
# - Runs (``run_blocks``): Ray Data plans every read task of an execution before its first batch (a ``ray.put`` of
#   each, about a millisecond apiece here), so an epoch is fed as consecutive runs (source.py), the first of
#   ``FIRST_RUN_BLOCKS`` (at least two waves of the pool), each next one ``RUN_GROWTH`` times larger up to
#   ``MAX_RUN_BLOCKS``: the first batch waits for the first run's planning only, whatever the epoch's length. The next
#   run starts when the current one has no block left to launch (``next_run_at``), so the pool stays busy across
#   runs without two runs' pools at once; its order is drawn meanwhile, ``DRAW_BITE`` batches per batch served.
# - Search (``next_pool``) and choice (``choose``): double while it pays, then bisect down to the fewest CPUs within
#   ``DEFAULT_TOLERANCE`` of the best rate, as for DataLoader workers.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

from ..search.capacity import DEFAULT_TOLERANCE, HEADROOM
from .records import RayConfig, RayTrial

TASK_OVERHEAD_S = 0.01
"""Ray's cost of one map task (scheduling, the block's hand-over), seconds: a block is sized to dwarf it."""
OVERHEAD_SHARE = 0.05
FIRST_BATCH_S = 1.0
"""The most seconds one block may take to load: the epoch's first batch waits for one."""
BLOCKS_PER_TASK = 4
"""Blocks each task gets per epoch at least, so loading overlaps the step (one block per task would load the whole
epoch before the step could start on it)."""
FIRST_RUN_BLOCKS = 8
"""Blocks of an epoch's first run at least (NOTE [ Sizing the Ray pool ], runs): two waves of the pool when larger."""
RUN_GROWTH = 4
MAX_RUN_BLOCKS = 512
"""Blocks of one run at most: its planning (half a second here) overlaps the run before it."""
DRAW_BITE = 16
"""Batches of the next run's order drawn per batch served (the next run may be RUN_GROWTH times larger)."""
WAITING = 0.5
"""A batch that keeps the CPU busy less than this share of its time mostly waits: tasks then ask half a CPU."""


def pool_cpus(cluster_cpus: float, *, drivers: int = 1) -> float:
    """CPUs one driver's pool may hold: its share of the cluster's, shared by ``drivers`` (one per torchrun rank)."""
    return max(0.0, cluster_cpus) / max(1, drivers)


def pool_cap(cluster_cpus: float, *, cpus: float, drivers: int = 1, max_tasks: Optional[int] = None) -> int:
    """The most tasks of ``cpus`` CPUs each that fit ``pool_cpus`` (never under 1 when half a CPU fits: a task then
    asks less), at most ``max_tasks``; 0 when the cluster has no CPU to give."""
    room = pool_cpus(cluster_cpus, drivers=drivers)
    cap = int(math.floor(room / cpus + 1e-9))
    if cap == 0 and room >= min(cpus, 0.5) - 1e-9 and room > 0:
        cap = 1
    return cap if max_tasks is None else min(cap, max_tasks)


def task_cpus(cluster_cpus: float, *, cpu_share: Optional[float], drivers: int = 1) -> float:
    """CPUs each task asks: 1, or 0.5 when a batch mostly waits (``cpu_share`` of its wall time under
    ``WAITING``), and never more than the pool's room."""
    wanted = 0.5 if cpu_share is not None and cpu_share < WAITING else 1.0
    room = pool_cpus(cluster_cpus, drivers=drivers)
    return wanted if room >= wanted or room <= 0 else max(0.1, math.floor(room * 10) / 10)


def first_pool(*, serial_s: float, step_s: float, cap: int) -> int:
    """Tasks to try first: where loading meets the step with ``HEADROOM`` (every task that fits for a free step)."""
    if cap < 1:
        return 0
    if step_s <= 0 or serial_s <= 0:
        return cap if step_s <= 0 else 1
    return max(1, min(cap, math.ceil(HEADROOM * serial_s / step_s - 1e-9)))


def batches_per_task(*, serial_s: float, epoch_batches: int, tasks: int) -> int:
    """Batches one task loads (NOTE [ Sizing the Ray pool ], the block): the fewest whose overhead stays under
    ``OVERHEAD_SHARE`` of the task, at most what loads in ``FIRST_BATCH_S`` and small enough that each task gets
    ``BLOCKS_PER_TASK`` blocks of the epoch; at least 1."""
    if serial_s <= 0:
        wanted = 8
    else:
        wanted = math.ceil(TASK_OVERHEAD_S / (OVERHEAD_SHARE * serial_s) - 1e-9)
        wanted = min(wanted, max(1, int(FIRST_BATCH_S // serial_s)))
    share = max(1, epoch_batches // (BLOCKS_PER_TASK * max(1, tasks)))
    return max(1, min(wanted, share))


def prefetch_for(tasks: int) -> int:
    """Blocks the driver reads ahead: one per task (NOTE [ Sizing the Ray pool ], prefetch)."""
    return max(1, tasks)


def run_blocks(k: int, config: RayConfig) -> int:
    """Blocks of run ``k`` (0 the first) of an epoch under ``config`` (NOTE [ Sizing the Ray pool ], runs)."""
    first = max(FIRST_RUN_BLOCKS, 2 * (config.tasks + config.prefetch))
    return min(max(MAX_RUN_BLOCKS, first), first * RUN_GROWTH ** min(k, 16))


def next_run_at(config: RayConfig) -> int:
    """Blocks of the current run left unread when the next run starts: those of one wave and of the read-ahead, all
    launched by then (NOTE [ Sizing the Ray pool ], runs)."""
    return config.tasks + config.prefetch


def config_for(tasks: int, *, cpus: float, serial_s: float, epoch_batches: int) -> RayConfig:
    """The candidate with ``tasks`` tasks: its block and prefetch follow from the rules above."""
    return RayConfig(tasks, cpus=cpus, batches_per_task=batches_per_task(serial_s=serial_s,
                                                                          epoch_batches=epoch_batches, tasks=tasks),
                     prefetch=prefetch_for(tasks))


def next_pool(rates: Mapping[int, Optional[float]], *, cap: int,
              tolerance: float = DEFAULT_TOLERANCE) -> Optional[int]:
    """The next task count to measure (None: done), from the rates so far (None: the candidate failed). Double while
    the largest count is the best and gained over the counts below it; then bisect between the fewest within
    ``tolerance`` of the best and the largest count below it (its half when none was tried)."""
    measured = {n: r for n, r in rates.items() if r is not None}
    if not measured:
        return None
    best_rate = max(measured.values())
    best = min(n for n, r in measured.items() if r == best_rate)
    if best == max(measured) and best < cap:
        below = [r for n, r in measured.items() if n < best]
        if not below or best_rate > (1 + tolerance / 2) * max(below):
            climb = min(cap, 2 * best)
            if climb not in rates:
                return climb
    good = min(n for n, r in measured.items() if r >= (1 - tolerance) * best_rate)
    lower = max((n for n in rates if n < good), default=None)
    if lower is None:
        return good // 2 if good > 1 else None
    middle = (good + lower) // 2
    return None if good - lower <= 1 or middle in rates else middle


def choose(trials: Sequence[RayTrial], *, tolerance: float = DEFAULT_TOLERANCE) -> Optional[RayTrial]:
    """Of the trials within ``tolerance`` of the best rate: the fewest cluster CPUs, then the smallest block (the
    earliest first batch), then the smallest prefetch; None when none measured."""
    measured = [t for t in trials if t.samples_per_s is not None]
    if not measured:
        return None
    best = max(t.samples_per_s or 0.0 for t in measured)
    near = [t for t in measured if (t.samples_per_s or 0.0) >= (1 - tolerance) * best]
    return min(near, key=lambda t: (t.config.cluster_cpus, t.config.batches_per_task, t.config.prefetch,
                                    -(t.samples_per_s or 0.0)))
