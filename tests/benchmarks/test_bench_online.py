"""Online tuning against an oracle and against trials, per workload, measured side by side in one run.

    pytest tests/benchmarks/test_bench_online.py --benchmarks -s          # ~15-20 min on 2 cores
    AUTOLOADER_BENCH_QUICK=1 pytest tests/benchmarks/test_bench_online.py --benchmarks -s   # ~3 min

Every figure is the wall time of real epochs of the same user loop (``for batch in loader: time.sleep(step_s)``, a
simulated training step of a few ms per batch, per workload):

- **oracle**: a plain DataLoader at the best configuration of a small sweep. The sweep runs the same loop over
  ``num_workers`` in a few values, measures each one's start-up (first batch) and steady rate (after its start-up
  burst), and picks the one whose predicted epoch (start-up + samples / rate) is shortest for the epoch length at
  hand; the oracle epoch is then timed in full, before and after the online and trials runs (3 epochs at the first
  length, 2 up to 20 s, 1 beyond; 2 in quick mode), and the median taken;
- **online**: ``make_loader(tuning="online")``, epochs 1 and 2 (``make_loader``'s own time counts in epoch 1);
- **trials**: ``make_loader(tuning="trials", step=step_s)``, its pre-pass plus epoch 1.

Each dataset is sized so that an epoch lasts ``AUTOLOADER_BENCH_EPOCH_S`` seconds at the oracle rate. Every workload
runs at the first length; the series workloads (``AUTOLOADER_BENCH_SERIES``) run at every length, which shows how the
first epoch's search overhead shrinks as the epoch grows.

The "cold" workloads read one file per sample from a temporary directory (``AUTOLOADER_BENCH_TMPDIR``, default the
system's). "cold": before each cold epoch 1 the page cache of every file is dropped with
``posix_fadvise(POSIX_FADV_DONTNEED)`` (checked with ``mincore``; when the drop does not take, e.g. on tmpfs, or with
``AUTOLOADER_BENCH_COLD=simulated``, a cold read is simulated instead). "cold-simulated": a cold read is always
simulated, a sleep of ``AUTOLOADER_BENCH_COLD_PENALTY_S`` (default 2 ms) on a file's first read, for storage much
slower than the page cache (a fast local SSD, as on the machine this was written on, costs ~0.2 ms a file; network
storage, several). Later epochs are served warm. Online runs 4 epochs there: its decision from the cold epoch 1
meets warm data in epoch 2 and, when the rate or stall moved, epoch 3 searches again; epochs >= 2 are compared with
the warm oracle.

Targets (issue 15), reported in the table, not asserted: online epoch 1 within 5 % of the oracle epoch once the epoch
lasts >= 60 s at the oracle rate, and always faster than trials' pre-pass + epoch 1; epochs >= 2 at >= 0.95 of the
oracle; on the cold workload, a re-tune to the warm optimum. The assertions are only those that must hold anywhere
(every epoch delivers every sample once; nothing is an order of magnitude off).

Environment: ``AUTOLOADER_BENCH_WORKLOADS`` (comma-separated, default all: in-memory, cpu-bound, latency-bound,
mixed, jpeg (needs Pillow), cold, cold-simulated; quick: in-memory, cpu-bound, latency-bound, cold),
``AUTOLOADER_BENCH_EPOCH_S`` (default ``5,15,60``; quick ``3``: no series),
``AUTOLOADER_BENCH_SERIES`` (default ``latency-bound,cpu-bound``), ``AUTOLOADER_BENCH_TABLE`` (a path for the markdown
tables), ``AUTOLOADER_BENCH_PLOTS`` (a directory: a PNG of each online epoch 1, with matplotlib, and its trace as
JSON), ``AUTOLOADER_BENCH_COLD`` (``auto``, ``fadvise`` or ``simulated``), ``AUTOLOADER_BENCH_COLD_PENALTY_S``
(default 0.002), ``AUTOLOADER_BENCH_TMPDIR``. The run is added to tests/benchmarks/results/online.md (``bench_results``).
"""
from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader import make_loader
from autoloader.probe import probe_machine
from bench_files import Cycle, FileSet, resident_fraction
from bench_results import Run
from helpers import emit_table, selected_workloads
from workloads import CpuBound, InMemory, JpegDecode, LatencyBound, Mixed

