"""Drawn workloads: online tuning and trials against fixed worker counts on workloads the library was not shaped on.

    AUTOLOADER_BENCH_QUICK=1 AUTOLOADER_BENCH_DRAWN_SEEDS=0-2 pytest tests/benchmarks/test_bench_drawn.py --benchmarks -s
    pytest tests/benchmarks/test_bench_drawn.py --benchmarks -s      # seeds 0-23 + one fresh seed, ~40 min on 2 cores

Each workload is ``drawn_workloads.draw(seed)``: a family spanning an axis the machine probe cannot see (a hidden
concurrency ceiling, the CPU and waiting share of a sample, a step that sleeps or burns the CPU, fork and first-batch
costs, object memory the workers copy, big samples), its other parameters drawn; its best epoch lasts about 1-4 s on
2 cores. For each workload, one loader after the other in this process (each started once the processes of the one
before it are gone), the same user loop (``for batch in loader: step(batch)``, the drawn step), shuffled, 2 epochs
each:

- **the sweep**: plain DataLoaders with ``persistent_workers=True`` at fixed ``num_workers`` (``COUNTS``, up to the
  memory cap ``SWEEP_MEMORY_BYTES``), epoch 1 including the workers' start-up, epoch 2 steady. Order: the count the
  spec's estimate guesses, the cores rule, ``num_workers=0``, then the others upwards, stopped after ``STALE`` counts
  above the best that gained nothing (``GAIN``) and once the sweep has run ``AUTOLOADER_BENCH_DRAWN_SWEEP_S``. An epoch
  still running after ``CUT`` times the best of that epoch so far is stopped, shown as "> s (~s)": a lower bound and
  an estimate from its rate; epoch 2 is not run after a stopped epoch 1 with fewer workers than the best epoch 1's
  (no start-up to blame). Among them: **serial** (``num_workers=0``) and **the cores rule** (``cores_rule()``:
  ``num_workers`` = the usable CPUs of ``probe_machine``, as ``test_bench_online_cores.py`` uses N on an N-core
  host);
- **the oracle**, by the epoch it is compared to: the best plain DataLoader of the sweep at epoch 1 (oracle e1) and
  at epoch 2 (oracle e2), each timed again after the runs below and the mean of the two taken;
- **online**: ``make_loader(dataset, batch_size, shuffle=True, cache=False)`` (the default: tuned online), epochs 1
  and 2, ``make_loader``'s own time counted in epoch 1;
- **trials**: ``make_loader(..., tuning="trials", step=step, cache=False)``: its pre-pass, epochs 1 and 2;
- the memory families (``MEMORY_FAMILIES``) also run online and trials under ``memory_budget=B``, while a thread
  samples what the loaders add to the process tree (workers' USS summed over every descendant + /dev/shm used beyond
  the start: ``test_bench_memory.Peak``), the sweep's counts included. B lies ``spec.budget_share`` of the way from
  the sweep's one-worker peak to its largest pool's, so that some counts fit and some do not; **the best count that
  fits**: the sweep's count whose peak is <= B with the fastest epoch 2;
- **reproducibility**: on the first workload of each family in ``REPEAT_FAMILIES``, online runs
  ``AUTOLOADER_BENCH_DRAWN_REPEAT`` times in all; the decisions agree when every decided ``num_workers`` is within
  +-1 of their median, or every run's epoch 2 within 5 % of the fastest's (``reproducible``).

Reported (``report()``), as speeds (a ratio > 1: the tuned loader was faster): the distribution over workloads (the
worst, the worst decile, the median) of online e1 / the better of serial and the cores rule, online e2 / oracle e2,
trials' (pre-pass + e1 against the better rule, e2 against oracle e2), peak / budget and rate / the best count that
fits, each against its target (``TARGETS``), and a table per workload. Asserted only what must hold anywhere: every
whole epoch delivers every sample once, no process outlives its loader, no tuned epoch is an order of magnitude off
the oracle's. A workload's optional runs (under a budget, repeats) are skipped once it has run
``AUTOLOADER_BENCH_DRAWN_WORKLOAD_S``.

Environment: ``AUTOLOADER_BENCH_DRAWN_SEEDS`` (ranges and seeds, e.g. ``0-23`` (default) or ``3,7,12``),
``AUTOLOADER_BENCH_DRAWN_FRESH`` (``0``: no fresh seed; else one drawn from the time, printed, and added),
``AUTOLOADER_BENCH_DRAWN_REPEAT`` (online runs on the repeated workloads, default 3, quick 2; 0 or 1: none),
``AUTOLOADER_BENCH_DRAWN_SWEEP_S`` (default 150), ``AUTOLOADER_BENCH_DRAWN_WORKLOAD_S`` (default 420),
``AUTOLOADER_BENCH_DRAWN_LOGS`` (a directory: each workload's autoloader log at INFO, online and trials),
``AUTOLOADER_BENCH_QUICK`` (half the samples, a shorter sweep), ``AUTOLOADER_BENCH_TABLE``. The run is added to
tests/benchmarks/results/drawn.md (``bench_results``; ``AUTOLOADER_BENCH_RESULTS`` another directory, ``0`` none).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
import torch
from torch.utils.data import DataLoader

from autoloader import make_loader
from autoloader.probe import probe_machine
from bench_results import Run
from drawn_workloads import MIB, DrawnDataset, Spec, Step, draw, parse_seeds
from helpers import emit_table, wait_no_children
from test_bench_memory import SAMPLE_S, SAMPLER_SHARE, Peak
from test_bench_online import describe, shut_down

pytestmark = [pytest.mark.benchmark_suite, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")]

QUICK = os.environ.get("AUTOLOADER_BENCH_QUICK", "") not in ("", "0")
COUNTS = (0, 1, 2, 4, 8, 16) if QUICK else (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
"""The fixed ``num_workers`` the sweep may time."""
QUICK_SCALE = 0.5
CUT = 3.0
"""A sweep epoch still running after this many times the best of that epoch so far is stopped."""
GAIN, STALE = 0.03, 2
"""The sweep stops going up after ``STALE`` counts above the best that beat no best epoch by ``GAIN``."""
SWEEP_MEMORY_BYTES = 3 << 30
"""The sweep's pools stay under this, by the spec's own figures (the objects a worker copies, its batches in flight):
the machine is shared."""
SWEEP_S = float(os.environ.get("AUTOLOADER_BENCH_DRAWN_SWEEP_S", "150"))
WORKLOAD_S = float(os.environ.get("AUTOLOADER_BENCH_DRAWN_WORKLOAD_S", "420"))
REPEAT = int(os.environ.get("AUTOLOADER_BENCH_DRAWN_REPEAT", "2" if QUICK else "3"))
REPEAT_FAMILIES = ("ceiling", "cpu-step")
NOISY = 0.25
"""A row whose oracle's two timings (before and after the tuned runs) differ by more than this share is marked † and
left out of the summary's "steady rows": on a shared machine another program's load came or went meanwhile (a torch
step on every core slows several times over when another process takes one)."""
REPRO_WORKERS, REPRO_RATE = 1, 0.05
"""Reproducible: every decided num_workers within this many of their median, or every epoch 2 within this share of
the fastest's."""
TARGETS = {"online e1/rule": 0.90, "online e2/oracle": 0.95, "trials e2/oracle": 0.95, "online peak/budget": 1.0,
           "trials peak/budget": 1.0, "online rate/fits": 0.90, "trials rate/fits": 0.90}
