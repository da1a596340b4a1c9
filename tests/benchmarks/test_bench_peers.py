"""autoloader against the loaders users would pick instead (issue 26), every contender measured the same way.

    pip install torch==2.13.0 -e ".[test,bench,peers]"   # torch==2.13.0 on the same line: no other torch
    pytest tests/benchmarks/test_bench_peers.py --benchmarks -s                            # ~60-70 min on 2 cores
    AUTOLOADER_BENCH_QUICK=1 pytest tests/benchmarks/test_bench_peers.py --benchmarks -s     # ~5 min

Contenders, on the same dataset per row, batch 32, every batch torch tensors collated the same way (in index order):

- autoloader ``make_loader(ds, 32, cache=False, tuning="trials")``, the same with ``threads=True``, and
  ``tuning="online"``: its epoch 1 (it tunes there: the whole epoch's rate, start-up and search included) and its
  epoch 2 (a steady window, as every other contender). The online dataset is the row's data cut to an epoch of
  ``AUTOLOADER_BENCH_ONLINE_EPOCH_S`` at the best rate measured so far in the row (it runs last in round 1);
- fixed rules: ``DataLoader(num_workers=os.cpu_count())``, Lightning's ``cores - 1`` (at least 1), ``num_workers=0``;
- tf.data: ``Dataset.range(n).map(py_function(__getitem__), num_parallel_calls=AUTOTUNE).batch(32)
  .prefetch(AUTOTUNE)``, its numpy batches turned into torch tensors inside the window (a cost it pays);
- SPDL (``spdl-core``): ``PipelineBuilder().add_source(range(n)).pipe(__getitem__, concurrency=c,
  output_order="input").aggregate(32).pipe(default_collate)``, no tuner: the best of a sweep of ``c``;
- torchdata.nodes: ``ParallelMapper(method="thread")`` and ``method="process"`` + ``Batcher`` + collate +
  ``Prefetcher(2)``, no tuner: the best of a sweep of ``num_workers`` each.

Each run is a process of its own (``peers_run.py``): setup (tuning, pre-pass, pipeline construction; timed apart),
then warm-up (``WARMUP_S`` after the first batch, discarded), then a steady window of ``STEADY_S`` (and at least
``MIN_STEADY_BATCHES``): samples/s over it. Memory: the peak, over the window, of the sum of PSS (each page divided
by the processes mapping it) of the run's process and all its children, sampled every 0.2 s (psutil), with the sum of
USS beside it (pages no other process maps: it counts none of the copy-on-write pages forked workers share with
their parent, so a tree of processes looks lighter than one process holding the same data). Contenders run round-robin,
the order reversed every other round, and each figure is the median over the rounds. Cold files: one 4 KiB file
per sample, each read once; the page cache is dropped (``posix_fadvise(DONTNEED)``, checked with ``mincore``)
before each run's setup and again before its window (what a tuner's trials read is cold again).

Asserted only what must hold anywhere: no run fails or leaves a child process behind; every run delivered the
samples expected (whole batches in index order, epoch 1 every sample) with ``dataset[i]``'s values at checked
positions. A contender whose library is missing is skipped with the reason. Rates are reported, never asserted.

Environment: ``AUTOLOADER_BENCH_QUICK=1`` (one round, shorter windows, sweeps 8/64, trials budget 8 s, workloads
in-memory,latency-bound,cold), ``AUTOLOADER_BENCH_ROUNDS`` (default 2; quick 1), ``AUTOLOADER_BENCH_WORKLOADS``
(comma-separated, default all: in-memory, cpu-bound, latency-bound, mixed, jpeg (needs Pillow), cold),
``AUTOLOADER_BENCH_CONTENDERS`` (comma-separated ids, default all: see ``POINTS``), ``AUTOLOADER_BENCH_ONLINE_EPOCH_S``
(default 20; quick 8), ``AUTOLOADER_BENCH_COLD_FILES`` (default 150000; quick 40000), ``AUTOLOADER_BENCH_TMPDIR``
(where the cold files go), ``AUTOLOADER_BENCH_TABLE`` (a path for the markdown tables). The run is added to
tests/benchmarks/results/peers.md (``bench_results``).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import pytest

from bench_results import Run
from helpers import emit_table, selected_workloads
from peers_data import WORKLOADS, ColdFiles
from peers_launch import launch

pytestmark = [pytest.mark.benchmark_suite, pytest.mark.filterwarnings("ignore::UserWarning")]

QUICK = os.environ.get("AUTOLOADER_BENCH_QUICK", "") not in ("", "0")
ROUNDS = int(os.environ.get("AUTOLOADER_BENCH_ROUNDS", "1" if QUICK else "2"))
BATCH = 32
WARMUP_S, WARMUP_BATCHES = (0.5, 3) if QUICK else (2.0, 5)
STEADY_S, MIN_STEADY_BATCHES = (1.5, 5) if QUICK else (5.0, 10)
BUDGET: Optional[float] = 8.0 if QUICK else None
"""``budget=`` for the trials contenders; None: autoloader's default (30 s), what a user gets."""
ONLINE_EPOCH_S = float(os.environ.get("AUTOLOADER_BENCH_ONLINE_EPOCH_S", "8" if QUICK else "20"))
COLD_FILES = int(os.environ.get("AUTOLOADER_BENCH_COLD_FILES", "40000" if QUICK else "150000"))
CORES = len(os.sched_getaffinity(0))
THREAD_SWEEP = (8, 64) if QUICK else (8, 32, 64)
PROCESS_SWEEP = tuple(sorted({1, 2, CORES}))


