"""The online search's decisions, as pure functions of what the first batches and the candidates measured: where an
epoch starts (``prior_workers``, ``starts_early``) and where the search jumps next (``jump``); whether a switch repays
itself before the epoch ends and how long a candidate's window may last are ``switching.py``'s. Nothing here measures
or reads a clock; ``online_plan.py`` feeds them. Tested on tables (tests/search/test_online_policy.py).

# NOTE [ Online convergence ]
# The first epoch is the trial, so every second a slow configuration serves is a second of training lost. The rules:
# 1. Start from the best prior. The main process serves the first batch (nothing else is known yet), and its first
#    samples are timed as they load (``measure/sample_clock.py``): as soon as a batch is known to cost so much that
#    waiting for the step's time would regret more than starting now (``starts_early``: when the prior fills the
#    CPUs, the serial batches a late start serves against the forks an early one wastes if the step wants fewer;
#    when it is the cap, a guess, those batches must pay the forks twice), the prior's workers start, inside that
#    first batch, while the main process finishes it and serves a short tail. The prior (``prior_workers``) is the
#    count that fills the CPUs beside the step (a step on the CPU runs torch's intra-op pool on the same cores as the
#    workers: its CPU per batch counts against theirs at the pace they feed it, ``capacity.step_share``) at the
#    CPU share the samples showed (the cores rule for CPU-bound loading beside a step that leaves the CPUs free,
#    several times it for loading that waits), and, once the step is known, no more than meet it (Little's law: a
#    worker makes a batch per ``fetch_s``, the loop eats one per ``consumer_s``). Serial serving goes on only while
#    the evidence says the loop could not be ``SERIAL_MARGIN`` faster with workers: they hide at most the loading, and
#    each batch they hand over costs the main process ``HANDOVER_S``. The prior's pool is what fits the memory budget
#    at the size known (NOTE [ Memory budget ] in memory.py).
# 2. Measure in time and confidence. A candidate's window opens once the batches its workers prefetched are drained
#    (the loop waited for one past those in flight at the start: the queue is empty) and closes when its rate is
#    known within half the tolerance from its own batches' jitter, or at a bound (``switching.window_bound_s``) of a
#    few per cent of the epoch (measure/window.py).
# 3. Find the knee by measurement (``jump``). The probe's regime is a prior, never a ceiling: the rate rises with the
#    workers at about one worker's rate (the steepest count measured; the serial probe's while one count alone was)
#    until something the probe cannot see stops it (the cores; a service admitting K requests at once; the main process
#    handing batches over; a step on the CPU). A candidate the loop waited for whose rate is below its workers times one
#    worker's rate, beyond the tolerance, is past that knee: the search goes down to the knee (``knee``: the best rate
#    measured over one worker's, with twice the tolerance of headroom), and between it and the best while a jump down
#    falls short; never below a pool when none came near serial serving (the knee keeps a pool's rate). One beside a
#    step on the CPU that keeps every CPU busy goes down to the count that fills the CPUs with it. Otherwise, with CPUs
#    to spare, it is scaled up to what meets the step or fills the CPUs, in one move; one that keeps up is cut to the
#    fewest Little's law says still keep up. The CPUs' fill is a prediction too: workers that each wait on more than
#    the CPUs (a mix of decoding and reads) overlap those waits with the CPUs' work, and more of them than fill the CPUs
#    at their measured use can still make more; while the jump up to them gained twice the tolerance and the CPUs have
#    room, the climb doubles them past the fill (``past_the_fill``), and the next measurement says whether it paid.
#    A window the loop never waited in (``TrialResult.drained`` False) measured
#    the loop's pace while the prefetched batches lasted, not the workers': when the workers are only a little slower
#    than the loop their queue drains over hundreds of batches, far past any window, so such a candidate is weighed at
#    the rate Little's law gives its workers from the serial probe, when that is lower (``sustained``); and no candidate
#    holds more than ``IN_FLIGHT_SHARE`` of the epoch in flight (``measurable_cap``): it would serve its window from its
#    queue. A jump up that measures below the best so far beyond the tolerance is rolled back at once (the selection
#    keeps the best), except the first pool below serial serving for its own workers (``capacity.worker_bound``: the
#    loop waited for them while the main process was free; one worker loads and hands over what the main process loaded
#    alone), which is scaled up as above. At most ``MAX_JUMPS`` jumps per search. Then serial serving is measured as any
#    candidate when the workers chosen do not beat its most hopeful estimate by ``SERIAL_CHECK`` (``serial_in_doubt``):
#    the probe's first steps are slow while a step warms up, and a step on the CPU loses to workers that take its cores,
#    which only a window of serial serving in the same loop shows. The choice is the fewest workers within the tolerance
#    of the best measured.
# 4. A switch must repay itself (``switching.repays``): when the rest of the epoch is too short for the gain predicted
#    over the run in force (``switching.gain_over``: a count that only saves workers is predicted at the best's rate,
#    so leaving a candidate that fell short of the best gains what it lost) to cover what the switch costs the loop
#    (starting the workers: forking them on the loop's thread, then the wait for their first batch, as the largest
#    pool started so far measured it, ``switching.fork_s``, recorded as each window completes; a window at a risk of
#    being slower), the candidate waits for the next epoch, where starting it costs what starting any configuration
#    does; when its gain would not repay that start over a whole epoch either (``switching.repays_next_epoch``) and
#    the run in force is the choice, the search ends on it (``Plan.settle``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ..loader.epochs import stall_fraction
from ..measure.window_rule import DRAIN_WAIT_S
from ..results import TrialResult
from .capacity import (DEFAULT_TOLERANCE, FILL, FORK_S, HEADROOM, WAITED, cpu_saturated, fill_count, pool_cpus,
                       step_share, worker_bound)
from .threads_policy import rate

__all__ = ["BISECT_RATIO", "EARLY_BATCHES", "EARLY_MIN_FETCH_S", "HANDOVER_S", "IN_FLIGHT_SHARE", "Jump",
           "KEEPS_UP_STALL", "MAX_JUMPS", "SERIAL_CHECK", "SERIAL_MARGIN", "cpu_share", "fills_cpus", "jump",
           "keeps_up", "knee", "measurable_cap", "past_the_fill", "prior_gain", "prior_workers", "serial_competitive",
           "serial_estimate", "serial_in_doubt", "starts_early", "steal_s", "sustained", "untimed_cap"]

HANDOVER_S = 0.5e-3
"""What the main process pays to receive one batch from a worker (unpickling, mapping its shared memory), before any
worker was measured: 0.4-0.6 ms for 64 images of 3x32x32 on this project's 2-core VM."""
SERIAL_MARGIN = 2 * DEFAULT_TOLERANCE
"""Serial serving stays while workers could not make the loop more than this much faster."""
EARLY_BATCHES = 3
"""The serial batches an early start saves: those the main process serves before the step is timed and while the
prior's workers start after it (the probe's, ``measure/window.py``'s ``PROBE_MARKS``, or its slow one and its
tail)."""
KEEPS_UP_STALL = 0.05
"""A candidate whose loop waited for data at most this share of its window keeps up with the step."""
MAX_JUMPS = 3
"""Jumps a search makes after the prior before it decides."""
SERIAL_CHECK = 1.5
"""Workers that beat the most hopeful estimate of serial serving by less than this are decided only after a window
of serial serving (``serial_in_doubt``)."""
IN_FLIGHT_SHARE = 1 / 3
"""An online candidate's batches in flight are at most this share of the epoch (``measurable_cap``): its burst, its
window and the tail drained after the last batch was drawn a third each (NOTE [ Trial timing ], 6. in
measure/run.py)."""
PARTLY_BUSY = 0.5
"""Workers each keeping less of a CPU busy than this wait on something besides the CPUs (``past_the_fill``)."""
ROOM = 0.95
"""... and a pool keeping less than this share of the usable CPUs busy leaves them some room."""
BISECT_RATIO = 1.25
"""A jump down that fell short of the best is followed by the count between them while they are this far apart."""


