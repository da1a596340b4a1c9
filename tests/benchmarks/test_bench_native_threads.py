"""Native thread pools inside workers (issue 35), measured side by side in one run.

    pytest tests/benchmarks/test_bench_native_threads.py --benchmarks -s                      # ~6 min on 2 cores
    AUTOLOADER_BENCH_WORKLOADS=numpy pytest tests/benchmarks/test_bench_native_threads.py --benchmarks -s

Two workloads (``workloads.Matmul``): every sample is four 256x256 float32 matmuls, by numpy's BLAS (``numpy``: a
pool of one thread per core in every worker unless limited) or by torch (``torch``: torch sets its own pool to 1
thread in workers, so only numpy's OpenBLAS, loaded but unused, is left to limit). For each, four kinds of rows:

- ``tune()`` with the knob (``native_threads=None``, the default): its choice;
- ``tune(native_threads=False)``: the same search with the workers' pools left alone;
- the best fixed ``num_workers`` of a sweep (``AUTOLOADER_BENCH_SWEEP``, default 0-4), plain DataLoader workers;
- the best fixed ``num_workers`` of the same sweep with ``threadpool_limits(1)`` by hand in a ``worker_init_fn``.

Every rate is a steady-state ``run_trial`` against the same ``Consumer`` (no step: the loader is the bottleneck), every
configuration measured in interleaved rounds (forward, then reverse order, ...) and the median taken, as
``test_bench_threads.py`` does; the table gives ratios to the fastest row of the workload. Asserted only what must hold
anywhere: no trial or tune leaves a worker behind, the main process's pools are as they were, every configuration
measured at least once. ``AUTOLOADER_BENCH_ROUNDS`` (default 3), ``AUTOLOADER_BENCH_TABLE`` (a path for the table).
The run is added to tests/benchmarks/results/native_threads.md (``bench_results``).
"""
from __future__ import annotations

import os
import statistics
import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from autoloader import tune
from autoloader.config import LoaderConfig
from autoloader.measure.consumer import Consumer
from autoloader.measure.trial import run_trial
from autoloader.probe import probe_machine
from autoloader.request import Request
from autoloader.results import TuneResult
from bench_results import Run
from helpers import emit_table, live_children, longer_windows, measured_as, selected_workloads
from workloads import Matmul