pytestmark = [pytest.mark.benchmark_suite, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")]

QUICK = os.environ.get("AUTOLOADER_BENCH_QUICK", "") not in ("", "0")
EPOCH_S = [float(v) for v in os.environ.get("AUTOLOADER_BENCH_EPOCH_S", "3" if QUICK else "5,15,60").split(",")
           if v.strip()]
SWEEP_WINDOW_S = 0.8 if QUICK else 1.5
"""Seconds of steady state each sweep point is timed for (after its start-up burst)."""
COLD_MODE = os.environ.get("AUTOLOADER_BENCH_COLD", "auto")
COLD_PENALTY_S = float(os.environ.get("AUTOLOADER_BENCH_COLD_PENALTY_S", "0.002"))
COLD_FILE_BYTES = 16 << 10
TARGET_E1 = 0.05
TARGET_LATER = 0.95


# ---------------------------------------------------------------- the cold workload

class ColdFiles(FileSet):
    """One 16 KiB file per sample, read whole on every access; returns its first 64 bytes as float32.

    ``make_cold()`` drops the files from the page cache (``posix_fadvise``), or in ``simulated`` mode marks every
    file unread so that its next read sleeps ``penalty_s`` first (a flag in shared memory: workers see it)."""

    def __init__(self, root: str, n: int, *, simulated: bool, penalty_s: float) -> None:
        super().__init__(root, n, COLD_FILE_BYTES)
        self.simulated, self.penalty_s = simulated, penalty_s
        self.read_once = torch.zeros(n, dtype=torch.uint8).share_memory_()

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.simulated and not self.read_once[i]:
            time.sleep(self.penalty_s)
            self.read_once[i] = 1
        with open(self.path(i), "rb") as fh:
            data = fh.read()
        return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, count=64).astype(np.float32))

    def make_cold(self) -> None:
        if self.simulated:
            self.read_once.zero_()
            return
        self.drop_cache()

    def make_warm(self) -> None:
        for i in range(self.n):
            self[i]


def cold_mode(files: ColdFiles, name: str) -> Tuple[bool, str]:
    """(simulated, how the cold reads were made), after checking on a few files that fadvise drops them here."""
    if name == "cold-simulated":
        return True, f"simulated: {COLD_PENALTY_S * 1e3:.1f} ms sleep on a file's first read"
    if COLD_MODE == "simulated":
        return True, f"simulated (AUTOLOADER_BENCH_COLD=simulated): {COLD_PENALTY_S * 1e3:.1f} ms per first read"
    probe = [files.path(i) for i in range(min(64, files.n))]
    for path in probe:
        with open(path, "rb") as fh:
            fh.read()
    warm = resident_fraction(probe)
    files.simulated = False
    for path in probe:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    left = resident_fraction(probe)
    if warm is not None and left is not None and warm > 0.9 and left < 0.1:
        return False, f"posix_fadvise(DONTNEED), checked with mincore ({warm:.0%} of pages resident, then {left:.0%})"
    if COLD_MODE == "fadvise":
        return False, f"posix_fadvise(DONTNEED), not verified (resident {warm} then {left})"
    return True, (f"simulated ({COLD_PENALTY_S * 1e3:.1f} ms per first read): fadvise did not drop the page cache "
                  f"here (resident {warm} then {left})")


# ---------------------------------------------------------------- workloads

@dataclass
class Workload:
    name: str
    make: Callable[[int], Dataset]
    """A dataset of n samples."""
    batch_size: int
    step_s: float
    sweep: Tuple[int, ...]
    needs: Optional[str] = None


def _cached(factory: Callable[[], Any]) -> Callable[[], Any]:
    made: List[Any] = []

    def get() -> Any:
        if not made:
            made.append(factory())
        return made[0]
    return get


_in_memory = _cached(lambda: InMemory(n=50000))
_jpeg = _cached(lambda: JpegDecode())

WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("in-memory", lambda n: Cycle(_in_memory(), n), 64, 0.002, (0, 1, 2, 4)),
    Workload("cpu-bound", lambda n: CpuBound(n=n, cost_s=0.002), 16, 0.005, (0, 1, 2, 3, 4, 8)),
    Workload("latency-bound", lambda n: LatencyBound(n=n, latency_s=0.004), 16, 0.005, (0, 2, 4, 8, 12, 16, 24)),
    Workload("mixed", lambda n: Mixed(n=n, latency_s=0.003, cost_s=0.0005), 16, 0.005, (0, 2, 4, 8, 12, 16)),
    Workload("jpeg", lambda n: Cycle(_jpeg(), n), 32, 0.010, (0, 1, 2, 3, 4, 8), needs="PIL"),
    Workload("cold", lambda n: None, 32, 0.004, (0, 1, 2, 4, 8)),  # ColdFiles: made by their test
    Workload("cold-simulated", lambda n: None, 32, 0.004, (0, 1, 2, 4, 8, 16, 24)),
]}
COLD = ("cold", "cold-simulated")
if QUICK:
    for w in WORKLOADS.values():
        w.sweep = tuple(sorted({w.sweep[0], w.sweep[len(w.sweep) // 2], w.sweep[-1], 2}))
QUICK_SET = "in-memory,cpu-bound,latency-bound,cold"
SELECTED = selected_workloads(QUICK_SET if QUICK else ",".join(WORKLOADS), WORKLOADS)
SERIES = [n.strip() for n in os.environ.get("AUTOLOADER_BENCH_SERIES", "latency-bound,cpu-bound").split(",")
          if n.strip() and n.strip() in SELECTED and n.strip() not in COLD]
CASES = [(name, EPOCH_S[0]) for name in SELECTED if name not in COLD] + \
        [(name, length) for name in SERIES for length in EPOCH_S[1:]]


# ---------------------------------------------------------------- measuring

@dataclass
class Epoch:
    wall_s: float
    samples: int
    batches: int


def samples_in(batch: Any) -> int:
    return int((batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0])


def run_epoch(loader: Any, step_s: float) -> Epoch:
    """The user's loop: every batch, a simulated training step of ``step_s``."""
    started = time.perf_counter()
    samples = batches = 0
    for batch in loader:
        samples += samples_in(batch)
        batches += 1
        time.sleep(step_s)
    return Epoch(time.perf_counter() - started, samples, batches)


@dataclass
class Point:
    workers: int
    startup_s: float
    rate: float

    def epoch_s(self, samples: int) -> float:
        return self.startup_s + samples / self.rate


def plain(dataset: Dataset, w: Workload, workers: int) -> DataLoader:
    return DataLoader(dataset, w.batch_size, shuffle=True, num_workers=workers,
                      prefetch_factor=2 if workers else None)


def online_first_epoch(dataset: Dataset, w: Workload) -> Tuple[Any, Epoch]:
    """``make_loader(tuning="online")`` and its first epoch, the call's own time counted in the epoch's."""
    torch.manual_seed(0)
    started = time.perf_counter()
    loader = make_loader(dataset, w.batch_size, shuffle=True, tuning="online", cache=False)
    made_s = time.perf_counter() - started
    epoch = run_epoch(loader, w.step_s)
    return loader, Epoch(epoch.wall_s + made_s, epoch.samples, epoch.batches)


def sweep_point(dataset: Dataset, w: Workload, workers: int) -> Point:
    """Start-up and steady rate of one configuration in the user's loop (the start-up burst and one wave skipped)."""
    skip = 3 * workers if workers else 1
    started = time.perf_counter()
    first = opened = last = None
    count = samples = 0
    it = iter(plain(dataset, w, workers))
    try:
        for batch in it:
            last = time.perf_counter()
            first = first if first is not None else last - started
            count += 1
            if count == skip:
                opened = last
            elif count > skip:
                samples += samples_in(batch)
            time.sleep(w.step_s)
            if opened is not None and last - opened >= SWEEP_WINDOW_S and count - skip >= max(8, 2 * workers):
                break
    finally:
        del it
        gc.collect()
    assert opened is not None and last is not None and last > opened, f"{w.name}: sweep point {workers} too short"
    return Point(workers, first or 0.0, samples / (last - opened))


def sweep(dataset: Dataset, w: Workload, before: Callable[[], None] = lambda: None) -> List[Point]:
    points = []
    for workers in w.sweep:
        before()
        points.append(sweep_point(dataset, w, workers))
    return points


def oracle(points: Sequence[Point], length_s: float) -> Tuple[Point, int]:
    """The sweep point with the shortest predicted epoch of ``length_s`` seconds at the best rate, and its samples."""
    samples = int(length_s * max(p.rate for p in points))
    return min(points, key=lambda p: p.epoch_s(samples)), samples


def shut_down(loader: Any) -> None:
    """Stop a PrefetchLoader's persistent workers now (the test must leave no process behind)."""
    source = getattr(loader, "_loader", None)  # an OnlineLoader (tuning/online.py) serves its DataLoaders in turn
    if hasattr(source, "plain") and hasattr(source, "in_force"):
        for dl in (source.plain, source.in_force):
            if getattr(dl, "_iterator", None) is not None:
                dl._iterator = None
    elif getattr(loader, "_iterator", None) is not None:
        loader._iterator = None
    gc.collect()


def trials_first_epoch(dataset: Dataset, w: Workload) -> Tuple[float, Epoch, str]:
    """``make_loader(tuning="trials")``: its pre-pass seconds, its first epoch and its choice; its workers stopped."""
    torch.manual_seed(0)
    started = time.perf_counter()
    trials = make_loader(dataset, w.batch_size, shuffle=True, tuning="trials", step=w.step_s, cache=False)
    prepass_s = time.perf_counter() - started
    epoch = run_epoch(trials, w.step_s)
    config = short(trials.tuning.config)
    shut_down(trials)
    return prepass_s, epoch, config


def load() -> float:
    return os.getloadavg()[0]


def label(workers: int) -> str:
    return f"workers={workers}"


def short(config: Any) -> str:
    return config.label().replace(" prefetch=2", "").replace("prefetch=", "pf=")


def describe(decisions: Sequence[Any]) -> str:
    """The decisions, epochs counted from 1: "e1 workers=4 (7 cand., switching 2.1 s of 9.0 s searching)"."""
    return "; ".join(f"e{d.epoch + 1} {short(d.config)} ({d.candidates} cand., switching {d.switch_s:.1f} s of "
                     f"{d.search_s:.1f} s searching)" for d in decisions) or "none"


def maybe_plot(loader: Any, name: str) -> Optional[str]:
    folder = os.environ.get("AUTOLOADER_BENCH_PLOTS")
    if not folder or not loader.online_traces:
        return None
    try:
        from autoloader.cli.plot import plot_online_epoch
    except ImportError:
        return None
    os.makedirs(folder, exist_ok=True)
    trace = loader.online_traces[0]
    with open(os.path.join(folder, f"online-{name}.json"), "w") as fh:
        json.dump({"epoch": trace.epoch, "batches": trace.batches, "spans": trace.spans,
                   "decisions": [repr(d) for d in loader.decisions]}, fh)
    try:
        return str(plot_online_epoch(trace, os.path.join(folder, f"online-{name}.png"),
                                     title=f"online tuning, first epoch: {name}"))
    except ImportError:
        return None


ROWS: List[Dict[str, Any]] = []
COLD_ROWS: List[Dict[str, Any]] = []
SWEEPS: Dict[str, List[Point]] = {}
LOADS: List[float] = []


# ---------------------------------------------------------------- the benchmarks

@pytest.mark.parametrize("name,length_s", CASES, ids=[f"{n}-{s:g}s" for n, s in CASES])
def test_online_vs_oracle_and_trials(benchmark, name, length_s):
    w = WORKLOADS[name]
    if w.needs:
        pytest.importorskip(w.needs)
    load_start = load()
    LOADS.append(load_start)
    if name not in SWEEPS:
        SWEEPS[name] = sweep(w.make(10 ** 6), w)
    best, n = oracle(SWEEPS[name], length_s)
    dataset = w.make(n)
    expected_batches = math.ceil(n / w.batch_size)
    main_row = length_s == EPOCH_S[0]

    repeats = (2 if QUICK else 3) if main_row else (2 if length_s <= 20 else 1)
    oracles = [run_epoch(plain(dataset, w, best.workers), w.step_s)]

    loader, e1 = benchmark.pedantic(online_first_epoch, args=(dataset, w), rounds=1, iterations=1)
    e2 = run_epoch(loader, w.step_s) if main_row else None
    online_decisions, online_config = describe(loader.decisions), short(loader.tuning.config)
    decided_in_1 = bool(loader.decisions) and loader.decisions[0].epoch == 0
    plot = maybe_plot(loader, f"{name}-{length_s:g}s")
    shut_down(loader)
    del loader

    if repeats >= 2:
        oracles.append(run_epoch(plain(dataset, w, best.workers), w.step_s))

    prepass_s, t1, trials_config = trials_first_epoch(dataset, w)
    if repeats >= 3:
        oracles.append(run_epoch(plain(dataset, w, best.workers), w.step_s))
    oracle_s = statistics.median(o.wall_s for o in oracles)

    row = {
        "workload": name, "length_s": length_s, "samples": n, "step_ms": w.step_s * 1e3, "batch": w.batch_size,
        "oracle": label(best.workers), "oracle_s": oracle_s, "oracle_spread": (max(o.wall_s for o in oracles) /
                                                                               min(o.wall_s for o in oracles) - 1),
        "online": online_config, "decisions": online_decisions, "e1_s": e1.wall_s,
        "e2_s": e2.wall_s if e2 else None, "e1/oracle": e1.wall_s / oracle_s,
        "e2/oracle": e2.wall_s / oracle_s if e2 else None, "trials": trials_config, "prepass_s": prepass_s,
        "trials_e1_s": t1.wall_s, "trials/online": (prepass_s + t1.wall_s) / e1.wall_s,
        "load": (load_start, load()), "plot": plot,
        "sweep": ", ".join(f"{p.workers}: {p.rate:,.0f}/s +{p.startup_s:.2f}s" for p in SWEEPS[name]),
    }
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "load"})
    ROWS.append(row)
    print(f"\n{name} {length_s:g}s: {row}")

    for epoch in [e1, t1] + oracles + ([e2] if e2 else []):
        assert epoch.samples == n and epoch.batches == expected_batches, (name, epoch)
    assert e1.wall_s <= 3 * oracle_s + 20, row
    if e2 is not None and decided_in_1:
        assert e2.wall_s <= 2 * oracle_s + 5, row


@pytest.fixture(scope="module")
def cold_files():
    w = WORKLOADS["cold"]
    root = tempfile.mkdtemp(prefix="autoloader-bench-cold-", dir=os.environ.get("AUTOLOADER_BENCH_TMPDIR"))
    # the warm regime is step-bound by design: size the epoch at ~85 % of the step's own rate
    n = int(EPOCH_S[0] * 0.85 * w.batch_size / w.step_s)
    files = ColdFiles(root, n, simulated=False, penalty_s=COLD_PENALTY_S)
    try:
        files.write()
        yield files
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", COLD)
def test_cold_then_warm(benchmark, name, request):
    if name not in SELECTED:
        pytest.skip(f"{name} is not in AUTOLOADER_BENCH_WORKLOADS")
    w, files = WORKLOADS[name], request.getfixturevalue("cold_files")
    load_start = load()
    LOADS.append(load_start)
    files.simulated, how = cold_mode(files, name)
    n = files.n
    files.make_warm()
    warm_points = sweep(files, w)
    cold_points = sweep(files, w, before=files.make_cold)
    warm_best, _ = oracle(warm_points, EPOCH_S[0])
    cold_best, _ = oracle(cold_points, EPOCH_S[0])

    files.make_cold()
    cold_oracle = run_epoch(plain(files, w, cold_best.workers), w.step_s)
    warm_oracles = [run_epoch(plain(files, w, warm_best.workers), w.step_s)]

    def online_epoch_1() -> Tuple[Any, Epoch]:
        files.make_cold()
        return online_first_epoch(files, w)

    loader, e1 = benchmark.pedantic(online_epoch_1, rounds=1, iterations=1)
    later = [run_epoch(loader, w.step_s) for _ in range(3)]
    decisions = list(loader.decisions)
    final = loader.tuning.config
    plot = maybe_plot(loader, name)
    shut_down(loader)
    del loader
    warm_oracles.append(run_epoch(plain(files, w, warm_best.workers), w.step_s))
    warm_s = statistics.median(o.wall_s for o in warm_oracles)

    files.make_cold()
    prepass_s, t1, trials_config = trials_first_epoch(files, w)

    retunes = decisions[1:]  # the first decision may come in epoch 2 when epoch 1 was too short for the search
    speeds = [warm_s / e.wall_s for e in later]  # of the warm oracle's, epochs 2-4
    row = {
        "workload": name, "length_s": EPOCH_S[0], "samples": n, "step_ms": w.step_s * 1e3, "batch": w.batch_size,
        "oracle": f"cold {label(cold_best.workers)}, warm {label(warm_best.workers)}",
        "oracle_s": cold_oracle.wall_s, "oracle_spread": max(o.wall_s for o in warm_oracles) /
        min(o.wall_s for o in warm_oracles) - 1, "online": short(final), "decisions": describe(decisions),
        "e1_s": e1.wall_s, "e2_s": later[0].wall_s, "e1/oracle": e1.wall_s / cold_oracle.wall_s,
        "e2/oracle": later[0].wall_s / warm_s, "trials": trials_config, "prepass_s": prepass_s,
        "trials_e1_s": t1.wall_s, "trials/online": (prepass_s + t1.wall_s) / e1.wall_s,
        "load": (load_start, load()), "plot": plot,
        "sweep": "warm " + ", ".join(f"{p.workers}: {p.rate:,.0f}/s" for p in warm_points) + "; cold " +
                 ", ".join(f"{p.workers}: {p.rate:,.0f}/s" for p in cold_points),
    }
    cold = {
        "workload": name, "how": how, "files": n, "cold_oracle": label(cold_best.workers), "cold_oracle_s": cold_oracle.wall_s,
        "warm_oracle": label(warm_best.workers), "warm_oracle_s": warm_s,
        "serial_cold_over_warm": next(p.rate for p in warm_points if p.workers == 0) /
        next(p.rate for p in cold_points if p.workers == 0),
        "e1_s": e1.wall_s, "later_s": [e.wall_s for e in later], "later/warm": [e.wall_s / warm_s for e in later],
        "decisions": describe(decisions),
        "retuned": "; ".join(f"e{d.epoch + 1}: {d.why.split(': fewest')[0]}" for d in retunes) or "no",
        "final": short(final), "final_is_warm_optimum": final.num_workers == warm_best.workers,
        "speeds": speeds, "retune_epochs": [d.epoch + 1 for d in retunes],
        "load": (load_start, load()),
    }
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "load"})
    ROWS.append(row)
    COLD_ROWS.append(cold)
    print(f"\n{name}: {row}\n{cold}")

    for epoch in [e1, t1, cold_oracle] + warm_oracles + later:
        assert epoch.samples == n and epoch.batches == math.ceil(n / w.batch_size), epoch
    assert decisions, "four epochs and no decision"
    assert e1.wall_s <= 3 * cold_oracle.wall_s + 20, row


