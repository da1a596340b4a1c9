"""Peak memory against the memory budget (issues 24 and 45), per workload (run with ``pytest tests/benchmarks
--benchmarks -s -k memory``).

For each workload: ``make_loader(..., tuning=MODE, memory_budget=BUDGET)`` (no cache), then its epochs (trials: two;
online: three, tuning in the first), while a thread samples every 50 ms what the loader adds to the process tree: the
sum of the workers' private memory (USS, all descendants of this process) plus the /dev/shm used beyond what was used
before (batches in flight live there). Then the same without a memory budget (the default: half the available memory),
side by side: the unconstrained choice. Reported: the peak during tuning and during the epochs against the budget, the
chosen configuration, its predicted footprint, the trials skipped, the rate over the epochs after tuning, and the unconstrained
choice's rate and epoch peak. Each loader starts once the processes of the one before it are gone (``_settled``:
a collected loader's workers exit on their own time, and their memory would count as the next one's). Asserted: the
peaks during tuning and during the epochs stay under the budget; and (issue 45) wherever the
unconstrained choice's epoch peak fits the budget and the two choices differ, the choice under the budget reaches 0.90
of its rate.
The "copy-on-read" workloads hold their samples as a Python list of bytes objects, so every worker copies the pages it
reads (PyTorch issue 13246): the forecast sees it, and the choice keeps the epoch under the budget. The two issue-45
rows are the issue's repros: waiting-bound 384 KiB samples under 380 MiB, online (8 and 4 workers were skipped on
the main process's RSS, an estimate, before any worker was measured), and a list of 300,000 objects under 700 MiB,
trials.
``AUTOLOADER_BENCH_MEMORY_BUDGET`` (bytes, default 512 MiB) and ``AUTOLOADER_BENCH_TABLE`` (a path for the table); the
run is added to tests/benchmarks/results/memory.md (``bench_results``).
"""
import gc
import os
import threading
import time
import warnings

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import Dataset, Subset

from autoloader import AutoloaderWarning, make_loader
from bench_results import Run
from helpers import emit_table, wait_no_children
from workloads import CpuBound, InMemory, JpegDecode, LatencyBound, Mixed

MIB = 2**20
BUDGET = int(os.environ.get("AUTOLOADER_BENCH_MEMORY_BUDGET", str(512 * MIB)))
SAMPLE_S = 0.05
SAMPLER_SHARE = 0.1
"""The most of one core ``Peak``'s sampler may take, its interval growing from ``SAMPLE_S`` to keep under it (50 ms
with a few workers; ~0.6 s with 32 of 100 MiB: a spike shorter than the interval can be missed): reading a worker's
USS makes the kernel walk its page tables (2 ms for a 145 MiB process on the VM), so 32 workers read every 50 ms
would take more than a core of 2, and slow the largest pools most."""


class CopyOnRead(Dataset):
    """Samples held as a Python list of ``size``-byte objects: a forked worker copies every page it reads."""

    def __init__(self, n=60_000, size=2048, sleep_s=0.002):
        self.items = [bytes([i % 251]) * size for i in range(n)]
        self.sleep_s = sleep_s

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        time.sleep(self.sleep_s)  # waiting-bound: more workers pay, and each copies the pages it reads
        return torch.frombuffer(bytearray(self.items[i][:64]), dtype=torch.uint8)


class Waiting384K(Dataset):
    """Waiting-bound samples of 384 KiB (numpy, so that making one costs next to no CPU): batches of 6 MiB in flight."""

    def __init__(self, n=4_000, latency_s=0.004):
        self.n, self.latency_s = n, latency_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.latency_s)
        return np.full(96 * 1024, i, dtype=np.float32)