"""The targets of the drawn benchmark (peak/budget: at most; the others: at least)."""
LOGS = os.environ.get("AUTOLOADER_BENCH_DRAWN_LOGS")


FIXED = parse_seeds(os.environ.get("AUTOLOADER_BENCH_DRAWN_SEEDS", "0-23"))
FRESH: Optional[int] = None if os.environ.get("AUTOLOADER_BENCH_DRAWN_FRESH", "") == "0" else \
    int(time.time() * 1000) % 1_000_000
SEEDS = FIXED + ([FRESH] if FRESH is not None and FRESH not in FIXED else [])
SPECS = {s: (draw(s).scaled(QUICK_SCALE) if QUICK else draw(s)) for s in SEEDS}
REPEATED = {next(s for s in SEEDS if SPECS[s].family == f) for f in REPEAT_FAMILIES
            if any(SPECS[s].family == f for s in SEEDS)} if REPEAT >= 2 else set()
print(f"\ndrawn workloads: seeds {FIXED} + fresh seed {FRESH}; best epochs estimated at "
      f"{sum(s.estimate_s for s in SPECS.values()):.0f} s in all, the run at ~"
      f"{sum((80 * s.estimate_s + 60) if s.memory else (40 * s.estimate_s + 20) for s in SPECS.values()) / 60:.0f}"
      f" min (a rough guess from earlier runs on the shared 2-core VM)")


@functools.lru_cache(maxsize=None)
def cores_rule() -> int:
    """THE cores rule: ``num_workers`` = the usable CPUs the probe reads (cgroup quota and affinity counted)."""
    return probe_machine(disk=False, gpus=False).cpu.usable


# ---------------------------------------------------------------- one epoch of the user's loop

@dataclass
class Timed:
    """One epoch of the user's loop: whole (``complete``), or stopped at ``wall_s`` after ``batches``; ``exact``: a
    whole epoch delivered every sample once."""

    wall_s: float
    batches: int
    samples: int
    first_s: float
    complete: bool
    exact: bool = False

    def estimate_s(self, total: int) -> float:
        """The whole epoch's seconds: measured, or its first batch plus the rest at the rate it ran after it."""
        if self.complete:
            return self.wall_s
        if self.batches < 2:
            return math.inf
        return self.first_s + (self.wall_s - self.first_s) * (total - 1) / (self.batches - 1)

    def text(self, total: int) -> str:
        return f"{self.wall_s:.2f}" if self.complete else f"> {self.wall_s:.1f} (~{self.estimate_s(total):.0f})"