def serial_competitive(*, fetch_s: float, consumer_s: float, handover_s: float = HANDOVER_S,
                       margin: float = SERIAL_MARGIN, taken_s: float = 0.0, cpu_floor_s: float = 0.0) -> bool:
    """Whether serving without workers is within ``margin`` of the best workers could do: they hide the loading
    (``fetch_s`` per batch) but the loop still runs its step (``consumer_s``) and receives each batch
    (``handover_s``), slowed by the loading CPU they take from a step on the CPU (``taken_s``, ``steal_s``), and no
    pool makes a batch in less than its loading CPU over the CPUs (``cpu_floor_s``). Pure."""
    return fetch_s + consumer_s <= (1.0 + margin) * max(consumer_s + max(handover_s, taken_s), cpu_floor_s)


def steal_s(*, fetch_cpu_s: float, consumer_s: float, busy_cpus: float, usable_cpus: int) -> float:
    """What a batch's workers cost a step on the CPU: the loading CPU seconds that do not fit in the CPUs the step
    (``busy_cpus``) leaves while it runs, weighed by the share of the CPUs the step holds (an intra-op pool
    waiting on the core a worker took loses about all of that time: beside a CNN keeping 1.9 of 2 CPUs busy for 50 ms,
    10 ms of decoding finds 5 ms free and costs the step about 5 ms; 2 workers made that epoch 10x slower), at most the
    step's own CPU time (a step of bookkeeping loses no more than it runs). 0 beside a step that keeps no CPU busy (a
    GPU's). Pure."""
    if busy_cpus <= 0 or usable_cpus <= 0:
        return 0.0
    free = max(0.0, usable_cpus - busy_cpus)
    return min(busy_cpus * consumer_s, max(0.0, fetch_cpu_s - free * consumer_s) * min(1.0, busy_cpus / usable_cpus))