pytestmark = [pytest.mark.benchmark_suite, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")]

ROUNDS = int(os.environ.get("AUTOLOADER_BENCH_ROUNDS", "3"))
SWEEP = tuple(int(n) for n in os.environ.get("AUTOLOADER_BENCH_SWEEP", "0,1,2,3,4").split(",") if n.strip())
BATCH = 16
BUDGET = 20.0
MAX_WORKERS = 8
TRIAL_LIMIT = 8.0
MIN_WINDOW_S = 1.0
CASES = {"numpy": "numpy BLAS: 4 matmuls 256x256 per sample", "torch": "torch op: 4 matmuls 256x256 per sample"}
SELECTED = selected_workloads(",".join(CASES), CASES)
ROWS: List[Dict[str, Any]] = []


def limit_by_hand(worker_id: int) -> None:
    """What doctor used to tell users to write: every pool of the worker to one thread."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def parent_pools() -> List[Tuple[str, int]]:
    return sorted((p["prefix"], p["num_threads"]) for p in threadpool_info())


def assert_no_worker_left(what: str) -> None:
    left = live_children()
    assert not left, f"{what} left processes behind: {[(p.pid, p.name()) for p in left]}"


def tuned(dataset: Any, **kwargs: Any) -> TuneResult:
    result = tune(dataset, BATCH, budget=BUDGET, max_workers=MAX_WORKERS, **kwargs)
    assert_no_worker_left("tune()")
    return result


def side_by_side(rows: List[Tuple[str, Request, LoaderConfig]]) -> Dict[str, Tuple[float, int]]:
    """Every row in interleaved rounds with the same trial code and consumer: (median samples/s, failed trials)."""
    consumer = Consumer(None, torch.device("cpu"))
    rates: Dict[str, List[float]] = {label: [] for label, _, _ in rows}
    failed = {label: 0 for label, _, _ in rows}
    with longer_windows(MIN_WINDOW_S):
        for r in range(ROUNDS):
            for label, request, config in (rows if r % 2 == 0 else rows[::-1]):
                trial = run_trial(request, config, consumer=consumer, limit_s=TRIAL_LIMIT)
                assert_no_worker_left(f"the trial of {label}")
                if trial.ok:
                    rates[label].append(trial.samples_per_s)
                else:
                    failed[label] += 1
    return {label: (statistics.median(r) if r else 0.0, failed[label]) for label, r in rates.items()}


def comparison(result: TuneResult) -> str:
    """Whether the tuner measured its choice without the limit, and what it kept."""
    pairs = [t for t in result.trials if t.config.num_workers and t.config.native_threads is None]
    if result.native_threads is None and not pairs:
        return "pools left alone"
    if not pairs:
        return (f"limit {result.native_threads} kept unmeasured (the serial trial's CPU time did not exceed its wall "
                f"time)")
    return result.reason.split("; ")[-1]


@pytest.mark.parametrize("case_id", SELECTED)
def test_native_threads_side_by_side(benchmark, case_id):
    before, load_start = parent_pools(), os.getloadavg()[0]
    dataset = Matmul(backend=case_id)
    knob = benchmark.pedantic(lambda: tuned(dataset), rounds=1, iterations=1)
    off = tuned(dataset, native_threads=False)
    plain = Request.checked(dataset, BATCH, device="cpu")
    by_hand = Request.checked(dataset, BATCH, device="cpu", dataloader_kwargs={"worker_init_fn": limit_by_hand})
    rows = [("tuned, native_threads=None (the knob)", plain, measured_as(knob.config)),
            ("tuned, native_threads=False", plain, measured_as(off.config))]
    rows += [(f"num_workers={n}", plain, LoaderConfig(n, 2 if n else None)) for n in SWEEP]
    rows += [(f"num_workers={n} + threadpool_limits(1)", by_hand, LoaderConfig(n, 2)) for n in SWEEP if n]
    measured = side_by_side(rows)
    assert parent_pools() == before, "the main process's pools are untouched"
    assert all(failed < ROUNDS for _, failed in measured.values()), measured
    best = max(rate for rate, _ in measured.values())
    fixed = max((label for label, _, _ in rows if label.startswith("num_workers") and "threadpool" not in label),
                key=lambda label: measured[label][0])
    fixed_by_hand = max((label for label, _, _ in rows if "threadpool_limits" in label),
                        key=lambda label: measured[label][0])
    row = {"id": case_id, "workload": CASES[case_id], "best": best, "load": (load_start, os.getloadavg()[0]),
           "knob": (knob.config.label(), measured[rows[0][0]][0], knob.seconds, comparison(knob)),
           "off": (off.config.label(), measured[rows[1][0]][0], off.seconds),
           "fixed": (fixed, measured[fixed][0]), "by_hand": (fixed_by_hand, measured[fixed_by_hand][0]),
           "pools": ", ".join(p.label() for p in knob.native_pools or ()) or "unknown",
           "sweep": ", ".join(f"{label}: {rate:,.0f}/s" for label, (rate, _) in measured.items())}
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "load"})
    ROWS.append(row)
    print(f"\n{case_id}: {row}")


def tables() -> str:
    cpus = probe_machine(disk=False, gpus=False).cpu.usable
    loads = [x for r in ROWS for x in r["load"]]
    out = [f"Command: `pytest tests/benchmarks/test_bench_native_threads.py --benchmarks -s` ({ROUNDS} interleaved "
           f"round(s) per configuration, tune budget {BUDGET:g} s, max_workers={MAX_WORKERS}, batch {BATCH}, no step). "
           f"Machine: {cpus} usable CPUs, shared; 1-min load average {min(loads):.1f}-{max(loads):.1f} during the run. "
           f"torch {torch.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}.", "",
           "| workload | row | configuration | samples/s | vs fastest | notes |", "|---|---|---|---|---|---|"]
    for r in ROWS:
        name, rate, seconds, how = r["knob"]
        ratio = (lambda x: f"{x / r['best']:.2f}" if r["best"] else "-")
        out.append(f"| {r['workload']} | tuned (knob on) | {name} | {rate:,.0f} | {ratio(rate)} | tuned in "
                   f"{seconds:.1f} s; {how}; a worker's pools: {r['pools']} |")
        name, rate, seconds = r["off"]
        out.append(f"| | tuned, native_threads=False | {name} | {rate:,.0f} | {ratio(rate)} | tuned in "
                   f"{seconds:.1f} s |")
        out.append(f"| | best fixed num_workers | {r['fixed'][0]} | {r['fixed'][1]:,.0f} | {ratio(r['fixed'][1])} | |")
        out.append(f"| | best fixed, threadpool_limits(1) by hand | {r['by_hand'][0]} | {r['by_hand'][1]:,.0f} "
                   f"| {ratio(r['by_hand'][1])} | load {r['load'][0]:.1f}/{r['load'][1]:.1f} |")
    out += ["", "Sweeps (medians): " + "; ".join(f"{r['id']}: {r['sweep']}" for r in ROWS)]
    return "\n".join(out)


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("native_threads", "Native thread pools inside workers: benchmark results")
    yield
    if ROWS:
        text = tables()
        emit_table(text)
        run.write(text, packages=("threadpoolctl",), loads=[x for r in ROWS for x in r["load"]])