@dataclass(frozen=True)
class Point:
    """One configuration run in the rotation; points of one ``group`` make one table row (the best of a sweep)."""
    id: str
    group: str
    label: str
    kind: str
    param: Any = None


def _sweep(group: str, label: str, kind: str, values: Any, make: Any) -> List[Point]:
    return [Point(f"{group}-{v}", group, label, kind, make(v)) for v in values]


POINTS: List[Point] = [
    Point("autoloader-trials", "autoloader-trials", "autoloader tuning='trials'", "autoloader", "trials"),
    Point("autoloader-threads", "autoloader-threads", "autoloader threads=True (trials)", "autoloader", "threads"),
    Point("plain-cpu-count", "plain-cpu-count", "DataLoader num_workers=os.cpu_count()", "plain", os.cpu_count()),
    Point("plain-cores-1", "plain-cores-1", "DataLoader num_workers=cores-1 (Lightning's rule)", "plain",
          max(1, CORES - 1)),
    Point("plain-0", "plain-0", "DataLoader num_workers=0", "plain", 0),
    Point("tf", "tf", "tf.data AUTOTUNE (py_function, numpy -> torch)", "tf"),
    *_sweep("spdl", f"SPDL pipeline, threads (best of sweep c={'/'.join(map(str, THREAD_SWEEP))})", "spdl",
            THREAD_SWEEP, int),
    *_sweep("torchdata-thread", f"torchdata.nodes ParallelMapper thread (best of sweep "
            f"{'/'.join(map(str, THREAD_SWEEP))})", "torchdata", THREAD_SWEEP, lambda v: ("thread", v)),
    *_sweep("torchdata-process", f"torchdata.nodes ParallelMapper process (best of sweep "
            f"{'/'.join(map(str, PROCESS_SWEEP))})", "torchdata", PROCESS_SWEEP, lambda v: ("process", v)),
    Point("autoloader-online", "autoloader-online", "autoloader tuning='online'", "autoloader", "online"),
]
"""Online last: in round 1 its epoch is sized from the rates measured before it."""
_wanted = [n.strip() for n in os.environ.get("AUTOLOADER_BENCH_CONTENDERS", "").split(",") if n.strip()]
if _wanted:
    POINTS = [p for p in POINTS if p.group in _wanted or p.id in _wanted]
    if not POINTS:
        raise ValueError(f"AUTOLOADER_BENCH_CONTENDERS: none of {_wanted} is known")