def cpu_share(*, fetch_s: float, fetch_cpu_s: float, fetch_delay_s: Optional[float] = None) -> float:
    """How busy loading keeps a CPU, 0.01 to 1: its CPU seconds over its wall seconds less those it spent waiting for
    a CPU (run queue: on a busy machine that is not waiting for data). Pure."""
    running = fetch_s - (fetch_delay_s or 0.0)
    return min(1.0, max(0.01, fetch_cpu_s / running)) if running > 0 else 1.0


def prior_workers(*, fetch_s: float, fetch_cpu_s: float, consumer_s: Optional[float], usable_cpus: int,
                  cap: int, fetch_delay_s: Optional[float] = None, busy_cpus: float = 0.0) -> int:
    """The workers an epoch starts with, from the first batch's cost (``fetch_s`` wall, ``fetch_cpu_s`` CPU and
    ``fetch_delay_s`` run-queue seconds per batch in the main process) and the step's (``consumer_s``; None while no
    step was timed; ``busy_cpus``: the CPUs it keeps busy, ``capacity.step_cpus``): 0 when serial
    serving is competitive (``serial_competitive``, counting the loading CPU workers would take from the step,
    ``steal_s``); else the count that fills the CPUs beside the step (``capacity.step_share``) at the loading's
    ``cpu_share`` (``capacity.fill_count``: the cores rule when loading is CPU-bound beside a step that leaves the
    CPUs free, fewer beside a step on the CPU, more when loading waits, at most ``max(8, 2 x CPUs)`` before the step is
    timed) and, once the step is known, no more than meet it with ``HEADROOM`` (Little's law: 68 ms batches beside a
    5 ms step need 15). Never above ``cap``. Pure."""
    if cap < 1 or fetch_s <= 0:
        return 0
    if consumer_s is not None and serial_competitive(
            fetch_s=fetch_s, consumer_s=consumer_s,
            taken_s=steal_s(fetch_cpu_s=fetch_cpu_s, consumer_s=consumer_s, busy_cpus=busy_cpus,
                            usable_cpus=usable_cpus), cpu_floor_s=fetch_cpu_s / max(1, usable_cpus)):
        return 0
    share = cpu_share(fetch_s=fetch_s, fetch_cpu_s=fetch_cpu_s, fetch_delay_s=fetch_delay_s)
    meets = math.ceil(HEADROOM * fetch_s / consumer_s - 1e-9) if consumer_s else untimed_cap(usable_cpus)
    fill = fill_count(usable_cpus=usable_cpus, share=share,
                      step_share=step_share(busy_cpus=busy_cpus, consumer_s=consumer_s, worker_batch_s=fetch_s))
    return max(1, min(cap, fill, meets))


