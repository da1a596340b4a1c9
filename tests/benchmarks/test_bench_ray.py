"""``engine="ray"`` against a DataLoader on this machine (run with ``pytest tests/benchmarks/test_bench_ray.py
--benchmarks -s``; needs ``pip install ".[ray]"``).

One dataset (``AUTOLOADER_BENCH_RAY_MS`` ms of CPU per sample, default 2; 1,024 samples, batch 16), one simulated
step (``AUTOLOADER_BENCH_RAY_STEP_MS``, default 5 ms per batch), three loaders measured side by side in one run:
``make_loader(..., engine="ray")`` on a local Ray it starts, ``make_loader`` tuned with trials (DataLoader workers),
and a plain ``DataLoader(num_workers=1)``. For each: the seconds ``make_loader`` took (Ray's start and the trials
included), the first batch of epochs 1 and 2, epoch 2's rate, and the peak proportional memory (PSS) of this process
and all its children (Ray's processes, or the DataLoader's workers). On one machine Ray adds no core, only its
overhead: the ratio is that overhead (README "Ray Data" puts it against remote cores on paper). The run is added to
tests/benchmarks/results/ray.md (``bench_results``)."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, List

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader import make_loader
from bench_results import Run
from helpers import emit_table

pytest.importorskip("ray", reason="pip install '.[ray]'")

MS = float(os.environ.get("AUTOLOADER_BENCH_RAY_MS", "2"))
STEP_MS = float(os.environ.get("AUTOLOADER_BENCH_RAY_STEP_MS", "5"))
N, BATCH = 1024, 16
ROWS: List[Dict[str, Any]] = []


class Spin(Dataset):
    """``MS`` ms of CPU per sample (a decode and augmentation), then a uint8 3x32x32 image and its index."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int):
        end = time.perf_counter() + MS / 1000
        while time.perf_counter() < end:
            pass
        return torch.full((3, 32, 32), index % 256, dtype=torch.uint8), index


class PeakMemory:
    """The largest sum of PSS over this process and its children, sampled every ``every`` seconds in a thread."""

    def __init__(self, every: float = 0.25) -> None:
        self.every, self.peak, self._stop = every, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        me = psutil.Process()
        total = 0
        for process in [me, *me.children(recursive=True)]:
            try:
                total += process.memory_full_info().pss
            except psutil.Error:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.every)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def _epoch(loader: Any) -> Dict[str, float]:
    started = time.perf_counter()
    first, samples = None, 0
    for _, index in loader:
        first = time.perf_counter() - started if first is None else first
        samples += len(index)
        time.sleep(STEP_MS / 1000)
    seconds = time.perf_counter() - started
    return {"first_s": first or 0.0, "seconds": seconds, "rate": samples / seconds}


def _measure(name: str, make: Callable[[], Any]) -> Dict[str, Any]:
    with PeakMemory() as memory:
        started = time.perf_counter()
        loader = make()
        setup = time.perf_counter() - started
        one, two = _epoch(loader), _epoch(loader)
        label = getattr(getattr(loader, "tuning", None), "config", None)
        del loader
    row = {"name": name, "setup_s": setup, "first1": one["first_s"], "first2": two["first_s"], "rate": two["rate"],
           "epoch_s": two["seconds"], "pss": memory.peak / 2**20,
           "config": label.label() if label is not None else "num_workers=1"}
    print(f"\n{name}: {row}")
    return row


def test_ray_against_a_dataloader_on_this_machine(tmp_path):
    import autoloader.ray

    step = STEP_MS / 1000
    try:
        ROWS.append(_measure("engine='ray' (local Ray)", lambda: make_loader(
            Spin(), BATCH, shuffle=True, step=step, engine="ray", cache=False, budget=20)))
    finally:
        autoloader.ray.shutdown()
    ROWS.append(_measure("make_loader, trials", lambda: make_loader(
        Spin(), BATCH, shuffle=True, step=step, tuning="trials", cache=False, budget=20)))
    ROWS.append(_measure("DataLoader(num_workers=1)", lambda: DataLoader(
        Spin(), BATCH, shuffle=True, num_workers=1)))
    assert ROWS[0]["rate"] > 0 and all(r["pss"] > 0 for r in ROWS)


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("ray", "engine='ray' against a DataLoader on one machine")
    yield
    if len(ROWS) < 3:
        return
    reference = ROWS[1]["rate"]
    lines = [f"{N:,} samples of {MS:g} ms CPU each, batch {BATCH}, a simulated step of {STEP_MS:g} ms per batch, "
             f"`shuffle=True`; two epochs each, rates from epoch 2. Ratio: the rate over the tuned DataLoader's "
             f"(`make_loader`, trials). Memory: the peak PSS of this process and its children (Ray's processes, or "
             f"the workers).", "",
             "| loader | configuration | make_loader s | first batch, epoch 1 s | first batch, epoch 2 s | epoch 2 "
             "samples/s | ratio | peak PSS MiB |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['config']} | {r['setup_s']:.2f} | {r['first1']:.2f} | {r['first2']:.2f} | "
              f"{r['rate']:,.0f} | {r['rate'] / reference:.2f} | {r['pss']:,.0f} |" for r in ROWS]
    emit_table("\n".join(lines))
    run.write("\n".join(lines), packages=("ray",))
