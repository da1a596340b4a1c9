"""The tuner against an exhaustive sweep, per regime (run with ``pytest tests/benchmarks --benchmarks -s``).

For each workload: tune() once (its wall time is the benchmark), then measure every num_workers in 0..32 (plus the
tuned config when its prefetch_factor differs) in interleaved rounds (forward, then reverse order, ...), all with the
same trial code, so the tuned config, the best and the fixed rules are compared side by side under the same noise.
Then the sweep's three fastest and the tuned config are measured ``AUTOLOADER_BENCH_FINAL_ROUNDS`` (default 2) more
times, interleaved, and the best is the finalist of highest median: the maximum of a sweep's single measurements is
biased up by their noise where the counts' rates lie within a few per cent of each other (on 2 cores).
Reported per workload: tuned/best (the finalists' median rates), the rules "0" and "usable CPUs - 1" (a finalist's
median, else the sweep's) against the best, and the tuner's seconds against one sweep round's seconds. Targets: tuned/best >= 0.95 at
<= 25 % of the sweep's time.
Set AUTOLOADER_BENCH_ROUNDS (default 2) and AUTOLOADER_BENCH_TABLE (a path for the markdown table); the run is added
to tests/benchmarks/results/tuner.md (``bench_results``).
``AUTOLOADER_BENCH_QUICK=1`` (a few minutes): one round, a sweep of 11 counts in 0..32, the four workloads without a
slow step; the tuner/sweep time is then reported, not asserted (a shortened sweep is no yardstick for it).
"""
import os
import statistics

import pytest

from autoloader import tune
from autoloader.consumer import Consumer
from autoloader.probe import probe_machine
from autoloader.config import LoaderConfig
from autoloader.measure.trial import run_trial
from autoloader.request import Request
from bench_results import Run
from helpers import emit_table
from workloads import CpuBound, InMemory, JpegDecode, LatencyBound, Mixed

QUICK = os.environ.get("AUTOLOADER_BENCH_QUICK", "") not in ("", "0")
ROUNDS = int(os.environ.get("AUTOLOADER_BENCH_ROUNDS", "1" if QUICK else "2"))
SWEEP = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if QUICK else range(0, 33)
QUICK_WORKLOADS = ("in-memory", "cpu-bound", "latency-bound", "mixed")
FINALISTS = 3
FINAL_ROUNDS = int(os.environ.get("AUTOLOADER_BENCH_FINAL_ROUNDS", "2"))
BUDGET = 30.0
SWEEP_LIMIT = 4.0

WORKLOADS = {
    "in-memory": (lambda: InMemory(n=50000), 64, None),
    "in-memory, slow step": (lambda: InMemory(n=50000), 64, 0.01),
    "cpu-bound": (lambda: CpuBound(cost_s=0.002), 16, None),
    "cpu-bound, slow step": (lambda: CpuBound(cost_s=0.002), 16, 0.06),
    "latency-bound": (lambda: LatencyBound(latency_s=0.004), 16, None),
    "latency-bound, slow step": (lambda: LatencyBound(latency_s=0.004), 16, 0.02),
    "mixed": (lambda: Mixed(latency_s=0.003, cost_s=0.0005), 16, None),
    "mixed, slow step": (lambda: Mixed(latency_s=0.003, cost_s=0.0005), 16, 0.02),
    "jpeg decode": (lambda: JpegDecode(), 32, None),
}
ROWS = []


def _sweep(dataset, batch_size, step, extra):
    request = Request.checked(dataset, batch_size, step=step, device="cpu")
    consumer = Consumer(step, request.device)
    configs = [LoaderConfig(n, 2 if n else None) for n in SWEEP] + [c for c in extra if c.num_workers <= 32]
    configs = list(dict.fromkeys(configs))
    rates = {c: [] for c in configs}
    seconds = []
    for r in range(ROUNDS):
        spent = 0.0
        for config in (configs if r % 2 == 0 else configs[::-1]):
            trial = run_trial(request, config, consumer=consumer, limit_s=SWEEP_LIMIT)
            spent += trial.elapsed_s
            rates[config].append(trial.samples_per_s or 0.0)
        seconds.append(spent)
    finalists = sorted(configs, key=lambda c: statistics.median(rates[c]), reverse=True)[:FINALISTS]
    finalists += [c for c in extra[:1] if c in rates and c not in finalists]  # the tuned config
    for r in range(FINAL_ROUNDS):
        for config in (finalists[::-1] if r % 2 == 0 else finalists):
            rates[config].append(run_trial(request, config, consumer=consumer, limit_s=SWEEP_LIMIT).samples_per_s
                                 or 0.0)
    swept = {c: statistics.median(v[:ROUNDS]) for c, v in rates.items()}
    return swept, {c: statistics.median(rates[c]) for c in finalists}, statistics.median(seconds)


@pytest.mark.parametrize("name", [n for n in WORKLOADS if not QUICK or n in QUICK_WORKLOADS])
def test_tuner_vs_sweep(benchmark, name):
    if name == "jpeg decode":
        pytest.importorskip("PIL")
    make, batch_size, step = WORKLOADS[name]
    dataset = make()
    usable = probe_machine(disk=False, gpus=False).cpu.usable or 1
    result = benchmark.pedantic(lambda: tune(dataset, batch_size, step=step, budget=BUDGET, max_workers=32),
                                rounds=1, iterations=1)
    rule = LoaderConfig(max(1, usable - 1), 2)
    swept, median, sweep_s = _sweep(dataset, batch_size, step, [result.config, rule])
    rate = {**swept, **median}  # a finalist's median over all its rounds
    best_config = max(median, key=median.get)
    best = median[best_config]
    row = {
        "workload": name, "tuned": result.config.label(), "best": best_config.label(),
        "tuned/best": median[result.config] / best, "zero/best": rate[LoaderConfig(0)] / best,
        "cores-1/best": rate[rule] / best, "tuner_s": result.seconds, "sweep_s": sweep_s,
        "time_ratio": result.seconds / sweep_s, "trials": len(result.trials), "bottleneck": result.bottleneck,
    }
    benchmark.extra_info.update(row)
    ROWS.append(row)
    assert row["tuned/best"] >= 0.85, row
    if not QUICK:
        assert row["time_ratio"] <= 0.4, row


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("tuner", "The tuner against an exhaustive sweep of num_workers")
    yield
    if not ROWS:
        return
    lines = ["| workload | tuned | best in sweep | tuned/best | 0/best | (cores-1)/best | tuner s | sweep s "
             "| tuner/sweep | trials | bottleneck |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        lines.append(f"| {r['workload']} | {r['tuned']} | {r['best']} | {r['tuned/best']:.2f} | {r['zero/best']:.2f}"
                     f" | {r['cores-1/best']:.2f} | {r['tuner_s']:.1f} | {r['sweep_s']:.0f} | {r['time_ratio']:.0%}"
                     f" | {r['trials']} | {r['bottleneck']} |")
    emit_table("\n".join(lines))
    run.write("\n".join(lines))
