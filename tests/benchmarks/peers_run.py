"""One contender's run for ``test_bench_peers.py``, in a process of its own: ``python peers_run.py SPEC_JSON``.

A process per run keeps every contender's memory and threads apart: the process tree measured is this process and
its children, which import torch, numpy and psutil and only the library of the contender at hand (TensorFlow alone
adds hundreds of MiB and a dozen thread pools to a process). The run: build the dataset; drop the cold files' page
cache; set the contender up (timed: ``setup_s``, its tuning or pre-pass); iterate it, warm-up discarded, then a
steady window timed; the process tree's memory sampled during the window; the contender shut down; its children
waited for (10 s) and any left killed and reported; a few batches checked against ``dataset[i]``. The last line of
stdout is ``PEERS_RESULT {json}``.
"""
from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import psutil  # noqa: E402

from peers_contenders import CONTENDERS, LIBRARY  # noqa: E402
from peers_data import ColdFiles, Cycle, batch_len, element, make_dataset, same  # noqa: E402

RESULT = "PEERS_RESULT "
MEMORY_INTERVAL_S = 0.2
"""The memory sampler's period, stretched to 20x a sample's own cost (<= 5 % of a core with many workers)."""
DISTRIBUTIONS = {"tensorflow": "tensorflow-cpu", "spdl": "spdl-core", "torchdata": "torchdata"}


def version_of(module: str) -> Optional[str]:
    for dist in (DISTRIBUTIONS.get(module, module), module):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# ---------------------------------------------------------------- memory of the process tree

class TreeMemory:
    """Peaks of the sums of USS (pages no other process maps) and of PSS (each page divided by the processes that
    map it) over this process and all its descendants (``memory_full_info()``), sampled by a thread while running.

    USS alone hides what forked workers share with their parent (copy-on-write pages count in no one's USS), so a
    tree of processes looks lighter than the same data in one process; PSS counts a page shared inside the tree
    once in all."""

    def __init__(self) -> None:
        self.peak_uss = self.peak_pss = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def sample(self) -> None:
        me = psutil.Process()
        uss = pss = 0
        for proc in [me] + me.children(recursive=True):
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            uss += info.uss
            pss += getattr(info, "pss", 0)
        self.peak_uss, self.peak_pss = max(self.peak_uss, uss), max(self.peak_pss, pss)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.sample()
            self._stop.wait(max(MEMORY_INTERVAL_S, 20 * (time.perf_counter() - started)))

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tree-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()  # the window's last moment, the contender still running


# ---------------------------------------------------------------- measuring

def measure(it: Iterator[Any], spec: Dict[str, Any], memory: TreeMemory, *, whole_epoch: bool = False
            ) -> Dict[str, Any]:
    """Warm-up (``warmup_s`` after the first batch and ``warmup_batches``), then a steady window of ``steady_s``
    and at least ``min_steady_batches``; ``whole_epoch``: every batch to the end, memory sampled throughout."""
    started = time.perf_counter()
    first = opened = last = None
    batches = samples = steady_samples = steady_batches = 0
    kept: Dict[int, Any] = {}
    ended, limited = True, False
    if whole_epoch:
        memory.start()
    for batch in it:
        now = time.perf_counter()
        n = batch_len(batch)
        if first is None:
            first = now
            kept[0] = batch
        batches += 1
        samples += n
        last = now
        if whole_epoch:
            continue
        if opened is None:
            if now - first >= spec["warmup_s"] and batches >= spec["warmup_batches"]:
                opened = now
                memory.start()
        else:
            steady_samples += n
            steady_batches += 1
            if now - opened >= spec["steady_s"] and steady_batches >= spec["min_steady_batches"]:
                ended = False
                break
        if now - started > spec["run_limit_s"]:
            ended, limited = False, True
            break
    memory.stop()
    if last is not None:
        kept[batches - 1] = batch
    out = {"batches": batches, "samples": samples, "ended": ended, "limited": limited, "kept": kept,
           "first_batch_s": None if first is None else first - started, "memory_samples": memory.samples,
           "peak_uss": memory.peak_uss, "peak_pss": memory.peak_pss}
    if whole_epoch:
        out.update(window_s=(last or started) - started, rate=samples / ((last or started) - started or 1e-9))
    elif opened is not None and last is not None and last > opened:
        out.update(window_s=last - opened, rate=steady_samples / (last - opened))
    elif ended and first is not None and last is not None and last > first:  # the data ended during the warm-up
        out.update(window_s=last - first, rate=(samples - batch_len(kept[0])) / (last - first), no_window=True)
    else:
        out.update(window_s=0.0, rate=None)
    return out