LIBRARIES = {"tf": ("tensorflow", "tensorflow-cpu"), "spdl": ("spdl", "spdl-core"),
             "torchdata": ("torchdata", "torchdata")}

DEFAULT = "in-memory,latency-bound,cold" if QUICK else ",".join(WORKLOADS)
SELECTED = selected_workloads(DEFAULT, WORKLOADS)

ROWS: List[Dict[str, Any]] = []
LOADS: List[float] = []


def missing(point: Point) -> Optional[str]:
    if point.kind in LIBRARIES and importlib.util.find_spec(LIBRARIES[point.kind][0]) is None:
        module, dist = LIBRARIES[point.kind]
        return f"{module} is not installed (pip install -e '.[peers]' installs {dist})"
    return None


def spec_for(point: Point, workload: str, cold: Optional[ColdFiles], epoch_samples: Optional[int]) -> Dict[str, Any]:
    online = point.param == "online"
    setup_s = (4 * ONLINE_EPOCH_S if online else 4 * (BUDGET or 30.0)) if point.kind == "autoloader" else 60.0
    return dict(kind=point.kind, param=point.param, workload=workload, batch_size=BATCH, budget=BUDGET,
                warmup_s=WARMUP_S, warmup_batches=WARMUP_BATCHES, steady_s=STEADY_S,
                min_steady_batches=MIN_STEADY_BATCHES, run_limit_s=WARMUP_S + STEADY_S + 60,
                cold_root=cold.root if cold else None, cold_n=cold.n if cold else 0,
                epoch_samples=(epoch_samples or 1) if online and cold is None else None,
                timeout_s=setup_s + WARMUP_S + STEADY_S + 180)


