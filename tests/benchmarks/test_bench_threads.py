"""Threads inside workers (issues 16 and 23), measured side by side in one run.

    pytest tests/benchmarks/test_bench_threads.py --benchmarks -s        # the whole matrix: hours on 2 cores
    AUTOLOADER_BENCH_WORKLOADS=w4-s12k-b32,gil-bound pytest tests/benchmarks/test_bench_threads.py --benchmarks -s
    AUTOLOADER_BENCH_QUICK=1 pytest tests/benchmarks/test_bench_threads.py --benchmarks -s   # ~2 min

Two kinds of rows, every rate a steady-state ``run_trial`` against the same ``Consumer`` (no step: the loader is the
bottleneck), every configuration measured in interleaved rounds (forward, then reverse order, ...) and the median
taken, as ``test_bench_tuner.py`` does:

- **sweep rows**: the waiting matrix of issue 23, ``w{1,4,20}-s{1k,12k,100k}-b{16,32,128}`` (a ``LatencyBound``
  sample that sleeps 1, 4 or 20 ms and is a tensor of 1 KB, 12 KB or 100 KB, at batch 16, 32 or 128), and the mixed
  rows of issue 16 (``mixed-b16``, ``mixed-b64``: 3 ms wait + 0.5 ms CPU). ``tune(threads=True)`` once, then
  ``tune()`` (process-only) once: their wall times are the tuning times compared; then a sweep of process-only
  ``num_workers`` (0, 1, 2, 4, ..., 64) and the ``threads=True`` choice measured side by side. Reported: the choice's
  rate over the best process-only rate of the sweep, and its total worker memory (the sum of its workers' USS,
  ``TrialResult.worker_memory_bytes``; 0 when the main process loads) over that best configuration's. Targets (issue
  23, waiting rows): >= 0.95x the rate at <= 15 % of the memory, tuning no longer than the process-only tune.
- **fixed rows** (GIL-bound pure Python, JPEG decoding with Pillow): ``tune(threads=True)`` once, then fixed
  processes x threads configurations (1x1, 2x1, 1x4, 2x4, ...) and the tuner's choice side by side. The GIL-bound
  target: the tuner keeps 1 thread (the candidates it tried are listed); JPEG: what threads give.

Asserted only what must hold anywhere: every trial (and every tune) leaves no worker process behind; a tuner choice
with threads > 1 was measured faster than its control (the same processes with one thread) in its own trials; every
configuration measured at least once. The targets are reported, not asserted.

Environment: ``AUTOLOADER_BENCH_QUICK=1`` (one round, a short sweep, a 12 s tuning budget, rows w4-s12k-b32 and
gil-bound), ``AUTOLOADER_BENCH_ROUNDS`` (default 3; quick 1), ``AUTOLOADER_BENCH_WORKLOADS`` (comma-separated ids,
default all: the 27 matrix rows, mixed-b16, mixed-b64, gil-bound, jpeg (needs Pillow)), ``AUTOLOADER_BENCH_SWEEP``
(comma-separated process-only counts, default 0,1,2,4,8,16,32,64: on waiting rows the best is among the largest),
``AUTOLOADER_BENCH_TABLE`` (a path for the markdown tables). The run is added to tests/benchmarks/results/threads.md
(``bench_results``).
"""
from __future__ import annotations

import functools
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from autoloader import tune
from autoloader.consumer import Consumer
from autoloader.search.threads_policy import busy_fraction
from autoloader.probe import probe_machine
from autoloader.config import LoaderConfig
from autoloader.results import TrialResult, TuneResult
from autoloader.measure.trial import run_trial
from autoloader.request import Request
from bench_results import Run
from helpers import emit_table, live_children, longer_windows, measured_as, selected_workloads
from workloads import GilBound, JpegDecode, LatencyBound, Mixed