def check(ds: Any, kept: Dict[int, Any], bs: int, total: int) -> List[str]:
    """Batch k holds samples k*bs ... (every contender keeps the sampler's order); a few positions compared."""
    problems = []
    for k, batch in kept.items():
        size = batch_len(batch)
        if size != min(bs, total - k * bs):
            problems.append(f"batch {k} has {size} samples")
            continue
        for j in sorted({0, size // 2, size - 1}):
            if not same(element(batch, j), ds[k * bs + j]):
                problems.append(f"batch {k} sample {j} is not dataset[{k * bs + j}]")
    return problems


def children_left(grace_s: float = 10.0) -> List[str]:
    """Wait for this process's children to end; kill and name those still running after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    alive: List[psutil.Process] = []
    while True:
        alive = [c for c in psutil.Process().children(recursive=True) if _running(c)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    names = []
    for proc in alive:
        try:
            names.append(f"{proc.pid} {proc.name()}")
            proc.kill()
        except psutil.Error:
            continue
    return names


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run(spec: Dict[str, Any]) -> Dict[str, Any]:
    kind, bs = spec["kind"], spec["batch_size"]
    library = LIBRARY[kind] if kind != "plain" else None
    result: Dict[str, Any] = {"status": "ok", "version": version_of(library) if library else None}
    if library:
        try:
            __import__(library)
        except ImportError as err:
            return {"status": "skipped", "reason": f"{library} cannot be imported ({err}); pip install -e '.[peers]'"}
    ds = make_dataset(spec["workload"], spec.get("cold_root"), spec.get("cold_n", 0))
    cold = isinstance(ds, ColdFiles)
    online = spec.get("param") == "online"
    if online and spec.get("epoch_samples") and not cold:  # an epoch of that many samples of the same data
        ds = Cycle(ds.base if isinstance(ds, Cycle) else ds, spec["epoch_samples"])
    if cold:
        ds.drop_cache()
        result["resident_after_drop"] = ds.resident()
    opened = None
    try:
        started = time.perf_counter()
        opened = CONTENDERS[kind](ds, spec, spec.get("param"))
        result["setup_s"] = time.perf_counter() - started
        problems: List[str] = []
        if online:  # epoch 1 in full (online tunes there), then epoch 2 measured as every other contender
            it = opened.epoch()
            e1 = measure(it, spec, TreeMemory(), whole_epoch=True)
            del it
            problems += [f"epoch 1: {p}" for p in check(ds, e1.pop("kept"), bs, len(ds))]
            if e1["samples"] != len(ds):
                problems.append(f"epoch 1 delivered {e1['samples']} samples of {len(ds)}")
            result["epoch1"] = e1
            result["config_epoch1"] = opened.config()
        if cold:
            ds.drop_cache()  # what a tuner's trials read is cold again for the measured window
        it = opened.epoch()
        m = measure(it, spec, TreeMemory())
        close_iter = getattr(it, "close", None)
        if callable(close_iter):
            close_iter()
        del it
        kept = m.pop("kept")
        result.update(m, config=opened.config())
        expected = len(ds) if m["ended"] else m["batches"] * bs
        if m["samples"] != expected:
            problems.append(f"{m['samples']} samples delivered, {expected} expected")
        result["problems"] = problems
        result["_kept"] = kept
    except Exception as err:  # a contender's failure is reported, never hidden
        import traceback
        result.update(status="failed", reason=f"{type(err).__name__}: {err}", trace=traceback.format_exc()[-3000:])
    finally:
        if opened is not None:
            try:
                opened.close()
            except Exception as err:
                result.setdefault("problems", []).append(f"close failed: {type(err).__name__}: {err}")
        opened = None
        gc.collect()
        result["left"] = children_left()
    if "_kept" in result:
        kept = result.pop("_kept")
        result["problems"] += check(ds, kept, bs, len(ds))
    return result


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = run(spec)
    sys.stdout.write("\n" + RESULT + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no library's leftover thread (TensorFlow's, SPDL's source thread) may hold the exit


if __name__ == "__main__":
    main()
