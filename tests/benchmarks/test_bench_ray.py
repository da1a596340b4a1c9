"""``engine="ray"`` measured on this machine (run with ``pytest tests/benchmarks/test_bench_ray.py --benchmarks -s``;
needs ``pip install ".[ray]"``). Four measurements, each added to tests/benchmarks/results/ray.md (``bench_results``):

1. One host: one dataset (``AUTOLOADER_BENCH_RAY_MS`` ms of CPU per sample, default 2; 1,024 samples, batch 16), one
   simulated step (``AUTOLOADER_BENCH_RAY_STEP_MS``, default 5 ms per batch), three loaders side by side in one run:
   ``make_loader(..., engine="ray")`` on a local Ray it starts, ``make_loader`` tuned with trials (DataLoader workers),
   and a plain ``DataLoader(num_workers=1)``. For each: the seconds ``make_loader`` took (Ray's start and the trials
   included), the first batch of epochs 1 and 2, epoch 2's rate and its ratio to the other two, and the peak
   proportional memory (PSS) of this process and all its children. On one machine Ray adds no core, only its
   overhead: the ratios are that overhead.
2. Scale: an epoch's first batch and the driver's memory at ``AUTOLOADER_BENCH_RAY_SCALE`` samples (default 10^5,
   10^6, 10^7; batch 64, ``shuffle=True``, a fixed pool of 2 tasks, blocks of 8 batches), each in a fresh process
   (``python test_bench_ray.py scale N``): epoch 1's first batch (Ray's workers starting) with the driver's RSS
   before it and its peak until then, then epoch 2's first batch; a plain ``DataLoader`` at the same size, in a
   process of its own, for reference (the ``RandomSampler``'s own list of N Python ints is in both).
3. Transport: 9.6 MB batches (a ready 64x3x224x224 uint8 tensor, ``batch_size=None``) through one task, MB/s over
   an epoch of 32 after a first one.
4. A pool that holds every CPU of a 2-CPU Ray: Ray Data's former layout (``from_items`` rows into ``map_batches``,
   tasks and then an actor pool of 2) and the engine's read tasks, each given 120 s: finished, and in how long.

Each measurement runs whatever autoloader the process imports: run this file from another checkout (its
``tests/benchmarks``) to measure that version side by side (tests/benchmarks/results/ray.md says which)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MS = float(os.environ.get("AUTOLOADER_BENCH_RAY_MS", "2"))
STEP_MS = float(os.environ.get("AUTOLOADER_BENCH_RAY_STEP_MS", "5"))
SCALE = [int(n) for n in os.environ.get("AUTOLOADER_BENCH_RAY_SCALE", "100000,1000000,10000000").split(",")]
N, BATCH = 1024, 16
ROWS: List[Dict[str, Any]] = []
SCALE_ROWS: List[Dict[str, Any]] = []
OTHER: Dict[str, Any] = {}
MB = 1e6


class Spin(Dataset):
    """``MS`` ms of CPU per sample (a decode and augmentation), then a uint8 3x32x32 image and its index."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int):
        end = time.perf_counter() + MS / 1000
        while time.perf_counter() < end:
            pass
        return torch.full((3, 32, 32), index % 256, dtype=torch.uint8), index


class Small(Dataset):
    """``n`` samples that cost nothing: each its index (the scale measurement is the order's, not the loading's)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return index


class Big(Dataset):
    """``n`` ready batches of 64x3x224x224 uint8 (9.6 MB), the same tensor each time: only the transport costs."""

    def __init__(self, n: int) -> None:
        self.n, self.image = n, torch.zeros(64, 3, 224, 224, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return self.image


class PeakMemory:
    """The largest sum of PSS (``tree``) or the RSS of this process alone, sampled every ``every`` seconds."""

    def __init__(self, every: float = 0.25, tree: bool = True) -> None:
        self.every, self.tree, self.peak, self._stop = every, tree, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        me = psutil.Process()
        if not self.tree:
            return me.memory_info().rss
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


def fixed(config: Any) -> Callable[[], None]:
    """make_loader's search replaced by ``config`` (any autoloader version's ``make._decide``); returns the undo."""
    from autoloader.ray import make
    from autoloader.ray.records import RayTuning

    decide = make._decide
    make._decide = lambda request, arguments, source, shape, **_: (RayTuning(config, None, "fixed", shape), None)
    return lambda: setattr(make, "_decide", decide)


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


def _child(*args: str, timeout: float = 900.0) -> Dict[str, Any]:
    """``python <this file> args`` in this checkout (its autoloader), in a fresh process: its JSON line, or
    ``{"error": ...}`` when it failed or ran past ``timeout``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(HERE)]))
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=str(ROOT), env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or done.stdout[-300:]}"}
    return json.loads(lines[-1])