# ---------------------------------------------------------------- the tables

def _mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def tables() -> str:
    usable = probe_machine(disk=False, gpus=False).cpu.usable
    loads = LOADS + [load()]
    out = [f"Command: `{'AUTOLOADER_BENCH_QUICK=1 ' if QUICK else ''}pytest "
           f"tests/benchmarks/test_bench_online.py --benchmarks -s` (epoch lengths {EPOCH_S} s at the oracle rate; "
           f"series: {', '.join(SERIES) or 'none'}). Machine: {usable} usable CPUs, shared; 1-min load average "
           f"{min(loads):.1f}-{max(loads):.1f} during the run (at each row's start/end below; it counts this benchmark's "
           f"own workers too). torch {torch.__version__}, "
           f"python {sys.version.split()[0]}.", ""]
    out += ["| workload | epoch (oracle) | oracle: config, epoch s | online e1 s | e1/oracle | online e2 s "
            "| e2/oracle | online decision | trials: pre-pass + e1 s | (pre-pass+e1)/online e1 | targets | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        long_epoch = r["length_s"] >= 60 or r["oracle_s"] >= 60  # the 60 s case, whatever its oracle measured
        targets = []
        if long_epoch:
            targets.append(f"e1<=1.05: {_mark(r['e1/oracle'] <= 1 + TARGET_E1)}")
        targets.append(f"faster than trials: {_mark(r['trials/online'] > 1)}")
        if r["e2/oracle"] is not None:
            targets.append(f"e2>=0.95: {_mark(1 / r['e2/oracle'] >= TARGET_LATER)}")
        e2 = "-" if r["e2_s"] is None else f"{r['e2_s']:.1f}"
        e2r = "-" if r["e2/oracle"] is None else f"{r['e2/oracle']:.2f}"
        out.append(f"| {r['workload']} | {r['length_s']:g} s, {r['samples']:,} samples, batch {r['batch']}, step "
                   f"{r['step_ms']:g} ms | {r['oracle']}, {r['oracle_s']:.1f} (±{r['oracle_spread']:.0%}) "
                   f"| {r['e1_s']:.1f} | {r['e1/oracle']:.2f} | {e2} | {e2r} | {r['decisions']} | "
                   f"{r['trials']}: {r['prepass_s']:.1f} + {r['trials_e1_s']:.1f} | {r['trials/online']:.2f} | "
                   f"{'; '.join(targets)} | {r['load'][0]:.1f}/{r['load'][1]:.1f} |")
    out += ["", "e1/oracle and e2/oracle: online epoch wall time over the oracle's (1.00 = as fast; the cold row's e1 "
            "is against the cold oracle, e2 against the warm one). (pre-pass+e1)/online e1 > 1: online's first "
            "epoch ended sooner. ± is the spread of the oracle's epochs. Targets: e1 within 5 % once the epoch "
            "lasts >= 60 s at the oracle rate (the 60 s case); always faster than trials; e2 >= 0.95 of the oracle's speed.", ""]
    out += ["Sweeps (num_workers: steady samples/s + start-up s):", ""]
    for r in ROWS:
        if r["length_s"] == EPOCH_S[0]:
            out.append(f"- {r['workload']}: {r['sweep']}")
    for c in COLD_ROWS:
        later = ", ".join(f"e{i + 2} {s:.1f} s ({v:.2f})" for i, (s, v) in enumerate(zip(c["later_s"], c["speeds"])))
        if c["retune_epochs"]:
            ok = c["speeds"][-1] >= TARGET_LATER
            verdict = (f"{_mark(ok)}: re-tuned in epoch {', '.join(map(str, c['retune_epochs']))} to {c['final']}; "
                       f"the last epoch at {c['speeds'][-1]:.2f} of the warm oracle's speed (the sweep's warm "
                       f"optimum: {c['warm_oracle']})")
        else:
            ok = min(c["speeds"]) >= TARGET_LATER
            verdict = (f"{_mark(ok)}: no re-tune; the warm epochs at {min(c['speeds']):.2f}-{max(c['speeds']):.2f} "
                       f"of the warm oracle's speed with {c['final']} (the sweep's warm optimum: {c['warm_oracle']})")
        out += ["", f"| {c['workload']}: cold epoch 1, then warm | |", "|---|---|",
                f"| cold reads | {c['how']}; {c['files']:,} files of {COLD_FILE_BYTES >> 10} KiB; serial loading "
                f"cold is {c['serial_cold_over_warm']:.1f}x slower than warm |",
                f"| oracles | cold: {c['cold_oracle']}, {c['cold_oracle_s']:.1f} s; warm: {c['warm_oracle']}, "
                f"{c['warm_oracle_s']:.1f} s |",
                f"| online epochs | e1 (cold) {c['e1_s']:.1f} s; {later} (speed vs the warm oracle) |",
                f"| decisions | {c['decisions']} |",
                f"| why re-tuned | {c['retuned']} |",
                f"| target: re-tunes to the warm optimum | {verdict} |",
                f"| load | {c['load'][0]:.1f}/{c['load'][1]:.1f} |"]
    plots = [r["plot"] for r in ROWS if r.get("plot")]
    if plots:
        out += ["", "Plots: " + ", ".join(plots)]
    return "\n".join(out)


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("online", "Online tuning against an oracle and against trials")
    yield
    if not ROWS:
        return
    text = tables()
    emit_table(text)
    run.write(text, loads=LOADS)