pytestmark = [pytest.mark.benchmark_suite, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")]

QUICK = os.environ.get("AUTOLOADER_BENCH_QUICK", "") not in ("", "0")
ROUNDS = int(os.environ.get("AUTOLOADER_BENCH_ROUNDS", "1" if QUICK else "3"))
SWEEP = tuple(int(n) for n in os.environ.get("AUTOLOADER_BENCH_SWEEP", "2,8,32,64" if QUICK else
                                              "0,1,2,4,8,16,32,64").split(",") if n.strip())
MAX_WORKERS = 64
"""The tuner's bound: the sweep's largest count (also the default bound on this kind of machine)."""
BUDGET = 12.0 if QUICK else 30.0
TRIAL_LIMIT = 12.0
"""A cap only: a trial ends once its window is complete (64 workers at batch 64 need ~8 s on 2 cores to get past
their start-up burst and through three waves)."""
MIN_WINDOW_S = 1.0
"""Every side-by-side trial times at least this long (a few processes with threads otherwise finish in 0.5 s)."""
TARGET_RATE = 0.95
TARGET_MEMORY = 0.15

Pair = Tuple[int, int]
"""(processes: num_workers, threads per process)."""


@dataclass
class Case:
    title: str
    make: Callable[[], Any]
    batch_size: int
    fixed: Tuple[Pair, ...] = ()
    """Empty: a sweep row (process-only sweep); else the processes x threads configurations measured."""
    needs: Optional[str] = None
    wait_s: float = 0.0
    """A sample's wait (the waiting rows): it sets how long a side-by-side trial may take (``limit_of``)."""


def limit_of(case: Case) -> float:
    """A side-by-side trial's limit: ``TRIAL_LIMIT``, or what n single-threaded workers need to get past their burst
    (3n batches) and through the window's three waves (3n more) when a batch is ``batch_size`` waits long: 6 batch
    times, plus a third for start-up (20 ms waits at batch 128: 2.6 s a batch, 20.5 s; within 12 s every trial of
    that row was cut inside its burst and read a lower bound)."""
    return max(TRIAL_LIMIT, 8.0 * case.batch_size * case.wait_s)


WAITS_MS = (1, 4, 20)
SAMPLE_KB = (1, 12, 100)
BATCHES = (16, 32, 128)


def waiting(wait_ms: int, sample_kb: int) -> Callable[[], Any]:
    """A sample that sleeps ``wait_ms`` (no CPU) and is a float32 tensor of ``sample_kb`` KB (1 KB = 1,024 bytes)."""
    return functools.partial(LatencyBound, latency_s=wait_ms / 1000, dim=sample_kb * 256)


CASES: Dict[str, Case] = {
    **{f"w{w}-s{kb}k-b{b}": Case(f"waiting {w} ms, {kb} KB/sample", waiting(w, kb), b, wait_s=w / 1000)
       for w in WAITS_MS for kb in SAMPLE_KB for b in BATCHES},
    "mixed-b16": Case("mixed (3 ms wait + 0.5 ms CPU/sample)", lambda: Mixed(latency_s=0.003, cost_s=0.0005), 16),
    "mixed-b64": Case("mixed (3 ms wait + 0.5 ms CPU/sample)", lambda: Mixed(latency_s=0.003, cost_s=0.0005), 64),
    "gil-bound": Case("GIL-bound pure Python (1 ms/sample)", lambda: GilBound(cost_s=0.001), 16,
                      fixed=((1, 1), (2, 1), (1, 4), (2, 4))),
    "jpeg": Case("JPEG decode (Pillow, 256x256 -> crop 224)", lambda: JpegDecode(), 32,
                 fixed=((1, 1), (2, 1), (1, 4), (2, 4)) if QUICK else
                 ((0, 1), (1, 1), (2, 1), (4, 1), (0, 4), (1, 2), (1, 4), (2, 2), (2, 4)), needs="PIL"),
}
DEFAULT = "w4-s12k-b32,gil-bound" if QUICK else ",".join(CASES)
SELECTED = selected_workloads(DEFAULT, CASES)

ROWS: List[Dict[str, Any]] = []
FIXED_ROWS: List[Dict[str, Any]] = []
LOADS: List[float] = []


# ---------------------------------------------------------------- measuring

def config_of(pair: Pair) -> LoaderConfig:
    workers, threads = pair
    return LoaderConfig(workers, 2 if workers else None, threads=threads)


def pt(config: LoaderConfig) -> str:
    """processes x threads, with a prefetch_factor other than 2 said."""
    text = f"{config.num_workers}x{config.threads}"
    if config.num_workers and config.prefetch_factor != 2:
        text += f" pf={config.prefetch_factor}"
    return text


def mib(value: Optional[float]) -> str:
    return "?" if value is None else f"{value / 2 ** 20:,.0f}"


def assert_no_worker_left(what: str) -> None:
    """Every trial (and tune) reaps its workers before it returns: nothing may be running when it does."""
    left = live_children()
    assert not left, f"{what} left processes behind: {[(p.pid, p.name()) for p in left]}"


@dataclass
class Measured:
    rate: float
    memory: Optional[float]
    cpu: Optional[float]
    steady: bool
    failed: int


def side_by_side(dataset: Any, batch_size: int, configs: Sequence[LoaderConfig], *,
                 limit_s: float = TRIAL_LIMIT) -> Dict[LoaderConfig, Measured]:
    """Every config in interleaved rounds (forward, reverse, ...) with the same trial code and consumer; medians."""
    request = Request.checked(dataset, batch_size, device="cpu")
    consumer = Consumer(None, request.device)
    runs: Dict[LoaderConfig, List[TrialResult]] = {c: [] for c in configs}
    with longer_windows(MIN_WINDOW_S):
        for r in range(ROUNDS):
            for config in (configs if r % 2 == 0 else list(configs)[::-1]):
                trial = run_trial(request, config, consumer=consumer, limit_s=limit_s)
                assert_no_worker_left(f"the trial of {config.label()}")
                runs[config].append(trial)
    out = {}
    for config, trials in runs.items():
        ok = [t for t in trials if t.ok]
        memory = [t.worker_memory_bytes for t in ok if t.worker_memory_bytes is not None]
        cpu = [t.worker_cpu_util for t in ok if t.worker_cpu_util is not None]
        out[config] = Measured(rate=statistics.median(t.samples_per_s for t in ok) if ok else 0.0,
                               memory=statistics.median(memory) if memory else None,
                               cpu=statistics.median(cpu) if cpu else None,
                               steady=all(t.steady for t in ok), failed=len(trials) - len(ok))
    return out


def tuned(dataset: Any, batch_size: int, benchmark: Any) -> TuneResult:
    result = benchmark.pedantic(lambda: tune(dataset, batch_size, budget=BUDGET, max_workers=MAX_WORKERS,
                                             threads=True), rounds=1, iterations=1)
    assert_no_worker_left("tune()")
    check_threads_earned(result)
    return result


def tuned_process_only(dataset: Any, batch_size: int) -> TuneResult:
    """The process-only search (``threads=False``) on the same data, for its tuning time."""
    result = tune(dataset, batch_size, budget=BUDGET, max_workers=MAX_WORKERS)
    assert_no_worker_left("tune()")
    return result


def check_threads_earned(result: TuneResult) -> None:
    """Threads > 1 are chosen only when measured faster than their control: the same processes, one thread."""
    if result.threads == 1:
        return
    chosen = [t for t in result.trials if t.ok and t.config == measured_as(result.config)]
    controls = [t for t in result.trials if t.ok and t.config.threads == 1
                and t.config.num_workers == result.num_workers]
    assert chosen and controls, f"threads={result.threads} chosen without a control measured beside it: {result}"
    assert max(t.samples_per_s for t in chosen) > max(t.samples_per_s for t in controls), result


def candidates(result: TuneResult) -> str:
    """The tuner's own trials: process-only ones as 'n', thread ones as 'p x t', with their rates."""
    parts = []
    for t in result.trials:
        rate = f"{t.samples_per_s:,.0f}/s" if t.ok else t.status
        parts.append(f"{pt(t.config)}: {rate}")
    return ", ".join(parts)


def thread_note(result: TuneResult) -> str:
    tried = [t for t in result.trials if t.config.threads > 1]
    if tried:
        return f"{len(tried)} thread candidate(s): " + ", ".join(
            f"{pt(t.config)} {t.samples_per_s:,.0f}/s" if t.ok else f"{pt(t.config)} {t.status}" for t in tried)
    process_only = [t for t in result.trials if t.ok and t.config.threads == 1]
    chosen = next((t for t in process_only if t.config == measured_as(result.config)), None)
    busy = busy_fraction(chosen) if chosen is not None else None
    return ("no thread candidate: " + (f"its {pt(result.config)} kept a CPU {busy:.0%} busy per process"
                                       if busy is not None else "not measured"))


def load() -> float:
    return os.getloadavg()[0]


# ---------------------------------------------------------------- the benchmarks

SWEEP_IDS = [n for n in SELECTED if not CASES[n].fixed]
FIXED_IDS = [n for n in SELECTED if CASES[n].fixed]


@pytest.mark.parametrize("case_id", SWEEP_IDS)
def test_threads_vs_process_only_sweep(benchmark, case_id):
    case = CASES[case_id]
    load_start = load()
    LOADS.append(load_start)
    dataset = case.make()
    result = tuned(dataset, case.batch_size, benchmark)
    process_only = tuned_process_only(dataset, case.batch_size)
    sweep = [config_of((n, 1)) for n in SWEEP]
    choice_config = measured_as(result.config)
    configs = list(dict.fromkeys(sweep + [choice_config]))
    measured = side_by_side(dataset, case.batch_size, configs, limit_s=limit_of(case))
    best = max(sweep, key=lambda c: measured[c].rate)
    choice, top = measured[choice_config], measured[best]
    rate_ratio = choice.rate / top.rate if top.rate else float("nan")
    memory_ratio = (choice.memory / top.memory if choice.memory is not None and top.memory else None)
    row = {
        "id": case_id, "workload": case.title, "batch": case.batch_size, "best": pt(best), "best_rate": top.rate,
        "best_memory": top.memory, "chosen": pt(result.config), "chosen_rate": choice.rate,
        "chosen_memory": choice.memory, "rate_ratio": rate_ratio, "memory_ratio": memory_ratio,
        "tune_s": result.seconds, "tune_rate": result.samples_per_s, "threads_tried": thread_note(result),
        "process_tune_s": process_only.seconds, "process_chosen": pt(process_only.config),
        "trials": candidates(result), "unsteady": [pt(c) for c in configs if not measured[c].steady],
        "failed": {pt(c): measured[c].failed for c in configs if measured[c].failed},
        "sweep": ", ".join(f"{pt(c)}: {measured[c].rate:,.0f}/s {mib(measured[c].memory)} MiB" for c in sweep),
        "load": (load_start, load()),
    }
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "load"})
    ROWS.append(row)
    print(f"\n{case_id}: {row}")
    assert all(measured[c].failed < ROUNDS for c in configs), row["failed"]


