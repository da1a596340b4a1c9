"""Online tuning on emulated many-core hosts (issue 45): the CPU proxy to iterate on with 2 real cores.

    AUTOLOADER_BENCH_QUICK=1 pytest tests/benchmarks/test_bench_online_cores.py --benchmarks -s   # 3 rows, ~5 min
    pytest tests/benchmarks/test_bench_online_cores.py --benchmarks -s                            # 12 rows, ~35 min

The host is emulated (``tests/cores_data.py``): every batch holds one of N slots of a semaphore shared with the forked
workers for its cost in seconds of one core, and sleeps, so 2 real cores serve an N-core host; starting a worker costs
``AUTOLOADER_BENCH_FORK_S`` (default 0.05 s) in the parent before its fork and ``AUTOLOADER_BENCH_INIT_S`` (default
0.2 s) on its first batch, each holding a slot (with this VM's own fork, ~10-20 ms, 16 workers take ~1.5 s to their
first batch of 0.33 s and 32 ~2.6 s: the H200 run of ``scripts/gpu_resnet.py`` measured 1.36 and 2.70 s,
results/gpu.md). autoloader sees N usable CPUs, and the seconds a process held a slot as its CPU time (the tuner's CPU
shares read as on a real N-core host where the work is CPU-bound); waiting for a slot reads as run-queue wait.

Rows, at N = 8, 16 and 64 virtual cores, 150- and 600-batch epochs:

- **slow**: 0.33 s of one core per batch (batch 32), like the H200 ResNet-18 pipeline; the step (a ``time.sleep``,
  GPU-like: it holds no core) takes half the best loader's time per batch, ``0.165 / N`` s: **loader-bound**;
- **fast**: 20 ms of one core per batch (batch 16), a 10 ms step: **step-bound** from 3 workers on (serial loading
  is 3x slower than the step).

For each row, side by side in one run, the wall time of whole epochs of the same loop (``for batch in loader:
time.sleep(step_s)``), shuffled:

- **serial**: a plain DataLoader with ``num_workers=0``;
- **cores rule**: ``num_workers = N``;
- **oracle**: the best of a sweep of fixed ``num_workers`` (serial and the cores rule among them), each a whole
  epoch; a point still running when it has taken 1.3x the best whole epoch so far is stopped (it cannot be the best),
  and its epoch shown as "> s" with an estimate from its rate; the oracle's epoch is timed again after the online and
  trials runs, and the mean taken;
- **online**: ``make_loader(tuning="online")``, epochs 1, 2 and 3 (``make_loader``'s own time counts in epoch 1), a
  fresh cache directory per row;
- **trials**: ``make_loader(tuning="trials", step=step_s)``, its pre-pass plus epoch 1, another fresh cache.

The ratios are issue 45's "Done when", as speeds (higher is faster; the target in brackets): e1 / max(serial, cores
rule) (>= 0.97), e1 / oracle on 600-batch rows (>= 0.90), e2 / oracle (>= 0.98), e3 / e2 (>= 1 beyond noise), trials
(pre-pass + e1) against the oracle's epoch and its e1 alone. Reported, not asserted: the assertions are what must hold
anywhere (every epoch delivers every batch once, no process left behind).

Environment: ``AUTOLOADER_BENCH_CORES_ROWS`` (comma-separated row ids such as ``16c-slow-150``; default all, quick
``16c-slow-150,16c-fast-600,64c-slow-600``), ``AUTOLOADER_BENCH_FORK_S``, ``AUTOLOADER_BENCH_INIT_S``,
``AUTOLOADER_BENCH_TABLE``. The run is added to tests/benchmarks/results/online.md (``bench_results``).
"""
from __future__ import annotations

import gc
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
from torch.utils.data import DataLoader

from autoloader import make_loader
from bench_results import Run
from cores_data import CoresDataset, VirtualHost
from helpers import emit_table, wait_no_children
from test_bench_online import Epoch, describe, run_epoch, short, shut_down

