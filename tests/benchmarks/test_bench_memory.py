"""Peak memory against the memory budget (issue 24), per workload (run with ``pytest tests/benchmarks --benchmarks -s
-k memory``).

For each workload: ``make_loader(..., tuning="trials", memory_budget=BUDGET)`` (no cache), then one epoch of the tuned
loader, while a thread samples every 50 ms what the loader adds to the process tree: the sum of the workers' private
memory (USS, all descendants of this process) plus the /dev/shm used beyond what was used before (batches in flight
live there). Reported: the peak during tuning and during the epoch against the budget, the chosen configuration, its
predicted footprint, and the trials skipped for the budget. Asserted: the epoch's peak stays under the budget.
The "copy-on-read" workload holds its samples as a Python list of bytes objects, so every worker copies the pages it
reads (PyTorch issue 13246): its forecast warns, and the choice keeps the epoch under the budget.
``AUTOLOADER_BENCH_MEMORY_BUDGET`` (bytes, default 512 MiB) and ``AUTOLOADER_BENCH_TABLE`` (a path for the table); the
run is added to tests/benchmarks/results/memory.md (``bench_results``).
"""
import os
import threading
import time
import warnings

import psutil
import pytest
import torch
from torch.utils.data import Dataset, Subset

from autoloader import AutoloaderWarning, make_loader
from bench_results import Run
from helpers import emit_table
from workloads import CpuBound, InMemory, JpegDecode, LatencyBound, Mixed

MIB = 2**20
BUDGET = int(os.environ.get("AUTOLOADER_BENCH_MEMORY_BUDGET", str(512 * MIB)))
SAMPLE_S = 0.05


class CopyOnRead(Dataset):
    """Samples held as a Python list of ``size``-byte objects: a forked worker copies every page it reads."""

    def __init__(self, n=60_000, size=2048):
        self.items = [bytes([i % 251]) * size for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        time.sleep(0.002)  # waiting-bound: more workers pay, and each copies the pages it reads
        return torch.frombuffer(bytearray(self.items[i][:64]), dtype=torch.uint8)


WORKLOADS = {  # name: (dataset, batch size, memory budget)
    "in-memory": (lambda: InMemory(n=50_000), 64, BUDGET),
    "cpu-bound": (lambda: CpuBound(n=4_000, cost_s=0.002), 16, BUDGET),
    "latency-bound": (lambda: LatencyBound(n=20_000, latency_s=0.004), 16, BUDGET),
    "mixed": (lambda: Mixed(n=8_000, latency_s=0.003, cost_s=0.0005), 16, BUDGET),
    "jpeg decode": (lambda: Subset(JpegDecode(), range(2_000)), 32, BUDGET),
    "copy-on-read": (lambda: CopyOnRead(), 64, BUDGET),
    "copy-on-read, tighter budget": (lambda: CopyOnRead(), 64, BUDGET * 7 // 8),
}
ROWS = []


def _shm_used():
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class Peak:
    """Samples the workers' USS and /dev/shm growth in a thread; ``take()`` returns the peak since the last call."""

    def __init__(self):
        self.shm0, self.peak, self.stop = _shm_used(), 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        me = psutil.Process()
        while not self.stop.wait(SAMPLE_S):
            total = max(0, _shm_used() - self.shm0)
            for child in me.children(recursive=True):
                try:
                    total += child.memory_full_info().uss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            self.peak = max(self.peak, total)

    def take(self):
        time.sleep(2 * SAMPLE_S)
        peak, self.peak = self.peak, 0
        return peak

    def close(self):
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_peak_memory_stays_under_the_budget(name):
    if name == "jpeg decode":
        pytest.importorskip("PIL")
    make, batch_size, memory_budget = WORKLOADS[name]
    dataset = make()
    peak = Peak()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AutoloaderWarning)
            loader = make_loader(dataset, batch_size, shuffle=True, tuning="trials", step=None, cache=False,
                                 device="cpu", budget=15.0, max_workers=32, memory_budget=memory_budget)
        tuning_peak = peak.take()
        started = time.perf_counter()
        batches = sum(1 for _ in loader)
        epoch_s = time.perf_counter() - started
        epoch_peak = peak.take()
        result = loader.tuning
        del loader
    finally:
        peak.close()
    chosen = next((t for t in result.trials if t.ok and t.config.same_candidate(result.config)), None)
    row = dict(workload=name, budget=memory_budget, chosen=result.config.label(), tuning_peak=tuning_peak,
               epoch_peak=epoch_peak,
               footprint=None if chosen is None else chosen.footprint_bytes, batches=batches, epoch_s=epoch_s,
               skipped=sum(1 for t in result.trials if t.status == "skipped"), trials=len(result.trials),
               warned="forecast" if any("by the end of an epoch" in str(w.message) for w in caught) else "-")
    ROWS.append(row)
    assert result.memory_budget_bytes == memory_budget
    assert epoch_peak <= memory_budget, row


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("memory", "Peak memory against the memory budget")
    yield
    if not ROWS:
        return
    lines = [f"peak = workers' USS + /dev/shm used, sampled every {SAMPLE_S * 1000:.0f} ms",
             "",
             "| workload | budget MiB | chosen | predicted footprint MiB | peak tuning MiB | peak epoch MiB "
             "| epoch peak/budget | trials (skipped) | epoch s | forecast warning |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        footprint = "-" if r["footprint"] is None else f"{r['footprint'] / MIB:,.0f}"
        share = r["epoch_peak"] / r["budget"]
        lines.append(f"| {r['workload']} | {r['budget'] / MIB:,.0f} | {r['chosen']} | {footprint} "
                     f"| {r['tuning_peak'] / MIB:,.0f} | {r['epoch_peak'] / MIB:,.0f} | {share:.0%} "
                     f"| {r['trials']} ({r['skipped']}) "
                     f"| {r['epoch_s']:.1f} | {r['warned']} |")
    emit_table("\n".join(lines))
    run.write("\n".join(lines))