@pytest.mark.parametrize("case_id", FIXED_IDS)
def test_threads_fixed_configurations(benchmark, case_id):
    case = CASES[case_id]
    if case.needs:
        pytest.importorskip(case.needs)
    load_start = load()
    LOADS.append(load_start)
    dataset = case.make()
    result = tuned(dataset, case.batch_size, benchmark)
    fixed = [config_of(p) for p in case.fixed]
    choice_config = measured_as(result.config)
    configs = list(dict.fromkeys(fixed + [choice_config]))
    measured = side_by_side(dataset, case.batch_size, configs)
    base = measured[config_of((1, 1))].rate
    best = max(configs, key=lambda c: measured[c].rate)
    row = {
        "id": case_id, "workload": case.title, "batch": case.batch_size, "chosen": pt(result.config),
        "tune_s": result.seconds, "threads_tried": thread_note(result), "trials": candidates(result),
        "configs": [{"config": pt(c), "rate": measured[c].rate, "vs_1x1": measured[c].rate / base if base else None,
                     "memory": measured[c].memory, "cpu": measured[c].cpu, "steady": measured[c].steady,
                     "chosen": c == choice_config, "best": c == best} for c in configs],
        "load": (load_start, load()),
    }
    if case_id == "gil-bound":
        # must hold anywhere: threads > 1 only when measured faster than their control (check_threads_earned, in
        # tuned()); the target, 1 thread, is reported
        row["target"] = result.threads == 1
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "load"})
    FIXED_ROWS.append(row)
    print(f"\n{case_id}: {row}")
    assert all(measured[c].failed < ROUNDS for c in configs), {pt(c): measured[c].failed for c in configs}