def median(values: List[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summary(results: List[Dict[str, Any]], epoch1: bool = False) -> Dict[str, Any]:
    """Medians over the rounds of one point (or its epoch-1 figures)."""
    ok = [r for r in results if r["status"] == "ok"]
    part = [r["epoch1"] for r in ok] if epoch1 else ok
    configs = list(dict.fromkeys(r["config_epoch1" if epoch1 else "config"] for r in ok))
    return {"rate": median([p.get("rate") for p in part]), "memory": median([p.get("peak_pss") for p in part]),
            "uss": median([p.get("peak_uss") for p in part]),
            "setup": median([r.get("setup_s") for r in ok]), "configs": configs,
            "first": median([p.get("first_batch_s") for p in part]),
            "ended": any(p.get("ended") for p in part) and not epoch1, "runs": len(ok),
            "no_window": any(p.get("no_window") for p in part),
            "resident": median([r.get("resident_after_drop") for r in ok])}


def run_rows(workload: str, cold: Optional[ColdFiles]) -> Dict[str, List[Dict[str, Any]]]:
    runs: Dict[str, List[Dict[str, Any]]] = {p.id: [] for p in POINTS}
    for r in range(ROUNDS):
        for point in (POINTS if r % 2 == 0 else POINTS[::-1]):
            reason = missing(point)
            if reason:
                if r == 0:
                    print(f"  {workload} {point.id}: skipped: {reason}", flush=True)
                runs[point.id].append({"status": "skipped", "reason": reason})
                continue
            rates = [median([x.get("rate") for x in rs if x["status"] == "ok"]) for rs in runs.values()]
            best = max([x for x in rates if x] or [200.0])
            epoch = max(20 * BATCH, int(ONLINE_EPOCH_S * best) // BATCH * BATCH)
            result = launch(spec_for(point, workload, cold, epoch))
            print(f"  {workload} round {r + 1} {point.id}: {result.get('status')} "
                  f"{result.get('rate') or 0:,.0f}/s {result.get('config', result.get('reason', ''))}", flush=True)
            runs[point.id].append(result)
    return runs


def rows_of(workload: str, runs: Dict[str, List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    rows = []
    for group in dict.fromkeys(p.group for p in POINTS):
        points = [p for p in POINTS if p.group == group]
        results = [r for p in points for r in runs[p.id]]
        if all(r["status"] == "skipped" for r in results):
            rows.append({"label": points[0].label, "skipped": results[0]["reason"]})
            continue
        sums = {p.id: summary(runs[p.id]) for p in points}
        best = max(points, key=lambda p: sums[p.id]["rate"] or 0.0)
        row = {"label": points[0].label, **sums[best.id], "notes": []}
        if len(points) > 1:
            row["notes"].append("sweep: " + ", ".join(f"{p.param[1] if isinstance(p.param, tuple) else p.param}: "
                                                      f"{sums[p.id]['rate'] or 0:,.0f}/s" for p in points))
        if group == "autoloader-online":
            e1 = summary(runs[best.id], epoch1=True)
            rows.append({**e1, "label": f"{row['label']}, epoch 1 (whole epoch: start-up + search)",
                         "setup": row["setup"], "notes": ["tunes inside this epoch"]})
            row["label"] += ", epoch 2"
            if e1["configs"] != row["configs"]:
                row["notes"].append(f"after epoch 1 it ran {'; '.join(e1['configs'])}: it decided or re-tuned in "
                                    f"epoch 2")
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def cold_files():
    root = tempfile.mkdtemp(prefix="autoloader-bench-peers-cold-", dir=os.environ.get("AUTOLOADER_BENCH_TMPDIR"))
    files = ColdFiles(root, COLD_FILES)
    try:
        files.write()
        yield files
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("workload", SELECTED)
def test_peers(benchmark, workload, request):
    if WORKLOADS[workload].get("needs"):
        pytest.importorskip(WORKLOADS[workload]["needs"])
    cold = request.getfixturevalue("cold_files") if workload == "cold" else None
    load_start = os.getloadavg()[0]
    LOADS.append(load_start)
    runs = benchmark.pedantic(run_rows, args=(workload, cold), rounds=1, iterations=1)
    rows = rows_of(workload, runs)
    resident = [r.get("resident_after_drop") for rs in runs.values() for r in rs if r["status"] == "ok"]
    ROWS.append({"workload": workload, "rows": rows, "load": (load_start, os.getloadavg()[0]),
                 "resident": max([x for x in resident if x is not None], default=None) if cold else None})
    benchmark.extra_info.update({"rows": [{k: v for k, v in r.items() if k != "notes"} for r in rows]})
    bad = {pid: [(r["status"], r.get("reason"), r.get("problems"), r.get("left")) for r in rs
                 if r["status"] == "failed" or r.get("problems") or r.get("left")] for pid, rs in runs.items()}
    bad = {pid: v for pid, v in bad.items() if v}
    for pid, v in bad.items():
        trace = next((r.get("trace") for r in runs[pid] if r.get("trace")), None)
        print(f"\n{workload} {pid}: {v}" + (f"\n{trace}" if trace else ""))
    assert not bad, f"{workload}: runs that failed, delivered wrong samples or left processes behind: {bad}"


# ---------------------------------------------------------------- the tables

def versions() -> str:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    dists = ("torch", "autoloader", "tensorflow-cpu", "spdl-core", "torchdata", "numpy", "pillow")
    return "Versions: " + ", ".join(f"{d} {version(d)}" for d in dists) + f", python {sys.version.split()[0]}"


def _num(value: Optional[float], fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def tables() -> str:
    loads = LOADS + [os.getloadavg()[0]]
    command = (f"`{'AUTOLOADER_BENCH_QUICK=1 ' if QUICK else ''}pytest tests/benchmarks/test_bench_peers.py "
               f"--benchmarks -s`")
    mib = 2 ** 20
    out = [f"Command: {command}: {ROUNDS} interleaved round(s) (reversed every other round), medians; batch {BATCH}, "
           f"every contender's batches torch tensors in index order; no training step (the loader is the "
           f"bottleneck). Steady samples/s: warm-up {WARMUP_S:g} s after the first batch (>= {WARMUP_BATCHES} "
           f"batches) discarded, then a window of {STEADY_S:g} s (>= {MIN_STEADY_BATCHES} batches). Peak MiB: the "
           f"peak over the window of the sums of PSS and (in brackets) of USS over the run's process tree (its main "
           f"process + children; psutil memory_full_info every 0.2 s); memory / lightest is on PSS: USS counts no "
           f"page forked workers share with their parent, so a tree of processes looks lighter in USS than one "
           f"process holding the same data. Setup s: make_loader's tuning, pipeline construction, before the first "
           f"batch (the library's import not counted; online tunes inside epoch 1 instead). Best of a sweep (no "
           f"tuner of their own): SPDL and torchdata.nodes, say their rows; tf.data tunes itself (AUTOTUNE) and "
           f"pays for the numpy -> torch conversion inside the window. Trials budget: "
           f"{'autoloader default (30 s)' if BUDGET is None else f'{BUDGET:g} s'}; online epoch: "
           f"{ONLINE_EPOCH_S:g} s at the row's best rate so far (cold: every file). Machine: {CORES} usable CPUs "
           f"(os.cpu_count() {os.cpu_count()}), shared; 1-min load average {min(loads):.1f}-{max(loads):.1f}.",
           "", versions()]
    for block in ROWS:
        rows = [r for r in block["rows"] if "skipped" not in r]
        best = max([r["rate"] for r in rows if r.get("rate")] or [0.0])
        light = min([r["memory"] for r in rows if r.get("memory")] or [0.0])
        title = WORKLOADS[block["workload"]]["title"]
        extra = ""
        if block["resident"] is not None:
            extra = (f"; after each fadvise drop {block['resident']:.0%} (at most) of the checked pages stayed "
                     f"resident (mincore)")
        out += ["", f"**{title}**, {COLD_FILES} files" if block["workload"] == "cold" else f"**{title}**",
                f"(load {block['load'][0]:.1f}/{block['load'][1]:.1f}{extra})", "",
                "| contender | configuration it ended with | steady samples/s | rate / best | peak MiB: PSS (USS) "
                "| memory / lightest | setup s | notes |", "|---|---|---|---|---|---|---|---|"]
        for r in block["rows"]:
            if "skipped" in r:
                out.append(f"| {r['label']} | skipped: {r['skipped']} | | | | | | |")
                continue
            notes = list(r.get("notes", []))
            if r.get("first") is not None:
                notes.append(f"first batch {r['first']:.2f} s")
            if r.get("no_window"):
                notes.append("the data ended during the warm-up: rate from the first batch on")
            elif r.get("ended"):
                notes.append("window cut at the end of the data")
            rate, memory = r.get("rate"), r.get("memory")
            out.append(f"| {r['label']} | {'; '.join(r['configs']) or '-'} | {_num(rate)} "
                       f"| {_num(rate / best if rate and best else None, '.2f')} "
                       f"| {_num(memory and memory / mib)} ({_num(r['uss'] and r['uss'] / mib)}) "
                       f"| {_num(memory / light if memory and light else None, '.2f')} | {_num(r['setup'], '.1f')} "
                       f"| {'; '.join(notes)} |")
    return "\n".join(out)


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("peers", "autoloader against tf.data, SPDL and torchdata.nodes")
    yield
    if ROWS:
        text = tables()
        emit_table(text)
        run.write(text, packages=("tensorflow-cpu", "spdl-core", "torchdata", "pillow"), loads=LOADS)
