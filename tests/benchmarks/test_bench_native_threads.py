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

``blas-epochs`` (issue 45, item 7; ~8 min): what a new user sees, whole epochs of their loop rather than trials:
``blas_user.py`` (three 320x320 matmuls by numpy per sample; plain DataLoaders at 0, 1 and 2 workers against
``make_loader`` online epochs 1-3 and trials) run twice in fresh interpreters, once as installed and once hiding
threadpoolctl (the default install before it became a dependency). ``AUTOLOADER_BENCH_WORKLOADS=blas-epochs`` runs
only that.
The run is added to tests/benchmarks/results/native_threads.md (``bench_results``).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from autoloader import tune
from autoloader.config import LoaderConfig
from autoloader.consumer import Consumer
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
BLAS = "blas-epochs"
"""The new user's rows (issue 45, item 7): ``blas_user.py``'s epochs, with threadpoolctl and as if without it."""
SELECTED = selected_workloads(",".join([*CASES, BLAS]), [*CASES, BLAS])
BLAS_TARGET = 1.3
BLAS_ROWS: List[Dict[str, Any]] = []
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


@pytest.mark.parametrize("case_id", [c for c in SELECTED if c in CASES])
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


def blas_user(hide: bool) -> Dict[str, Any]:
    """``blas_user.py`` in a fresh interpreter (hiding threadpoolctl there only): its JSON row, the report lines."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blas_user.py")
    done = subprocess.run([sys.executable, script] + (["--hide-threadpoolctl"] if hide else []),
                          capture_output=True, text=True, timeout=1800, check=True)
    lines = done.stdout.strip().splitlines()
    row = json.loads(lines[-1])
    row["bottlenecks"] = [line.split("bottleneck: ", 1)[1] for line in lines if "bottleneck: " in line]
    row["native"] = [line.strip() for line in lines if line.strip().startswith("native thread pools per worker")]
    return row


@pytest.mark.skipif(BLAS not in SELECTED, reason=f"{BLAS} is not in AUTOLOADER_BENCH_WORKLOADS")
def test_blas_epochs_as_a_new_user(benchmark):
    load_start = os.getloadavg()[0]
    without = benchmark.pedantic(blas_user, args=(True,), rounds=1, iterations=1)
    with_it = blas_user(False)
    for row in (without, with_it):
        row["load"] = (load_start, os.getloadavg()[0])
        BLAS_ROWS.append(row)
        print(f"\n{BLAS}: {row}")
    assert_no_worker_left("blas_user.py")
    assert not without["threadpoolctl"] and with_it["threadpoolctl"]


def blas_table() -> str:
    out = [f"A new user's epochs: `python tests/benchmarks/blas_user.py [--hide-threadpoolctl]`, one "
           f"fresh interpreter each; three 320x320 float32 matmuls by numpy per sample, batch 16, no step, epochs of "
           f"{BLAS_ROWS[0]['samples']:,} samples. Samples/s; in brackets the ratio to the best plain DataLoader of the "
           f"same run (target >= {BLAS_TARGET} from online epoch 2 and for trials' epoch 1).", "",
           "| install | plain 0 / 1 / 2 workers | online e1 / e2 / e3 | online in force after e3 | trials: choice, "
           "pre-pass s, e1 | target | bottleneck (online's); native pools (the first report that shows them) | load |", "|---|---|---|---|---|---|---|---|"]
    for r in BLAS_ROWS:
        plain = " / ".join(f"{r['plain'][str(w)]:,.0f}" for w in (0, 1, 2))
        online = " / ".join(f"{x:,.0f} ({q:.2f})" for x, q in zip(r["online"], r["online/plain"]))
        met = min(r["online/plain"][1:]) >= BLAS_TARGET and r["trials/plain"] >= BLAS_TARGET
        words = "; ".join(r["bottlenecks"][:1] + r["native"][:1]) or "-"
        out.append(f"| {'with' if r['threadpoolctl'] else 'without'} threadpoolctl | {plain} | {online} | "
                   f"{r['online_configs'][-1]} | {r['trials_config']}, {r['trials_prepass_s']:.1f}, "
                   f"{r['trials']:,.0f} ({r['trials/plain']:.2f}) | {'yes' if met else '**no**'} | {words} | "
                   f"{r['load'][0]:.1f}/{r['load'][1]:.1f} |")
    return "\n".join(out)


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
    if ROWS or BLAS_ROWS:
        text = "\n\n".join(([tables()] if ROWS else []) + ([blas_table()] if BLAS_ROWS else []))
        emit_table(text)
        run.write(text, packages=("threadpoolctl",), loads=[x for r in ROWS + BLAS_ROWS for x in r["load"]])