def user_epoch(loader: Any, step: Step, n: int, stop_after_s: float = math.inf) -> Timed:
    """``for batch in loader: step(batch)``, its wall time from ``iter()`` on, stopped once it ran ``stop_after_s``;
    whether a whole epoch delivered every index of ``n`` once."""
    seen: List[torch.Tensor] = []
    batches = samples = 0
    first = 0.0
    started = time.perf_counter()
    it = iter(loader)
    try:
        for batch in it:
            seen.append(batch[0])
            batches += 1
            samples += len(batch[0])
            if batches == 1:
                first = time.perf_counter() - started
            step(batch)
            if time.perf_counter() - started > stop_after_s:
                return Timed(time.perf_counter() - started, batches, samples, first, False)
        wall = time.perf_counter() - started
    finally:
        del it
    got = torch.cat(seen) if seen else torch.zeros(0, dtype=torch.long)
    exact = len(got) == n and bool((torch.bincount(got, minlength=n) == 1).all())
    return Timed(wall, batches, samples, first, True, exact)


def settled(timeout_s: float = 30.0) -> None:
    """Wait until no child process is left (a collected loader's workers exit on their own time)."""
    gc.collect()
    left = wait_no_children(timeout_s)
    assert not left, f"processes outlived their loader by {timeout_s:.0f} s: {[(p.pid, p.name()) for p in left]}"


class Peaks:
    """``Peak`` for a memory workload, nothing for the others, one per run: ``begin()`` reads
    /dev/shm's use as the run's baseline (a long-lived use by another program on the machine counts only from then
    on), ``end()`` is the run's peak (None without sampling)."""

    def __init__(self, sample: bool) -> None:
        self.sample = sample
        self.peak: Optional[Peak] = None

    def begin(self) -> None:
        self.end()
        if self.sample:
            self.peak = Peak()

    def end(self) -> Optional[int]:
        if self.peak is None:
            return None
        value = self.peak.take()
        self.peak.close()
        self.peak = None
        return value


# ---------------------------------------------------------------- the sweep

@dataclass
class Point:
    workers: int
    e1: Timed
    e2: Optional[Timed]
    peak: Optional[int]

    def text(self, total: int) -> str:
        e2 = "-" if self.e2 is None else self.e2.text(total)
        peak = "" if self.peak is None else f", {self.peak / MIB:,.0f} MiB"
        return f"{self.workers}: {self.e1.text(total)} / {e2}{peak}"


def plain_point(dataset: DrawnDataset, step: Step, workers: int, peaks: Peaks, *, cut1: float = math.inf,
                cut2: float = math.inf, e2_after_cut: bool = True, epochs: int = 2) -> Point:
    """A plain DataLoader at ``workers``, persistent, ``epochs`` epochs (1 or 2); its workers gone before it
    returns."""
    spec = dataset.spec
    settled()
    peaks.begin()
    loader = DataLoader(dataset, spec.batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0, prefetch_factor=2 if workers else None)
    try:
        e1 = user_epoch(loader, step, spec.n, cut1)
        e2 = user_epoch(loader, step, spec.n, cut2) if epochs == 2 and (e1.complete or e2_after_cut) else None
    finally:
        loader._iterator = None  # persistent workers: shut them down now (the point must leave none behind)
        del loader
        gc.collect()
    settled()
    return Point(workers, e1, e2, peaks.end())