def test_ray_against_a_dataloader_on_this_machine(tmp_path):
    import autoloader.ray
    from autoloader import make_loader

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


def test_an_epochs_first_batch_and_the_drivers_memory_at_scale():
    for n in SCALE:
        ray_row, plain_row = _child("scale", str(n)), _child("plain", str(n), timeout=600.0)
        SCALE_ROWS.append({"n": n, "ray": ray_row, "plain": plain_row})
        print(f"\nscale {n:,}: ray {ray_row}, plain {plain_row}")
    assert SCALE_ROWS


def test_batch_transport_and_a_pool_of_every_cpu():
    OTHER["transport"] = _child("transport")
    OTHER["pool"] = _child("pool", timeout=900.0)
    print(f"\n{OTHER}")
    assert OTHER


# ------------------------------------------------------------------------ the children (``python this_file mode``)

def _scale(n: int) -> Dict[str, Any]:
    """At ``n`` samples: epoch 1's first batch (Ray's workers starting) with the driver's RSS before it and its peak
    until then (MB), then epoch 2's first batch (the time to an epoch's first batch)."""
    from autoloader import make_loader
    from autoloader.ray.records import RayConfig

    undo = fixed(RayConfig(2, batches_per_task=8, prefetch=2))
    loader = make_loader(Small(n), 64, shuffle=True, engine="ray", cache=False)
    undo()
    before = psutil.Process().memory_info().rss
    with PeakMemory(every=0.02, tree=False) as memory:
        started = time.perf_counter()
        it = iter(loader)
        next(it)
        warm = time.perf_counter() - started
    del it
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - started
    del it
    return {"first_s": round(first, 3), "epoch1_first_s": round(warm, 2), "rss_mb": round(before / MB),
            "peak_increase_mb": round((memory.peak - before) / MB)}


def _plain(n: int) -> Dict[str, Any]:
    loader = DataLoader(Small(n), 64, shuffle=True)
    before = psutil.Process().memory_info().rss
    with PeakMemory(every=0.02, tree=False) as memory:
        started = time.perf_counter()
        it = iter(loader)
        next(it)
        first = time.perf_counter() - started
    return {"first_s": round(first, 3), "rss_mb": round(before / MB),
            "peak_increase_mb": round((memory.peak - before) / MB)}


def _transport() -> Dict[str, Any]:
    """MB/s of 9.6 MB batches through one task (epoch 2 of 32 batches), and one batch's transport in ms."""
    from autoloader import make_loader
    from autoloader.ray.records import RayConfig

    undo = fixed(RayConfig(1, batches_per_task=4, prefetch=2))
    loader = make_loader(Big(32), None, engine="ray", cache=False)
    undo()
    for _ in loader:
        pass
    started = time.perf_counter()
    count = sum(1 for _ in loader)
    seconds = time.perf_counter() - started
    size = Big(1).image.numel()
    return {"mb_per_s": round(count * size / MB / seconds), "ms_per_batch": round(1000 * seconds / count, 1),
            "batch_mb": round(size / MB, 1)}


def _pool() -> Dict[str, Any]:
    """A pool holding both CPUs of a 2-CPU Ray: Ray Data's former layout with tasks and with actors, and the
    engine's read tasks; each given 120 s in a thread of its own: finished (seconds) or not."""
    import numpy as np
    import ray

    from autoloader.ray import session

    session.open_session(None, num_cpus=2)
    results: Dict[str, Any] = {}

    def load(rows):
        time.sleep(0.01)
        return {"pos": np.asarray(rows["pos"])}

    class Load:
        def __call__(self, rows):
            return load(rows)

    def former(compute: Any) -> Callable[[], int]:
        def run() -> int:
            ds = ray.data.from_items([{"pos": k} for k in range(256)], override_num_blocks=64)
            ds = ds.map_batches(load if isinstance(compute, ray.data.TaskPoolStrategy) else Load,
                                batch_size=None, batch_format="numpy", compute=compute, num_cpus=1)
            ds.context.enable_progress_bars = False
            return sum(1 for _ in ds.iter_batches(batch_size=None))
        return run

    def engine() -> int:
        from autoloader.ray.order import chunk_of
        from autoloader.ray.pipeline import Feed
        from autoloader.ray.records import RayConfig
        from autoloader.ray.waits import BATCH, STARTUP

        dataset = Small(1024)
        feed = Feed(ray, ray.put((dataset, DataLoader(dataset).collate_fn)),
                    chunk_of([list(range(k, k + 4)) for k in range(0, 1024, 4)], start=0, batched=True),
                    RayConfig(2, batches_per_task=4, prefetch=2), first=STARTUP, wait=BATCH)
        count = 0
        try:
            while True:
                feed.next()
                count += 1
        except StopIteration:
            return count
        finally:
            feed.close()

    runs = {"from_items + map_batches, 2 tasks of 1 CPU": former(ray.data.TaskPoolStrategy(size=2)),
            "from_items + map_batches, 2 actors of 1 CPU": former(ray.data.ActorPoolStrategy(size=2))}
    if importlib.util.find_spec("autoloader.ray.order") is not None:  # the engine's layout exists in this version
        runs["read tasks by position (the engine), 2 tasks of 1 CPU"] = engine
    for name, run in runs.items():
        out: List[Any] = []
        started = time.perf_counter()
        thread = threading.Thread(target=lambda: out.append(run()), daemon=True)
        thread.start()
        thread.join(120)
        results[name] = (f"finished: {out[0]} blocks in {time.perf_counter() - started:.1f} s" if out
                         else "did not finish within 120 s")
    return results