pytestmark = [pytest.mark.benchmark_suite, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")]

QUICK = os.environ.get("AUTOLOADER_BENCH_QUICK", "") not in ("", "0")
FORK_S = float(os.environ.get("AUTOLOADER_BENCH_FORK_S", "0.05"))
INIT_S = float(os.environ.get("AUTOLOADER_BENCH_INIT_S", "0.2"))
ABORT = 1.3
"""A sweep point still running after this many times the best whole epoch so far is stopped."""
BATCH_S = {"slow": 0.33, "fast": 0.020}
BATCH_SIZE = {"slow": 32, "fast": 16}
FAST_STEP_S = 0.010
TARGETS = {"e1/best_rule": 0.97, "e1/oracle": 0.90, "e2/oracle": 0.98, "e3/e2": 1.0}


@dataclass(frozen=True)
class Case:
    cores: int
    kind: str
    batches: int

    @property
    def id(self) -> str:
        return f"{self.cores}c-{self.kind}-{self.batches}"

    @property
    def batch_size(self) -> int:
        return BATCH_SIZE[self.kind]

    @property
    def sample_s(self) -> float:
        return BATCH_S[self.kind] / self.batch_size

    @property
    def step_s(self) -> float:
        return 0.5 * BATCH_S["slow"] / self.cores if self.kind == "slow" else FAST_STEP_S

    @property
    def bound(self) -> str:
        return "loader" if self.kind == "slow" else "step"

    @property
    def sweep(self) -> List[int]:
        """The fixed num_workers timed, in order: the cores rule first (a good epoch to stop the others against), the
        rest from the most workers down, serial last."""
        n = self.cores
        points = {n // 4, n // 2, 3 * n // 4} if self.kind == "slow" else {2, 3, 4, 6}
        if QUICK:
            points = {n // 2, 3 * n // 4} if self.kind == "slow" else {3, 4}
        return [n] + sorted(points - {0, n}, reverse=True) + [0]


CASES = {c.id: c for c in (Case(n, kind, b) for n in (8, 16, 64) for kind in ("slow", "fast") for b in (150, 600))}
QUICK_ROWS = "16c-slow-150,16c-fast-600,64c-slow-600"
SELECTED = [r.strip() for r in os.environ.get("AUTOLOADER_BENCH_CORES_ROWS", QUICK_ROWS if QUICK else
                                              ",".join(CASES)).split(",") if r.strip()]
_unknown = sorted(set(SELECTED) - set(CASES))
if _unknown:
    raise ValueError(f"AUTOLOADER_BENCH_CORES_ROWS: unknown {_unknown}; known: {sorted(CASES)}")


# ---------------------------------------------------------------- measuring

@dataclass
class Timed:
    """One fixed configuration's epoch: whole (``complete``), or stopped at ``wall_s`` after ``batches``."""

    workers: int
    wall_s: float
    batches: int
    first_s: float
    complete: bool

    def estimate_s(self, total: int) -> float:
        """The whole epoch's seconds: measured, or its first batch plus the rest at the rate it ran after it."""
        if self.complete or self.batches < 2:
            return self.wall_s if self.complete else math.inf
        return self.first_s + (self.wall_s - self.first_s) * (total - 1) / (self.batches - 1)

    def text(self, total: int) -> str:
        return f"{self.wall_s:.1f}" if self.complete else f"> {self.wall_s:.1f} (~{self.estimate_s(total):.0f})"


def fixed_epoch(dataset: CoresDataset, case: Case, workers: int, stop_after_s: float = math.inf) -> Timed:
    """A plain DataLoader's epoch in the user's loop, stopped once it has run ``stop_after_s``."""
    loader = DataLoader(dataset, case.batch_size, shuffle=True, num_workers=workers,
                        prefetch_factor=2 if workers else None)
    started = time.perf_counter()
    batches, first = 0, 0.0
    it = iter(loader)
    try:
        for _ in it:
            batches += 1
            if batches == 1:
                first = time.perf_counter() - started
            time.sleep(case.step_s)
            if time.perf_counter() - started > stop_after_s:
                break
        else:
            return Timed(workers, time.perf_counter() - started, batches, first, True)
        return Timed(workers, time.perf_counter() - started, batches, first, False)
    finally:
        del it
        gc.collect()


def sweep(dataset: CoresDataset, case: Case) -> Dict[int, Timed]:
    timed: Dict[int, Timed] = {}
    for workers in case.sweep:
        best = min((t.wall_s for t in timed.values() if t.complete), default=math.inf)
        timed[workers] = fixed_epoch(dataset, case, workers, ABORT * best)
    return timed


@dataclass
class Online:
    epochs: List[Epoch] = field(default_factory=list)
    configs: List[str] = field(default_factory=list)
    decisions: str = ""


def online_epochs(dataset: CoresDataset, case: Case, cache: str, count: int = 3) -> Online:
    torch.manual_seed(0)
    out = Online()
    started = time.perf_counter()
    loader = make_loader(dataset, case.batch_size, shuffle=True, tuning="online", cache=cache)
    made_s = time.perf_counter() - started
    try:
        for epoch in range(count):
            e = run_epoch(loader, case.step_s)
            out.epochs.append(Epoch(e.wall_s + made_s, e.samples, e.batches) if epoch == 0 else e)
            out.configs.append(short(loader.tuning.config))
        out.decisions = describe(loader.decisions)
    finally:
        shut_down(loader)
        del loader
        gc.collect()
    return out


def trials_epoch(dataset: CoresDataset, case: Case, cache: str) -> Tuple[float, Epoch, str, str, float]:
    """Trials' pre-pass seconds, its epoch 1, its choice, what its candidates measured (rate, workers' CPU), and the
    highest CPU share a worker candidate read."""
    torch.manual_seed(0)
    started = time.perf_counter()
    loader = make_loader(dataset, case.batch_size, shuffle=True, tuning="trials", step=case.step_s, cache=cache)
    prepass_s = time.perf_counter() - started
    try:
        epoch = run_epoch(loader, case.step_s)
        result = loader.tuning
        measured = "; ".join(
            f"{t.config.num_workers}w {t.status}" + (f" {t.samples_per_s:,.0f}/s" if t.samples_per_s else "") +
            (f" cpu {t.worker_cpu_util:.2f}" if t.worker_cpu_util is not None else "") +
            (f" main {t.main_cpu_util:.2f}" if t.main_cpu_util is not None and not t.config.num_workers else "")
            for t in result.trials)
        busiest = max((t.worker_cpu_util or 0.0 for t in result.trials if t.config.num_workers), default=0.0)
        return prepass_s, epoch, short(result.config), measured, busiest
    finally:
        shut_down(loader)
        del loader
        gc.collect()


def no_process_left(what: str) -> None:
    left = wait_no_children(15)
    assert not left, f"{what} left processes behind: {[(p.pid, p.name()) for p in left]}"


ROWS: List[Dict[str, Any]] = []
LOADS: List[float] = []


# ---------------------------------------------------------------- the benchmark

@pytest.mark.parametrize("row", SELECTED)
def test_online_on_emulated_cores(benchmark, row, tmp_path):
    case = CASES[row]
    LOADS.append(os.getloadavg()[0])
    host = VirtualHost(case.cores, fork_s=FORK_S, init_s=INIT_S)
    dataset = CoresDataset(host, case.batches * case.batch_size, sample_s=case.sample_s)
    total = case.batches
    try:
        with host.emulate():
            points = sweep(dataset, case)
            no_process_left("the sweep")
            oracle = min((t for t in points.values() if t.complete), key=lambda t: t.wall_s)
            online = benchmark.pedantic(online_epochs, args=(dataset, case, str(tmp_path / "online")),
                                        rounds=1, iterations=1)
            no_process_left("online")
            prepass_s, t1, trials_config, trials_measured, busiest = trials_epoch(dataset, case,
                                                                                  str(tmp_path / "trials"))
            no_process_left("trials")
            again = fixed_epoch(dataset, case, oracle.workers)
            no_process_left("the oracle")
    finally:
        host.close()
    oracle_s = statistics.mean([oracle.wall_s, again.wall_s])
    serial, cores = points[0], points[case.cores]
    best_rule_s = min(serial.estimate_s(total), cores.estimate_s(total))
    e1, e2, e3 = (e.wall_s for e in online.epochs)
    r = {
        "row": row, "case": case, "oracle": oracle.workers, "oracle_s": oracle_s,
        "oracle_spread": abs(oracle.wall_s - again.wall_s) / min(oracle.wall_s, again.wall_s),
        "serial": serial.text(total), "cores": cores.text(total), "e1": e1, "e2": e2, "e3": e3,
        "e1/best_rule": best_rule_s / e1, "e1/oracle": oracle_s / e1, "e2/oracle": oracle_s / e2, "e3/e2": e2 / e3,
        "online_configs": online.configs, "decisions": online.decisions,
        "trials": trials_config, "prepass_s": prepass_s, "trials_e1": t1.wall_s,
        "trials/oracle": oracle_s / (prepass_s + t1.wall_s), "trials_e1/oracle": oracle_s / t1.wall_s,
        "trials_measured": trials_measured,
        "sweep": ", ".join(f"{w}: {t.text(total)}" for w, t in sorted(points.items())),
        "load": (LOADS[-1], os.getloadavg()[0]),
    }
    ROWS.append(r)
    benchmark.extra_info.update({k: v for k, v in r.items() if k not in ("case", "load")})
    print(f"\n{row}: {r}")
    for epoch in online.epochs + [t1]:
        assert epoch.batches == total, (row, epoch)
    assert all(t.batches == total for t in points.values() if t.complete) and again.complete
    # the emulation's own check: a worker holding a slot all the time reads ~1 CPU, unless the tuner stopped reading
    # the clocks emulate() patches (a new CPU reader in autoloader: patch it in cores_data.VirtualHost.emulate too)
    assert case.kind != "slow" or busiest >= 0.5, f"{row}: no worker candidate read over {busiest:.2f} CPU"


# ---------------------------------------------------------------- the table

def _ratio(r: Dict[str, Any], key: str) -> str:
    value = r[key]
    target = TARGETS.get(key)
    if key == "e1/oracle" and r["case"].batches < 600:
        target = None
    text = f"{value:.2f}"
    return f"**{text}**" if target is not None and value < target else text


def tables() -> str:
    out = [f"Emulated hosts (`tests/cores_data.py`): worker start {FORK_S:g} s in the parent before each fork + "
           f"{INIT_S:g} s on its first batch, each holding a slot. Speeds as ratios (higher is faster; **bold**: "
           f"under the target): e1/rule = the better of serial and the cores rule over online epoch 1 "
           f"(>= 0.97), e1/oracle (>= 0.90, 600-batch rows), e2/oracle (>= 0.98), e3/e2 (>= 1 beyond noise), "
           f"trials = oracle epoch over trials' pre-pass + epoch 1 (and over its epoch 1 alone).", "",
           "| row | bound | step ms | serial s | cores rule s | oracle: workers, s | online e1 / e2 / e3 s | "
           "e1/rule | e1/oracle | e2/oracle | e3/e2 | online in force after e1, e2, e3 | trials: choice, "
           "pre-pass + e1 s | trials vs oracle (e1 alone) | load |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        case = r["case"]
        out.append(
            f"| {r['row']} | {case.bound} | {case.step_s * 1e3:.1f} | {r['serial']} | {r['cores']} | "
            f"{r['oracle']}, {r['oracle_s']:.1f} (±{r['oracle_spread']:.0%}) | {r['e1']:.1f} / {r['e2']:.1f} / "
            f"{r['e3']:.1f} | {_ratio(r, 'e1/best_rule')} | {_ratio(r, 'e1/oracle')} | {_ratio(r, 'e2/oracle')} | "
            f"{_ratio(r, 'e3/e2')} | {', '.join(r['online_configs'])} | {r['trials']}, {r['prepass_s']:.1f} + "
            f"{r['trials_e1']:.1f} | {r['trials/oracle']:.2f} ({r['trials_e1/oracle']:.2f}) | "
            f"{r['load'][0]:.1f}/{r['load'][1]:.1f} |")
    out += ["", "Per row: the sweep (num_workers: whole epoch s; \"> s (~s)\": stopped, and its estimate), online's "
            "decisions, what trials measured (workers, status, rate, each worker's CPU share as the tuner read it on "
            "the virtual clock):", ""]
    for r in ROWS:
        out.append(f"- {r['row']}: sweep {r['sweep']}. Online: {r['decisions']}. Trials: {r['trials_measured']}")
    return "\n".join(out)


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("online", "Online tuning against an oracle and against trials")
    yield
    if not ROWS:
        return
    text = "### Emulated many-core hosts (`test_bench_online_cores.py`)\n\n" + tables()
    emit_table(text)
    run.write(text, loads=LOADS)