def sweep_cap(spec: Spec) -> int:
    """The most workers the sweep starts: their copies of the objects and their batches in flight (2 each) within
    ``SWEEP_MEMORY_BYTES``."""
    per_worker = spec.worker_copy_bytes() + 2 * spec.batch_size * spec.sample_bytes
    return max(1, min(COUNTS[-1], SWEEP_MEMORY_BYTES // max(1, per_worker)))


def sweep_order(spec: Spec) -> Tuple[List[int], List[int], List[int]]:
    """The references (the estimate's guess: the nearest count at or above it; the cores rule; serial), the counts
    below the guess from the top down, and those above it from the bottom up."""
    cap = sweep_cap(spec)
    counts = [c for c in COUNTS if c <= cap]
    guess = next((c for c in counts if c >= spec.workers_guess), counts[-1])
    first = [guess] + [c for c in (min(cores_rule(), cap), 0) if c != guess]
    return (first, [c for c in reversed(counts) if c < guess and c not in first],
            [c for c in counts if c > guess and c not in first])


@dataclass
class Sweep:
    points: Dict[int, Point] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    def best(self, epoch: int, among: Optional[Sequence[int]] = None) -> Optional[Point]:
        """The point with the shortest whole epoch ``epoch`` (1 or 2), among the counts ``among`` (default all)."""
        def timed(p: Point) -> Optional[Timed]:
            return p.e1 if epoch == 1 else p.e2
        whole = [p for p in self.points.values() if (among is None or p.workers in among)
                 and timed(p) is not None and timed(p).complete]  # type: ignore[union-attr]
        return min(whole, key=lambda p: timed(p).wall_s, default=None)  # type: ignore[union-attr]

    def best_s(self, epoch: int) -> float:
        best = self.best(epoch)
        return math.inf if best is None else (best.e1 if epoch == 1 else best.e2).wall_s  # type: ignore[union-attr]


def _timed(sweep: Sweep, dataset: DrawnDataset, step: Step, peaks: Peaks, workers: int) -> Point:
    """``workers`` timed against the sweep's best epochs so far (``CUT``); epoch 2 skipped after a stopped epoch 1
    with fewer workers than the best epoch 1's (its epoch 1 lost on its rate, not on its start)."""
    best1 = sweep.best(1)
    point = plain_point(dataset, step, workers, peaks, cut1=CUT * sweep.best_s(1), cut2=CUT * sweep.best_s(2),
                        e2_after_cut=best1 is None or workers >= best1.workers)
    sweep.points[workers] = point
    return point


def run_sweep(dataset: DrawnDataset, step: Step, peaks: Peaks) -> Sweep:
    """The references; then down from the guess until a count lost both epochs (stopped, or epoch 2 skipped: fewer
    workers lose more); then up from the guess until ``STALE`` counts above the best gained nothing; within
    ``SWEEP_S``."""
    sweep = Sweep()
    first, down, up = sweep_order(dataset.spec)
    deadline = time.perf_counter() + SWEEP_S
    for workers in first:
        _timed(sweep, dataset, step, peaks, workers)
    for k, workers in enumerate(down):
        if time.perf_counter() > deadline:
            sweep.notes.append(f"sweep stopped after {SWEEP_S:.0f} s: {down[k:] + up} not timed")
            return sweep
        point = _timed(sweep, dataset, step, peaks, workers)
        if not point.e1.complete and (point.e2 is None or not point.e2.complete):
            if down[k + 1:]:
                sweep.notes.append(f"{workers} workers lost both epochs: {down[k + 1:]} not timed")
            break
    stale = 0
    for k, workers in enumerate(up):
        if time.perf_counter() > deadline:
            sweep.notes.append(f"sweep stopped after {SWEEP_S:.0f} s: {up[k:]} not timed")
            break
        before = (sweep.best_s(1), sweep.best_s(2))
        point = _timed(sweep, dataset, step, peaks, workers)
        gained = (point.e1.complete and point.e1.wall_s < (1 - GAIN) * before[0]) or \
            (point.e2 is not None and point.e2.complete and point.e2.wall_s < (1 - GAIN) * before[1])
        stale = 0 if gained else stale + 1
        if stale >= STALE:
            if up[k + 1:]:
                sweep.notes.append(f"{STALE} counts above the best gained nothing: {up[k + 1:]} not timed")
            break
    return sweep


def time_what_fits(dataset: DrawnDataset, step: Step, sweep: Sweep, peaks: Peaks, budget: int) -> None:
    """The largest count of ``COUNTS`` that fits ``budget`` timed whole when the sweep has no whole epoch 2 of it (a
    count the unconstrained best outran, or one the sweep skipped): a count fits by its measured peak, or, where none
    was measured, by the most a worker of the sweep's pools of 2 or more took (all pools without them); down the
    counts while a new peak passes the budget (3 timings at most)."""
    cap = sweep_cap(dataset.spec)
    for _ in range(3):
        sizes = {w: p.peak / w for w, p in sweep.points.items() if w > 0 and p.peak}
        per_worker = max((v for w, v in sizes.items() if w >= 2), default=max(sizes.values(), default=None))

        def fits(workers: int) -> bool:
            known = sweep.points.get(workers)
            if known is not None and known.peak is not None:
                return known.peak <= budget
            return per_worker is not None and workers * per_worker <= budget

        top = next((w for w in reversed(COUNTS) if 0 < w <= cap and fits(w)), None)
        known = sweep.points.get(top) if top is not None else None
        if top is None or (known is not None and known.e2 is not None and known.e2.complete):
            return
        sweep.points[top] = again = plain_point(dataset, step, top, peaks)
        before = "not timed" if known is None else f"{(known.peak or 0) / MIB:,.0f} MiB, epoch 2 stopped or skipped"
        sweep.notes.append(f"{top} workers timed whole as the largest count that fits the budget ({before}; now "
                           f"{(again.peak or 0) / MIB:,.0f} MiB)")
        if again.peak is not None and again.peak <= budget:
            return


# ---------------------------------------------------------------- make_loader

@dataclass
class Tuned:
    """One ``make_loader`` run: its own seconds (trials' pre-pass), epochs 1 (``made_s`` included) and 2."""

    mode: str
    budget: Optional[int]
    made_s: float
    e1: Timed
    e2: Timed
    config: str
    workers: Optional[int]
    """None: online decided nothing in its two epochs."""
    decisions: str
    bottleneck: Optional[str]
    measured: str
    peak: Optional[int]

    @property
    def label(self) -> str:
        return self.mode + ("" if self.budget is None else " (budget)")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: List[str] = []
        self.setFormatter(logging.Formatter("%(relativeCreated)9.0f ms %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextlib.contextmanager
def autoloader_log(into: List[str], title: str) -> Iterator[None]:
    """The ``autoloader`` logger's records at INFO, appended to ``into`` under ``title``."""
    logger, handler = logging.getLogger("autoloader"), _Lines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        into += [f"--- {title}"] + handler.lines


def measured(result: Any) -> str:
    """What each candidate of a ``TuneResult`` measured: workers, status, rate, workers' CPU share, footprint."""
    out = []
    for t in result.trials:
        text = f"{t.config.num_workers}w {t.status}"
        text += f" {t.samples_per_s:,.0f}/s" if t.samples_per_s else ""
        text += f" cpu {t.worker_cpu_util:.2f}" if t.worker_cpu_util is not None else ""
        text += f" {t.footprint_bytes / MIB:,.0f} MiB" if t.footprint_bytes else ""
        text += f" ({t.reason})" if t.reason and t.status != "ok" else ""
        out.append(text)
    return "; ".join(out) or "none"


def tuned_run(dataset: DrawnDataset, step: Step, mode: str, peaks: Peaks, log: List[str], *,
              memory_budget: Optional[int] = None) -> Tuned:
    """``make_loader`` as a user calls it (online: the default; trials: ``tuning="trials", step=step``), 2 epochs."""
    spec = dataset.spec
    kwargs: Dict[str, Any] = dict(shuffle=True, cache=False)
    if mode == "trials":
        kwargs.update(tuning="trials", step=step)
    if memory_budget is not None:
        kwargs["memory_budget"] = memory_budget
    settled()
    peaks.begin()
    torch.manual_seed(spec.seed)
    with autoloader_log(log, f"{mode}" + (f", memory_budget={memory_budget}" if memory_budget else "")):
        started = time.perf_counter()
        loader = make_loader(dataset, spec.batch_size, **kwargs)
        made_s = time.perf_counter() - started
        try:
            e1 = user_epoch(loader, step, spec.n)
            e1.wall_s += made_s
            e2 = user_epoch(loader, step, spec.n)
            result = loader.tuning
            decided = mode == "trials" or bool(loader.decisions)
            out = Tuned(mode, memory_budget, made_s, e1, e2,
                        result.config.label() if decided else f"undecided ({result.source})",
                        result.config.num_workers if decided else None,
                        describe(loader.decisions) if mode == "online" else result.reason,
                        getattr(result, "bottleneck", None), measured(result), None)
        finally:
            shut_down(loader)
            del loader
            gc.collect()
    settled()
    out.peak = peaks.end()
    return out


# ---------------------------------------------------------------- one workload

ROWS: List[Dict[str, Any]] = []
LOADS: List[float] = []
UPTIME: List[str] = []


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def budget_for(spec: Spec, sweep: Sweep) -> Optional[int]:
    """``spec.budget_share`` of the way from the one-worker pool's peak to the largest pool's, in whole MiB."""
    peaks = {w: p.peak for w, p in sweep.points.items() if w > 0 and p.peak is not None}
    if spec.budget_share is None or len(peaks) < 2:
        return None
    low, high = peaks[min(peaks)], peaks[max(peaks)]
    return math.ceil((low + spec.budget_share * max(0, high - low)) / MIB) * MIB


def retimed(dataset: DrawnDataset, step: Step, sweep: Sweep, peaks: Peaks) -> Tuple[float, float, str, float]:
    """Oracle e1 and e2: the sweep's best of each epoch, timed again, the mean of both timings; the timings as text,
    and their spread (the larger over the smaller, less 1, the wider of the two epochs)."""
    out, spread, noise = [], [], 0.0
    bests = [sweep.best(1), sweep.best(2)]
    assert None not in bests, f"no whole epoch 1 or 2 in the sweep: {sweep.notes}"
    agains: Dict[int, Point] = {}
    for epoch, best in ((2, bests[1]), (1, bests[0])):  # one timing serves both when they are one count
        assert best is not None
        if best.workers not in agains:
            agains[best.workers] = plain_point(dataset, step, best.workers, peaks, epochs=epoch)
    for epoch, best in ((1, bests[0]), (2, bests[1])):
        assert best is not None
        first = best.e1 if epoch == 1 else best.e2
        again = agains[best.workers]
        second = again.e1 if epoch == 1 else again.e2
        assert first is not None and second is not None and second.complete and second.exact
        out.append(statistics.mean([first.wall_s, second.wall_s]))
        spread.append(f"e{epoch} {best.workers}w {first.wall_s:.2f}/{second.wall_s:.2f}")
        noise = max(noise, max(first.wall_s, second.wall_s) / min(first.wall_s, second.wall_s) - 1)
    return out[0], out[1], ", ".join(spread), noise


def reproducible(runs: Sequence[Tuned]) -> str:
    """Whether the runs decided alike: "yes (workers)", "yes (rate)" or "no" (``REPRO_WORKERS``, ``REPRO_RATE``)."""
    counts = [r.workers for r in runs]
    if None not in counts and all(abs(c - statistics.median(counts)) <= REPRO_WORKERS for c in counts):
        return "yes (workers)"
    fastest = min(r.e2.wall_s for r in runs)
    if all(r.e2.wall_s <= (1 + REPRO_RATE) * fastest for r in runs):
        return "yes (rate)"
    return "**no**"


def run_workload(spec: Spec, row: Dict[str, Any], log: List[str]) -> List[Timed]:
    """Every run of one workload, recorded in ``row``; the whole epochs that must deliver every sample once."""
    started = time.perf_counter()
    step = spec.step()
    row["step"] = step.describe()
    dataset = spec.dataset()
    peaks = Peaks(spec.memory)
    whole: List[Timed] = []
    try:
        with dataset.active():
            sweep = run_sweep(dataset, step, peaks)
            row["sweep"], row["notes"] = sweep, sweep.notes
            runs = [tuned_run(dataset, step, mode, peaks, log) for mode in ("online", "trials")]
            budget = budget_for(spec, sweep)
            if budget is not None and time.perf_counter() - started < WORKLOAD_S:
                row["budget"] = budget
                time_what_fits(dataset, step, sweep, peaks, budget)
                runs += [tuned_run(dataset, step, mode, peaks, log, memory_budget=budget)
                         for mode in ("online", "trials")]
            elif spec.memory:
                row["notes"].append("no budgeted run: " + ("the sweep measured fewer than 2 pools" if budget is None
                                                           else f"the workload ran past {WORKLOAD_S:.0f} s"))
            row["runs"] = {r.label: r for r in runs}
            if spec.seed in REPEATED and time.perf_counter() - started < WORKLOAD_S:
                again = [tuned_run(dataset, step, "online", peaks, log) for _ in range(REPEAT - 1)]
                row["repeats"] = [row["runs"]["online"]] + again
                runs += again
            row["oracle_e1"], row["oracle_e2"], row["oracle_spread"], row["noise"] = retimed(dataset, step, sweep,
                                                                                            peaks)
            whole += [t for r in runs for t in (r.e1, r.e2)]
            whole += [t for p in sweep.points.values() for t in (p.e1, p.e2) if t is not None and t.complete]
    finally:
        peaks.end()
        settled()
        dataset.close()
    row["seconds"] = time.perf_counter() - started
    return whole


def ratios(row: Dict[str, Any]) -> None:
    """The row's speed ratios (a ratio > 1: the tuned loader was faster) and memory shares."""
    spec, sweep, runs = row["spec"], row["sweep"], row["runs"]
    total = spec.batches
    serial, cores = sweep.points.get(0), sweep.points.get(min(cores_rule(), sweep_cap(spec)))
    rule = {name: p.e1.estimate_s(total) for name, p in (("serial", serial), ("cores", cores)) if p is not None}
    row["rule_name"] = min(rule, key=rule.__getitem__)
    row["rule_e1"] = rule[row["rule_name"]]
    online, trials = runs["online"], runs["trials"]
    row["online e1/rule"] = row["rule_e1"] / online.e1.wall_s
    row["online e1/oracle"] = row["oracle_e1"] / online.e1.wall_s
    row["online e2/oracle"] = row["oracle_e2"] / online.e2.wall_s
    row["trials e1/rule"] = row["rule_e1"] / trials.e1.wall_s
    row["trials e2/oracle"] = row["oracle_e2"] / trials.e2.wall_s
    budget = row.get("budget")
    if budget is None:
        return
    fits = [w for w, p in sweep.points.items() if w == 0 or (p.peak is not None and p.peak <= budget)]
    best = sweep.best(2, among=fits)
    row["fits"] = best
    for mode in ("online", "trials"):
        run = runs.get(f"{mode} (budget)")
        if run is None:
            continue
        row[f"{mode} peak/budget"] = (run.peak or 0) / budget
        if best is not None and best.e2 is not None:
            row[f"{mode} rate/fits"] = best.e2.wall_s / run.e2.wall_s


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}-{SPECS[s].family}" for s in SEEDS])
def test_drawn_workload(benchmark, seed):
    spec = SPECS[seed]
    LOADS.append(os.getloadavg()[0])
    if not UPTIME:
        UPTIME.append(uptime())
    print(f"\n{spec.line()}")
    row: Dict[str, Any] = {"spec": spec, "fresh": seed == FRESH, "load": [os.getloadavg()[0]]}
    log: List[str] = []
    whole = benchmark.pedantic(run_workload, args=(spec, row, log), rounds=1, iterations=1)
    row["load"].append(os.getloadavg()[0])
    ratios(row)
    ROWS.append(row)
    write_log(spec, log)
    print(details(row))
    assert all(t.exact for t in whole), f"{spec.id}: an epoch did not deliver every sample once"
    fits = row.get("fits")
    for run in row["runs"].values():  # nothing an order of magnitude off (under a budget: off what fits)
        e2 = row["oracle_e2"] if run.budget is None else None if fits is None else fits.e2.wall_s
        if e2 is not None:
            assert run.e2.wall_s <= 10 * e2 + 5, (spec.id, run.label, run.e2.wall_s, e2)
        if run.mode == "online" and run.budget is None:
            assert run.e1.wall_s <= 10 * row["oracle_e1"] + 10, (spec.id, run.label, run.e1.wall_s)


def write_log(spec: Spec, log: List[str]) -> None:
    if LOGS:
        os.makedirs(LOGS, exist_ok=True)
        with open(os.path.join(LOGS, f"seed-{spec.seed}-{spec.family}.log"), "w") as fh:
            fh.write(spec.line() + "\n" + "\n".join(log) + "\n")


# ---------------------------------------------------------------- the report

METRICS: Tuple[Tuple[str, str, bool], ...] = (
    ("online e1/rule", "online epoch 1 speed / the better of serial and the cores rule's (> 1: online faster)", True),
    ("online e2/oracle", "online epoch 2 speed / oracle e2's (> 1: online faster)", True),
    ("online e1/oracle", "online epoch 1 speed / oracle e1's (> 1: online faster)", True),
    ("trials e1/rule", "trials' pre-pass + epoch 1 speed / the better rule's epoch 1 (> 1: trials faster)", True),
    ("trials e2/oracle", "trials' epoch 2 speed / oracle e2's (> 1: trials faster)", True),
    ("online peak/budget", "online under the budget: peak / budget (<= 1: it held)", False),
    ("trials peak/budget", "trials under the budget: peak / budget (<= 1: it held)", False),
    ("online rate/fits", "online under the budget: epoch 2 rate / the best count that fits' (> 1: faster)", True),
    ("trials rate/fits", "trials under the budget: epoch 2 rate / the best count that fits' (> 1: faster)", True),
)
"""Each reported ratio: its key, what it is (its direction), and whether higher is better."""


def steady(row: Dict[str, Any]) -> bool:
    """Whether the row's oracle timed alike twice (within ``NOISY``): the machine's other load moved little."""
    return row.get("noise", math.inf) <= NOISY


def distribution(key: str, higher: bool, rows: Optional[List[Dict[str, Any]]] = None
                 ) -> Optional[Tuple[float, str, float, float, int]]:
    """(worst, its workload, the worst decile (the ceil(n/10)-th worst), median, n) of ``key`` over ``rows``
    (default all)."""
    values = [(r[key], r["spec"].id) for r in (ROWS if rows is None else rows) if r.get(key) is not None]
    if not values:
        return None
    ordered = sorted(values, key=lambda v: v[0], reverse=not higher)
    decile = ordered[math.ceil(len(ordered) / 10) - 1][0]
    return ordered[0][0], ordered[0][1], decile, statistics.median(v for v, _ in values), len(values)


def met(key: str, value: float) -> str:
    target = TARGETS.get(key)
    if target is None:
        return "reported"
    ok = value <= target if key.endswith("peak/budget") else value >= target
    return f"{'met' if ok else '**not met**'} ({'<=' if key.endswith('peak/budget') else '>='} {target:.2f})"


def summary() -> List[str]:
    out = ["| ratio (direction) | workloads | worst (workload) | worst decile | median | target | steady rows: "
           "n, worst (workload), worst decile, median |",
           "|---|---|---|---|---|---|---|"]
    calm = [r for r in ROWS if steady(r)]
    for key, words, higher in METRICS:
        found = distribution(key, higher)
        if found is None:
            continue
        worst, where, decile, median, n = found
        quiet = distribution(key, higher, calm)
        quiet_text = "-" if quiet is None else \
            f"{quiet[4]}, {quiet[0]:.2f} ({quiet[1]}), {quiet[2]:.2f}, {quiet[3]:.2f}"
        out.append(f"| {key}: {words} | {n} | {worst:.2f} ({where}) | {decile:.2f} | {median:.2f} | "
                   f"{met(key, worst)} | {quiet_text} |")
    return out


def _r(row: Dict[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    return f"**{value:.2f}**" if met(key, value).startswith("**") else f"{value:.2f}"


def table() -> List[str]:
    out = ["| workload | rule e1 s (serial / cores) | oracle e1: w, s | oracle e2: w, s | online e1 / e2 s | "
           "online e1/rule | online e2/oracle | online in force (bottleneck) | trials pre-pass + e1 / e2 s | "
           "trials e1/rule | trials e2/oracle | trials choice | load |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        spec, sweep, runs = r["spec"], r["sweep"], r["runs"]
        total = spec.batches
        serial, cores = sweep.points.get(0), sweep.points.get(min(cores_rule(), sweep_cap(spec)))
        rule = " / ".join("-" if p is None else p.e1.text(total) for p in (serial, cores))
        b1, b2 = sweep.best(1), sweep.best(2)
        on, tr = runs["online"], runs["trials"]
        out.append(
            f"| {spec.id}{' (fresh)' if r['fresh'] else ''}{'' if steady(r) else ' †'} | {rule} | {b1.workers}, {r['oracle_e1']:.2f} | "
            f"{b2.workers}, {r['oracle_e2']:.2f} | {on.e1.wall_s:.2f} / {on.e2.wall_s:.2f} | "
            f"{_r(r, 'online e1/rule')} | {_r(r, 'online e2/oracle')} | {on.config} ({on.bottleneck or '-'}) | "
            f"{tr.made_s:.1f} + {tr.e1.wall_s - tr.made_s:.2f} / {tr.e2.wall_s:.2f} | {_r(r, 'trials e1/rule')} | "
            f"{_r(r, 'trials e2/oracle')} | {tr.config} | {r['load'][0]:.1f}/{r['load'][1]:.1f} |")
    return out


def memory_table() -> List[str]:
    rows = [r for r in ROWS if r["spec"].memory]
    if not rows:
        return []
    out = ["| workload | budget MiB | best count that fits: w, e2 s | online (budget): choice, peak MiB, peak/budget, "
           "e2 s, rate/fits | trials (budget): choice, peak MiB, peak/budget, e2 s, rate/fits | unconstrained online: "
           "choice, peak MiB |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("budget") is None:
            out.append(f"| {r['spec'].id} | - | - | - | - | {'; '.join(r['notes'])} |")
            continue
        fits = r.get("fits")
        cells = []
        for mode in ("online", "trials"):
            run = r["runs"].get(f"{mode} (budget)")
            cells.append("-" if run is None else
                         f"{run.config}, {(run.peak or 0) / MIB:,.0f}, {_r(r, f'{mode} peak/budget')}, "
                         f"{run.e2.wall_s:.2f}, {_r(r, f'{mode} rate/fits')}")
        free = r["runs"]["online"]
        fit_text = "-" if fits is None or fits.e2 is None else f"{fits.workers}, {fits.e2.wall_s:.2f}"
        out.append(f"| {r['spec'].id} | {r['budget'] / MIB:,.0f} | {fit_text} | {cells[0]} | {cells[1]} | "
                   f"{free.config}, {(free.peak or 0) / MIB:,.0f} |")
    return out


def repro_table() -> List[str]:
    rows = [r for r in ROWS if r.get("repeats")]
    if not rows:
        return []
    out = [f"Reproducibility: online run {REPEAT} times on the same workload. Rule: the decisions agree when every "
           f"decided num_workers is within ±{REPRO_WORKERS} of their median (\"workers\"), or every run's epoch 2 "
           f"within {REPRO_RATE:.0%} of the fastest's (\"rate\").", "",
           "| workload | decided (in force after epoch 2) | epoch 1 s | epoch 2 s | reproducible |", "|---|---|---|---|---|"]
    for r in rows:
        runs = r["repeats"]
        out.append(f"| {r['spec'].id} | {'; '.join(t.config for t in runs)} | "
                   f"{', '.join(f'{t.e1.wall_s:.2f}' for t in runs)} | {', '.join(f'{t.e2.wall_s:.2f}' for t in runs)} "
                   f"| {reproducible(runs)} |")
    return out


def details(r: Dict[str, Any]) -> str:
    spec, sweep = r["spec"], r["sweep"]
    lines = [f"- **{spec.id}**{' (fresh seed)' if r['fresh'] else ''}: {spec.line()}. Step: {r['step']}. "
             f"{r['seconds']:.0f} s in all.",
             f"  - sweep (workers: e1 s / e2 s{', peak' if spec.memory else ''}): "
             + "; ".join(p.text(spec.batches) for _, p in sorted(sweep.points.items()))
             + (f" ({'; '.join(r['notes'])})" if r["notes"] else "") + f"; oracle timed twice: {r['oracle_spread']}"]
    for run in r["runs"].values():
        peak = "" if run.peak is None else f", peak {run.peak / MIB:,.0f} MiB"
        lines.append(f"  - {run.label}: {run.config}, bottleneck {run.bottleneck or '-'}; {run.decisions}; e1 "
                     f"{run.e1.wall_s:.2f} s (make_loader {run.made_s:.2f} s), e2 {run.e2.wall_s:.2f} s{peak}; "
                     f"measured: {run.measured}")
    return "\n".join(lines)


def worst_three() -> List[str]:
    out = []
    for key in ("online e1/rule", "online e2/oracle"):
        rows = sorted((r for r in ROWS if r.get(key) is not None), key=lambda r: r[key])[:3]
        out.append(f"- {key}: " + "; ".join(f"{r['spec'].id} {r[key]:.2f} (online {r['runs']['online'].config}: "
                                            f"{r['runs']['online'].decisions})" for r in rows))
    return out


def report() -> str:
    fresh = f"fresh seed {FRESH}" if FRESH is not None else "no fresh seed"
    contiguous = len(FIXED) > 1 and FIXED == list(range(FIXED[0], FIXED[-1] + 1))
    head = [f"Seeds {FIXED[0]}-{FIXED[-1]}" if contiguous else f"Seeds {', '.join(map(str, FIXED)) or 'none'}",
            f" + {fresh} ({len(ROWS)} workloads{', quick: half the samples' if QUICK else ''}); cores rule "
            f"num_workers={cores_rule()}; sweep {list(COUNTS)}, an epoch stopped at {CUT:g}x the best so far. "
            f"Oracle e1 / e2: the best plain DataLoader of the sweep, by the epoch it is compared to (timed twice, "
            f"the mean; †: the two timings differ by more than {NOISY:.0%}, the row is left out of the steady "
            f"rows). Speeds as ratios, higher is faster; **bold**: the target not met. "
            f"`uptime` at the start: {UPTIME[0] if UPTIME else '-'}; at the end: {uptime()}."]
    out = ["".join(head), "", *summary(), "", *table(), ""]
    mem = memory_table()
    if mem:
        out += [f"Under a memory budget (peak: workers' USS + /dev/shm beyond the start, sampled every "
                f"{SAMPLE_S * 1e3:.0f} ms or more, the sampler kept under {SAMPLER_SHARE:.0%} of a core):", "",
                *mem, ""]
    rep = repro_table()
    if rep:
        out += [*rep, ""]
    out += ["The worst three of each ratio, with online's decisions:", "", *worst_three(), "",
            "Per workload:", "", *(details(r) for r in ROWS)]
    return "\n".join(out)


@pytest.fixture(scope="module", autouse=True)
def results_file():
    run = Run.start("drawn", "Drawn workloads: online and trials against fixed worker counts")
    yield
    if not ROWS:
        return
    text = report()
    emit_table(text)
    run.write(text, loads=LOADS)