def main(args: List[str]) -> None:
    mode = args[0]
    out = {"scale": lambda: _scale(int(args[1])), "plain": lambda: _plain(int(args[1])), "transport": _transport,
           "pool": _pool}[mode]()
    print(json.dumps(out), flush=True)
    os._exit(0)  # a pool that did not finish leaves its thread blocked in Ray: the process ends anyway


@pytest.fixture(scope="module", autouse=True)
def table():
    pytest.importorskip("ray", reason="pip install '.[ray]'")
    from bench_results import Run
    from helpers import emit_table

    run = Run.start("ray", "engine='ray' on one machine: against a DataLoader, at scale, its transport")
    yield
    lines: List[str] = []
    if len(ROWS) == 3:
        tuned, single = ROWS[1]["rate"], ROWS[2]["rate"]
        lines += [f"{N:,} samples of {MS:g} ms CPU each, batch {BATCH}, a simulated step of {STEP_MS:g} ms per batch, "
                  f"`shuffle=True`; two epochs each, rates from epoch 2. Ratios: the rate over the tuned "
                  f"DataLoader's (`make_loader`, trials) and over `DataLoader(num_workers=1)`'s. Memory: the peak PSS "
                  f"of this process and its children (Ray's processes, or the workers).", "",
                  "| loader | configuration | make_loader s | first batch, epoch 1 s | first batch, epoch 2 s | epoch 2 "
                  "samples/s | / tuned | / num_workers=1 | peak PSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['name']} | {r['config']} | {r['setup_s']:.2f} | {r['first1']:.2f} | {r['first2']:.2f} | "
                  f"{r['rate']:,.0f} | {r['rate'] / tuned:.2f} | {r['rate'] / single:.2f} | {r['pss']:,.0f} |"
                  for r in ROWS]
    if SCALE_ROWS:
        lines += ["", "An epoch's first batch (epoch 2: Ray's workers already started; epoch 1's beside it) and the "
                      "driver's RSS: before epoch 1, and its peak increase until epoch 1's first batch (sampled every "
                      "20 ms); batch 64, `shuffle=True`, a pool of 2 tasks, blocks of 8 batches; a plain "
                      "`DataLoader(num_workers=0)` at the same size, in a process of its own, beside it.",
                  "", "| samples | first batch, epoch 2 s | first batch, epoch 1 s | driver RSS before MB | its peak "
                      "increase MB | plain: first batch s | plain: peak increase MB |", "|---|---|---|---|---|---|---|"]
        for row in SCALE_ROWS:
            ray_row, plain = row["ray"], row["plain"]
            cells = ([ray_row["error"], "", "", ""] if "error" in ray_row else
                     [ray_row["first_s"], ray_row["epoch1_first_s"], ray_row["rss_mb"], ray_row["peak_increase_mb"]])
            cells += [plain.get("first_s", plain.get("error")), plain.get("peak_increase_mb", "")]
            lines.append(f"| {row['n']:,} | " + " | ".join(str(c) for c in cells) + " |")
    if OTHER:
        lines += ["", f"Transport (9.6 MB batches, one task, epoch 2 of 32): {OTHER.get('transport')}", "",
                  "A pool holding both CPUs of a 2-CPU Ray, each layout given 120 s:", ""]
        lines += [f"- {name}: {outcome}" for name, outcome in (OTHER.get("pool") or {}).items()]
    if lines:
        emit_table("\n".join(lines))
        run.write("\n".join(lines), packages=("ray",))


if __name__ == "__main__":
    main(sys.argv[1:])