# ---------------------------------------------------------------- the tables

def _mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def tables() -> str:
    usable = probe_machine(disk=False, gpus=False).cpu.usable
    loads = LOADS + [load()]
    command = (f"`{'AUTOLOADER_BENCH_QUICK=1 ' if QUICK else ''}pytest tests/benchmarks/test_bench_threads.py "
               f"--benchmarks -s`")
    out = [f"Command: {command} ({ROUNDS} interleaved round(s) per configuration, tune budget {BUDGET:g} s, "
           f"max_workers={MAX_WORKERS}, no step: the loader is the bottleneck). Machine: {usable} usable CPUs, "
           f"shared; 1-min load average {min(loads):.1f}-{max(loads):.1f} during the run (it counts this benchmark's "
           f"own workers). torch {torch.__version__}, python {sys.version.split()[0]}. Configurations are written "
           f"processes x threads (0x.. : the main process loads).", ""]
    if ROWS:
        out += ["| id | workload | batch | best process-only (sweep): samples/s, worker MiB | threads=True chose: "
                "samples/s, worker MiB | rate ratio | memory ratio | tune s: threads=True / process-only "
                f"| targets (>= {TARGET_RATE:.2f}x rate, <= {TARGET_MEMORY:.0%} memory, tune s <= process-only) "
                "| thread candidates (tuner's own rates) | load |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ROWS:
            memory_ratio = "-" if r["memory_ratio"] is None else f"{r['memory_ratio']:.1%}"
            targets = (f"rate: {_mark(round(r['rate_ratio'], 2) >= TARGET_RATE)}; memory: "  # as printed
                       f"{_mark(r['memory_ratio'] is not None and round(r['memory_ratio'], 3) <= TARGET_MEMORY)}; "
                       f"time: {_mark(round(r['tune_s'], 1) <= round(r['process_tune_s'], 1))}")
            out.append(f"| {r['id']} | {r['workload']} | {r['batch']} | {r['best']}: {r['best_rate']:,.0f}, "
                       f"{mib(r['best_memory'])} | {r['chosen']}: {r['chosen_rate']:,.0f}, {mib(r['chosen_memory'])} "
                       f"| {r['rate_ratio']:.2f} | {memory_ratio} | {r['tune_s']:.1f} / {r['process_tune_s']:.1f} "
                       f"({r['process_chosen']}) | {targets} | {r['threads_tried']} "
                       f"| {r['load'][0]:.1f}/{r['load'][1]:.1f} |")
        out += ["", "Rate ratio: the tuner's choice over the best process-only configuration of the sweep, medians of "
                "the same interleaved rounds. Memory ratio: the sum of the workers' USS, same two configurations, read "
                "at the end of each trial's window (seconds after the fork): a worker's first full garbage collection "
                "later copies the pages of the parent's Python heap it touches (~40 MiB per worker measured here), "
                "so over an epoch every process holds more and fewer processes save more than shown. "
                "Sweeps (processes x threads: samples/s, worker MiB):", ""]
        for r in ROWS:
            extra = ""
            if r["unsteady"]:
                extra += f" (no steady window, cut at the trial limit: {', '.join(r['unsteady'])})"
            if r["failed"]:
                extra += f" (failed trials: {r['failed']})"
            out.append(f"- {r['workload']}, batch {r['batch']}: {r['sweep']}{extra}; tuner's trials: {r['trials']}")
    for r in FIXED_ROWS:
        out += ["", f"{r['workload']}, batch {r['batch']}: threads=True chose {r['chosen']} in {r['tune_s']:.1f} s "
                f"({r['threads_tried']}); load {r['load'][0]:.1f}/{r['load'][1]:.1f}"
                + (f"; target (keeps 1 thread): {_mark(r['target'])}" if "target" in r else ""), "",
                "| processes x threads | samples/s | vs 1x1 | worker MiB | CPU per worker process | |",
                "|---|---|---|---|---|---|"]
        for c in r["configs"]:
            notes = [n for n, on in (("threads=True's choice", c["chosen"]), ("fastest", c["best"]),
                                     ("no steady window", not c["steady"])) if on]
            cpu = "-" if c["cpu"] is None else f"{c['cpu']:.0%}"
            vs = "-" if c["vs_1x1"] is None else f"{c['vs_1x1']:.2f}"
            out.append(f"| {c['config']} | {c['rate']:,.0f} | {vs} | {mib(c['memory'])} | {cpu} "
                       f"| {', '.join(notes)} |")
        out += ["", f"Tuner's trials: {r['trials']}"]
    return "\n".join(out)


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("threads", "Threads inside workers")
    yield
    if not ROWS and not FIXED_ROWS:
        return
    text = tables()
    emit_table(text)
    run.write(text, loads=LOADS)