WORKLOADS = {  # name: (dataset, batch size, memory budget, tuning)
    "in-memory": (lambda: InMemory(n=50_000), 64, BUDGET, "trials"),
    "cpu-bound": (lambda: CpuBound(n=4_000, cost_s=0.002), 16, BUDGET, "trials"),
    "latency-bound": (lambda: LatencyBound(n=20_000, latency_s=0.004), 16, BUDGET, "trials"),
    "mixed": (lambda: Mixed(n=8_000, latency_s=0.003, cost_s=0.0005), 16, BUDGET, "trials"),
    "jpeg decode": (lambda: Subset(JpegDecode(), range(2_000)), 32, BUDGET, "trials"),
    "copy-on-read": (lambda: CopyOnRead(), 64, BUDGET, "trials"),
    "copy-on-read, tighter budget": (lambda: CopyOnRead(), 64, BUDGET * 7 // 8, "trials"),
    # issue 45's repros (fixed budgets: they are what the issue measured)
    "waiting 384 KiB samples, online": (lambda: Waiting384K(), 16, 380 * MIB, "online"),
    "copy-on-read, 300,000 objects": (lambda: CopyOnRead(n=300_000, size=512, sleep_s=0.001), 64, 700 * MIB,
                                      "trials"),
}
EPOCHS = {"trials": 2, "online": 5}
"""Epochs run per loader: online tunes in the first; the rate is the mean of the others (one epoch of JPEG decoding,
1.3 s, read 0.80-0.82 of the same two workers beside it; the online row's 2 s epochs read 1,755-2,150 samples/s over
two epochs in five runs of the same choice, 12-13 workers, so it takes four)."""
SHARE_OF_UNCONSTRAINED = 0.90
"""Issue 45: under a budget, the choice reaches this share of the unconstrained choice's rate where that fits."""
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
        me, wait = psutil.Process(), SAMPLE_S
        while not self.stop.wait(wait):
            started = time.thread_time()
            total = max(0, _shm_used() - self.shm0)
            for child in me.children(recursive=True):
                try:
                    total += child.memory_full_info().uss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            self.peak = max(self.peak, total)
            wait = max(SAMPLE_S, (time.thread_time() - started) / SAMPLER_SHARE)

    def take(self):
        time.sleep(2 * SAMPLE_S)
        peak, self.peak = self.peak, 0
        return peak

    def close(self):
        self.stop.set()
        self.thread.join()


def _settled(timeout_s=30.0):
    """Wait until this process has no child left (the workers of a loader just deleted exit on their own time)."""
    gc.collect()
    left = wait_no_children(timeout_s)
    assert not left, f"child processes outlived their loader by {timeout_s:.0f} s: {[c.pid for c in left]}"


def _loaded(dataset, batch_size, *, memory_budget, tuning, peak):
    """make_loader under ``memory_budget`` and its epochs, once no process of an earlier loader is left: (result,
    tuning peak, epochs' peak, batches of the last epoch and the mean seconds of the epochs after tuning, the
    forecast warning)."""
    _settled()
    peak.take()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AutoloaderWarning)
        loader = make_loader(dataset, batch_size, shuffle=True, tuning=tuning, step=None, cache=False,
                             device="cpu", budget=15.0, max_workers=32, memory_budget=memory_budget)
        tuning_peak = peak.take()
        epoch_peak, timed = 0, []
        for epoch in range(EPOCHS[tuning]):
            started = time.perf_counter()
            batches = sum(1 for _ in loader)
            epoch_s = time.perf_counter() - started
            taken = peak.take()
            if tuning == "online" and epoch == 0:
                tuning_peak = max(tuning_peak, taken)  # online tunes during the first epoch
            else:
                epoch_peak = max(epoch_peak, taken)
                timed.append(epoch_s)
    result = loader.tuning
    del loader
    warned = "forecast" if any("by the end of an epoch" in str(w.message) for w in caught) else "-"
    return result, tuning_peak, epoch_peak, batches, sum(timed) / len(timed), warned


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_peak_memory_stays_under_the_budget(name):
    if name == "jpeg decode":
        pytest.importorskip("PIL")
    make, batch_size, memory_budget, tuning = WORKLOADS[name]
    dataset = make()
    samples = len(dataset)
    peak = Peak()
    try:
        result, tuning_peak, epoch_peak, batches, epoch_s, warned = _loaded(
            dataset, batch_size, memory_budget=memory_budget, tuning=tuning, peak=peak)
        free, _, free_peak, _, free_s, _ = _loaded(dataset, batch_size, memory_budget=None, tuning=tuning, peak=peak)
    finally:
        peak.close()
    chosen = next((t for t in result.trials if t.ok and t.config.same_candidate(result.config)), None)
    row = dict(workload=name, tuning=tuning, budget=memory_budget, chosen=result.config.label(),
               tuning_peak=tuning_peak, epoch_peak=epoch_peak,
               footprint=None if chosen is None else chosen.footprint_bytes, batches=batches, epoch_s=epoch_s,
               rate=samples / epoch_s, free=free.config.label(), free_rate=samples / free_s, free_peak=free_peak,
               skipped=sum(1 for t in result.trials if t.status == "skipped"), trials=len(result.trials),
               warned=warned)
    ROWS.append(row)
    assert result.memory_budget_bytes == memory_budget
    assert epoch_peak <= memory_budget, row
    assert tuning_peak <= memory_budget, row
    if free_peak <= memory_budget and not free.config.same_candidate(result.config):  # the same: the ratio is noise
        assert row["rate"] >= SHARE_OF_UNCONSTRAINED * row["free_rate"], row


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("memory", "Peak memory against the memory budget")
    yield
    if not ROWS:
        return
    lines = [f"peak = workers' USS + /dev/shm used, sampled every {SAMPLE_S * 1000:.0f} ms; online: tuned in epoch 1, "
             f"its peak counted as tuning; samples/s: over the epochs after tuning; unconstrained: the same without a memory "
             f"budget (its epoch peak against this budget)",
             "",
             "| workload | tuning | budget MiB | chosen | predicted footprint MiB | peak tuning MiB | peak epoch MiB "
             "| epoch peak/budget | trials (skipped) | samples/s | unconstrained: chosen | samples/s | peak/budget "
             "| vs unconstrained | forecast warning |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        footprint = "-" if r["footprint"] is None else f"{r['footprint'] / MIB:,.0f}"
        share = r["epoch_peak"] / r["budget"]
        lines.append(f"| {r['workload']} | {r['tuning']} | {r['budget'] / MIB:,.0f} | {r['chosen']} | {footprint} "
                     f"| {r['tuning_peak'] / MIB:,.0f} | {r['epoch_peak'] / MIB:,.0f} | {share:.0%} "
                     f"| {r['trials']} ({r['skipped']}) | {r['rate']:,.0f} | {r['free']} | {r['free_rate']:,.0f} "
                     f"| {r['free_peak'] / r['budget']:.0%} | {r['rate'] / r['free_rate']:.2f} | {r['warned']} |")
    emit_table("\n".join(lines))
    run.write("\n".join(lines))