def prior_gain(*, fetch_s: float, consumer_s: Optional[float], workers: int, handover_s: float = HANDOVER_S) -> float:
    """The share by which ``workers`` are predicted to beat serial serving (for ``repays``): the serial loop takes
    ``fetch_s + consumer_s`` a batch, the workers' the longer of the step plus a hand-over and their loading per batch
    (``fetch_s / workers``). Pure."""
    if workers < 1 or fetch_s <= 0:
        return 0.0
    step = consumer_s or 0.0
    return (fetch_s + step) / max(step + handover_s, fetch_s / workers) - 1.0


def measurable_cap(*, epoch_batches: Optional[int], prefetch_factor: int) -> Optional[int]:
    """The most workers an online candidate may have and still be measured in an epoch of ``epoch_batches``: their
    batches in flight (``prefetch_factor`` each) at most ``IN_FLIGHT_SHARE`` of the epoch. The window opens once the
    loop drained what they prefetched and closes when the last batch was drawn (NOTE [ Trial timing ], 6. in
    measure/run.py); a pool that holds most of an epoch in flight serves it from its queue, and measures the loop's
    pace, not its own. None when the epoch's length is unknown. Pure."""
    if not epoch_batches:
        return None
    return max(1, int(IN_FLIGHT_SHARE * epoch_batches) // max(1, prefetch_factor))


def untimed_cap(usable_cpus: int) -> int:
    """The most workers a prior starts before the step is timed: ``max(8, 2 x CPUs)``. Pure."""
    return max(8, 2 * usable_cpus)


def fills_cpus(*, fetch_s: float, fetch_cpu_s: float, usable_cpus: int, fetch_delay_s: Optional[float] = None) -> bool:
    """Whether the prior before the step is timed is the count that fills the usable CPUs (loading busy enough that
    ``capacity.fill_count`` is under the cap of ``prior_workers``), rather than that cap: a guess. Pure."""
    share = cpu_share(fetch_s=fetch_s, fetch_cpu_s=fetch_cpu_s, fetch_delay_s=fetch_delay_s)
    return fill_count(usable_cpus=usable_cpus, share=share) <= untimed_cap(usable_cpus)


EARLY_MIN_FETCH_S = 0.05
"""A batch that loads faster than this never starts the prior's workers before the step is timed: its serial batches
save little, and workers started early run beside the step the probe times (a step on the CPU, slowed by them, then
reads slow, and the CPUs it keeps busy unknown)."""


def starts_early(*, fetch_s: float, workers: int, fills: bool, fork_s: float = FORK_S) -> bool:
    """Whether the prior's ``workers`` start before the first batch is served, on an estimate of its cost
    (``fetch_s``, from its first samples; NOTE [ Online convergence ], 1.). When the prior fills the CPUs
    (``fills``), a step timed later can only want fewer: if it keeps the count, starting late lost the
    ``EARLY_BATCHES`` serial batches (its workers fork either way); if it wants fewer, starting early lost forking
    ``workers`` less those batches; the choice of least regret is early when ``2 x EARLY_BATCHES x fetch_s >= workers
    x fork_s``. Otherwise the prior is the cap, a guess the step may move either way: early only when those batches
    pay for forking the workers twice (now, and again for another count). Never below ``EARLY_MIN_FETCH_S``. Pure."""
    if workers < 1 or fetch_s < EARLY_MIN_FETCH_S:
        return False
    if fills:
        return 2 * EARLY_BATCHES * fetch_s >= workers * fork_s
    return EARLY_BATCHES * fetch_s >= 2 * workers * fork_s


@dataclass(frozen=True)
class Jump:
    """The next worker count to measure and why (for the log and ``Decision.why``); ``gain``: the share by which it
    is predicted to beat the best so far (0 when it only saves workers)."""

    workers: int
    why: str
    gain: float = 0.0


def keeps_up(trial: TrialResult) -> bool:
    """The loop hardly waited for data during ``trial``'s window: at most ``KEEPS_UP_STALL`` of it, or no longer a batch
    on average than a queued batch takes to be handed over (``window_rule.DRAIN_WAIT_S``: beside a short step, the
    hand-over alone is a tenth of the time, and more workers do not shorten it). Pure."""
    if trial.stall_fraction is not None and trial.stall_fraction <= KEEPS_UP_STALL:
        return True
    return trial.fetch_s_per_batch is not None and trial.fetch_s_per_batch <= DRAIN_WAIT_S


def sustained(trial: TrialResult, *, serial: Optional[TrialResult], usable_cpus: int) -> TrialResult:
    """``trial`` as the online search weighs it (NOTE [ Online convergence ], 3.): as measured, unless its window
    never drained (``drained`` False) and its workers make fewer samples than the loop's pace it measured, by Little's
    law from ``serial`` (the first batches in the main process: a worker makes a batch per ``fetch_s`` less its
    run-queue wait, at most ``usable_cpus / cpu_share`` of them at once). Then that rate, the wait for data and the
    stall it implies beside the step measured, marked not steady with the reason. Pure."""
    n = trial.config.num_workers
    if not trial.ok or trial.drained is not False or serial is None or not n or not trial.batches:
        return trial
    fetch_s = (serial.fetch_s_per_batch or 0.0) - (serial.fetch_delay_s_per_batch or 0.0)
    if fetch_s <= 0:
        return trial
    share = cpu_share(fetch_s=serial.fetch_s_per_batch or 0.0, fetch_cpu_s=serial.fetch_cpu_s_per_batch or 0.0,
                      fetch_delay_s=serial.fetch_delay_s_per_batch)
    paced = rate(trial)
    per_batch = paced * trial.window_s / trial.batches
    making = min(n, usable_cpus / share) * per_batch / fetch_s
    if making >= paced:
        return trial
    longer_s = per_batch / making - per_batch / paced
    period_s = per_batch / making
    wait_s = (trial.fetch_s_per_batch or 0.0) + longer_s
    return dataclasses.replace(
        trial, samples_per_s=making, fetch_s_per_batch=wait_s, stall_fraction=stall_fraction(wait_s, period_s),
        steady=False, reason=f"its queue never ran dry: {paced:,.0f} samples/s was the loop's pace while the "
                             f"prefetched batches lasted; {n} workers make about {making:,.0f} by Little's law")


def knee(trials: Sequence[TrialResult], *, serial: Optional[TrialResult], batch_size: int,
         tolerance: float = DEFAULT_TOLERANCE) -> Optional[int]:
    """The fewest workers that reach the plateau the worker counts in ``trials`` measured (NOTE [ Online convergence ],
    3.): the rate rises with the workers at one worker's rate, then stops (a core count, a service that admits K
    requests at once, the main process handing batches over), so the knee of that curve is the best rate measured
    over one worker's rate, with twice the ``tolerance`` of headroom. One worker's rate is the
    steepest measured (a count's rate over its workers; the fewest workers are the least contended), or, while one
    count alone was measured (it may be past the knee already: 40 workers at a service admitting 16), the serial
    probe's (a batch per ``fetch_s`` less its run-queue wait) when that is more. Not once two were: a worker also
    hands its batch over, which the probe does not (5.9 MB batches: one worker in a pool made 605/s where the probe
    read 730; 5 workers at 2,620/s were taken for past a knee at 4, and 16 made 3,700). None when no worker count
    measured a rate. Pure."""
    ok = [t for t in trials if t.ok and t.config.num_workers > 0]
    if not ok:
        return None
    slopes = [rate(t) / t.config.num_workers for t in ok]
    if len({t.config.num_workers for t in ok}) < 2 and serial is not None and serial.fetch_s_per_batch:
        fetch_s = serial.fetch_s_per_batch - (serial.fetch_delay_s_per_batch or 0.0)
        if fetch_s > 0:
            slopes.append(batch_size / fetch_s)
    slope = max(slopes)
    best = max(rate(t) for t in ok)
    return max(1, math.ceil((1.0 + 2 * tolerance) * best / slope - 1e-9))


def serial_estimate(serial: Optional[TrialResult], trials: Sequence[TrialResult], *,
                    batch_size: int) -> Optional[float]:
    """What serial serving would make, samples/s, by the most hopeful reading of what was measured: its own rate when
    it was measured steadily; else a batch per its loading time (``serial``'s ``fetch_s``, the probe's) plus the
    shortest step any candidate timed (a step is slower beside workers that take its CPUs, and while it warms up). None
    when no loading time is known. Pure."""
    if serial is None:
        return None
    if serial.ok and serial.steady:
        return rate(serial)
    steps = [t.consumer_s_per_batch for t in [serial, *trials] if t.consumer_s_per_batch is not None]
    if not serial.fetch_s_per_batch:
        return rate(serial) if serial.ok else None
    return batch_size / (serial.fetch_s_per_batch + min(steps, default=0.0))


def serial_in_doubt(chosen: TrialResult, *, serial: Optional[TrialResult], trials: Sequence[TrialResult],
                    batch_size: int) -> bool:
    """Whether serving without workers must be measured before ``chosen`` (with workers) is decided: serial serving
    was measured only in its first batches (the probe; an early start times their loading alone) and its most hopeful
    estimate (``serial_estimate``) is within ``SERIAL_CHECK`` of ``chosen``'s rate; False when nothing of it is known
    (a re-tune from a cached decision). A step on the CPU loses to workers that
    take its CPUs (a CNN trained on 2 cores ran 1.33x slower beside one worker than with none), and the first batches'
    step is slow while it warms up: only a window of serial serving in the same loop tells. Pure."""
    if not chosen.ok or not chosen.config.num_workers or serial is None or (serial.ok and serial.steady):
        return False
    estimate = serial_estimate(serial, trials, batch_size=batch_size)
    return estimate is not None and rate(chosen) < SERIAL_CHECK * estimate


def past_the_fill(last: TrialResult, fewer: Sequence[TrialResult], *, usable_cpus: int,
                  tolerance: float = DEFAULT_TOLERANCE) -> Optional[float]:
    """The gain predicted for doubling ``last``'s workers past the count that fills the CPUs at their measured use (NOTE
    [ Online convergence ], 3.), or None when that fill bounds the climb: the loop waited for them (``WAITED``), each
    kept less than ``PARTLY_BUSY`` of a CPU busy (they wait on more than the CPUs), the pool and the main process kept
    the CPUs busy enough that their fill would stop a doubling (over half of ``FILL``) yet left them room (under
    ``ROOM``), and the jump up to them from the most of ``fewer`` gained at least twice the ``tolerance``; then half
    that jump's gain per doubling. A pool that leaves the CPUs idle is bent by something else (a knee). Pure."""
    below = max(fewer, key=lambda t: t.config.num_workers, default=None)
    n, busy = last.config.num_workers, pool_cpus(last)
    if below is None or not last.worker_cpu_util or last.worker_cpu_util >= PARTLY_BUSY or \
            (last.stall_fraction or 0.0) < WAITED or not FILL / 2 < busy / usable_cpus < ROOM or rate(below) <= 0:
        return None
    gained = rate(last) / rate(below) - 1.0
    if gained < 2 * tolerance:
        return None
    return gained / max(1.0, math.log2(n / below.config.num_workers)) / 2


def _fell_short(ok: Sequence[TrialResult], good: int) -> bool:
    """Whether a count below ``good`` (the fewest workers within the tolerance of the best) was measured after one of
    ``good`` or more: a jump down that fell short, after which the search goes between (``_between``)."""
    reached = False
    for t in ok:
        reached = reached or t.config.num_workers >= good
        if reached and 0 < t.config.num_workers < good:
            return True
    return False


def jump(trials: Sequence[TrialResult], *, serial: Optional[TrialResult], consumer_s: Optional[float],
         batch_size: int, usable_cpus: int, cap: int, tolerance: float = DEFAULT_TOLERANCE,
         busy_cpus: float = 0.0) -> Optional[Jump]:
    """Where the search goes after the worker counts ``trials`` measured (oldest first; ``serial``: the first
    batches' costs in the main process, its probe; None when none was timed; ``busy_cpus``: the CPUs the step keeps
    busy, ``capacity.step_cpus``), or None to decide now (NOTE [ Online convergence ], 3.):
    - the last measured below the best beyond ``tolerance``: after a jump up, None (a roll-back: the selection keeps
      the best), unless it is the first pool, below serial serving for its own workers (``capacity.worker_bound``):
      then on as below; after a jump down, the (geometric) middle between it and the best, while they are more than a
      quarter apart;
    - the loop waited for it: past the knee of the measured curve (``knee``: its rate under one worker's rate times
      its workers beyond ``tolerance``), down to the knee, unless a jump down fell short already (what lies between is
      the middle's, above), no pool came within it of serial serving (the knee keeps a pool's rate with fewer
      workers) or its workers still pay past the CPUs' fill (``past_the_fill``: the CPUs bend its curve, not a
      limit the probe cannot see);
      beside a step on the CPU that it keeps waiting for CPUs (saturated), down to the count that fills
      the CPUs with the step (``capacity.step_share``); otherwise, with CPUs to spare, up to the
      count that meets the step with ``HEADROOM`` or fills the CPUs at the measured use per worker, when that is more
      than ``tolerance`` above it, or to twice its workers while they still pay past that fill (``past_the_fill``;
      saturated CPUs otherwise end the climb); a jump up that gained less than half the ``tolerance`` over fewer
      workers stops the climb, as does a count above it that made as much; one above that made less sends it halfway
      there;
    - it kept up: the fewest that still keep up by Little's law (half as many when no batch was timed in the main
      process), when that is more than ``tolerance`` below it.
    A count already measured (or failed: a ceiling) is never proposed again. Pure."""
    measured: Mapping[int, Optional[float]] = {t.config.num_workers: (rate(t) if t.ok else None) for t in trials}
    ok = [t for t in trials if t.ok]
    if not ok or not ok[-1].config.num_workers or trials[-1] is not ok[-1]:
        return None
    last, top = ok[-1], max(ok, key=rate)
    n, best = last.config.num_workers, rate(top)
    fewer = [t for t in ok if 0 < t.config.num_workers < n]
    if rate(last) < (1.0 - tolerance) * best and (top.config.num_workers or fewer or not worker_bound(last)):
        return _between(n, top.config.num_workers, measured)
    ceiling = min((c for c, r in measured.items() if r is None and c > 0), default=cap + 1)
    if not keeps_up(last):
        at_knee = knee(trials, serial=serial, batch_size=batch_size, tolerance=tolerance)
        good = min((t.config.num_workers for t in ok if t.config.num_workers and rate(t) >= (1.0 - tolerance) * best),
                   default=None)  # None: no pool came near serial serving, and the knee saves workers at their rate
        past = past_the_fill(last, fewer, usable_cpus=usable_cpus, tolerance=tolerance)
        if at_knee is not None and good and past is None and not _fell_short(ok, good) and \
                at_knee < (1.0 - tolerance) * good and at_knee not in measured:
            return Jump(at_knee, f"{n} workers made {rate(last):,.0f} samples/s, less than {n} times what one worker "
                                 f"makes: the rate stops rising near {at_knee} workers")
        busy = pool_cpus(last)
        if busy_cpus and cpu_saturated(last, usable_cpus=usable_cpus) and last.worker_cpu_util:
            beside = fill_count(usable_cpus=usable_cpus, share=last.worker_cpu_util,
                                step_share=step_share(busy_cpus=busy_cpus, consumer_s=consumer_s,
                                                      worker_batch_s=n * batch_size / rate(last)))
            if beside < (1.0 - tolerance) * n and beside not in measured:
                return Jump(beside, f"the step keeps {busy_cpus:.1f} of {usable_cpus} CPUs busy and {n} workers take "
                                    f"the rest and more: {beside} fill the CPUs with it")
        if (cpu_saturated(last, usable_cpus=usable_cpus) and past is None) or not consumer_s:
            return None
        if fewer and rate(last) <= (1.0 + tolerance / 2) * max(rate(t) for t in fewer):
            return None  # the last jump up gained nothing: the model's bottleneck is elsewhere
        above = [t for t in ok if t.config.num_workers > n]
        if any(rate(t) >= (1.0 - tolerance) * rate(last) for t in above):
            return None  # more workers were measured and made as much: the plateau
        needed = HEADROOM * batch_size / consumer_s
        by_step = n * needed / rate(last)
        by_cpu = n * FILL * usable_cpus / busy if busy > 0 else math.inf
        if past is not None:
            by_cpu = max(by_cpu, 2.0 * n)
        target = min(cap, ceiling - 1, math.ceil(min(by_step, by_cpu) - 1e-9))
        if above:  # more workers made less (too many for the CPUs): the peak lies between, try the middle
            target = min(target, math.ceil(math.sqrt(n * min(t.config.num_workers for t in above)) - 1e-9))
        if target > (1.0 + tolerance) * n and target not in measured:
            predicted = min(needed, rate(last) * min(target, by_cpu) / n)  # no faster than the CPUs let it
            if past is not None:
                predicted = min(needed, rate(last) * (1.0 + past))
            gain = max(0.0, predicted / best - 1.0)
            return Jump(target, f"the loop waited for data {last.stall_fraction or 0:.0%} of {n} workers' window: "
                                f"{target} workers predicted to meet the step", gain=gain)
        return None
    if not consumer_s:
        return None
    return _fewest_that_keep_up(n, serial, consumer_s=consumer_s, usable_cpus=usable_cpus, busy_cpus=busy_cpus,
                                tolerance=tolerance, measured=measured)


def _fewest_that_keep_up(n: int, serial: Optional[TrialResult], *, consumer_s: float, usable_cpus: int,
                         busy_cpus: float, tolerance: float, measured: Mapping[int, Optional[float]]) -> Optional[Jump]:
    """``jump``'s move from ``n`` workers that kept up with a step of ``consumer_s``: the fewest that still keep up by
    Little's law from the serial probe's loading (``serial``), no more than fill the CPUs beside the step; half as many
    when no batch was timed in the main process. None when that is not ``tolerance`` below ``n`` or was measured."""
    fetch_s = (serial.fetch_s_per_batch or 0.0) if serial is not None else 0.0
    if fetch_s > 0 and serial is not None:
        fetch_cpu_s, fetch_delay_s = serial.fetch_cpu_s_per_batch or 0.0, serial.fetch_delay_s_per_batch
        share = cpu_share(fetch_s=fetch_s, fetch_cpu_s=fetch_cpu_s, fetch_delay_s=fetch_delay_s)
        fewest = max(1, min(n, math.ceil(HEADROOM * (fetch_s - (fetch_delay_s or 0.0)) / consumer_s - 1e-9),
                            fill_count(usable_cpus=usable_cpus, share=share,
                                       step_share=step_share(busy_cpus=busy_cpus, consumer_s=consumer_s,
                                                             worker_batch_s=fetch_s))))
    else:  # no batch was timed in the main process (a re-tune from a cached decision): halve
        fewest = max(1, n // 2)
    if fewest < (1.0 - tolerance) * n and fewest not in measured:
        return Jump(fewest, f"{n} workers kept up with the step: {fewest} predicted to keep up too")
    return None


def _between(n: int, best: int, measured: Mapping[int, Optional[float]]) -> Optional[Jump]:
    """After ``n`` workers measured below the best (``best`` workers) beyond the tolerance: when ``n`` was a jump down,
    the geometric middle between them (the knee lies there), while they are more than ``BISECT_RATIO`` apart and the
    middle was not measured; after a jump up, None (a roll-back)."""
    if n >= best or best <= BISECT_RATIO * n or best - n <= 1:
        return None
    middle = min(best - 1, max(n + 1, math.ceil(math.sqrt(n * best) - 1e-9)))
    if middle in measured:
        return None
    return Jump(middle, f"{n} workers fell short of the {best} measured best: {middle} between them")
