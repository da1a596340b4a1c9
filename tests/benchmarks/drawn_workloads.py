"""Drawn workloads for the generator benchmark (``test_bench_drawn.py``): ``draw(seed)`` is a ``Spec``, one workload
of a seeded family, and ``Spec.dataset()`` builds it (fork start method only: the dataset holds a semaphore and
shares memory with the workers it forks).

Each family spans an axis the machine probe cannot see; the other axes are drawn too, from narrower ranges:

- **ceiling**: a hidden concurrency ceiling: every sample holds one of ``ceiling`` (K, 3-24) slots of a semaphore
  shared with the forked workers while it waits (1-8 ms), as a storage server or decoder pool that admits at most K
  requests at once; more than K workers only queue (the slots are ``cores_data.VirtualHost``'s, which gives back a
  slot a killed worker held);
- **mix**: the CPU and waiting share of a sample: CPU 0-3 ms (burnt in the calling thread, measured with
  ``time.thread_time()`` as ``workloads.CpuBound`` does), then waiting 0-8 ms (a sleep), no step;
- **gpu-step**: a step that sleeps 1-20 ms per batch (a GPU step: it holds no core);
- **cpu-step**: a step that burns 1-20 ms of one core per batch in the main process (Python/numpy, single-threaded):
  a CPU training step competing with the workers for the cores;
- **torch-step**: a step that runs a small MLP forward and backward on torch's intra-op threads (every core, as a real
  CPU training step does), sized on this machine to 1-20 ms (``Step``);
- **start-cost**: starting a worker costs ``fork_s`` (10-60 ms of CPU in the parent, before each fork, while the
  workload is ``active()``: forking a big process copies its page tables) and ``init_s`` (50-300 ms of CPU on a
  worker's first sample: its own set-up);
- **copy-on-read**: the samples gather records from a Python list of 100,000-400,000 small ``bytes`` objects, which a
  forked worker copies page by page as it reads them (reading an object writes its reference count: PyTorch issue
  13246): ``touches`` = 1 (one object per sample) or 8-64 objects spread over the whole list (so every worker soon
  copies all of it); under a memory budget in the benchmark;
- **big-samples**: waiting-bound samples of 64-512 KiB (batches of megabytes in /dev/shm); under a memory budget.

Every spec also draws its batch size (8-128) and sample size (64 B-64 KiB outside big-samples); the epoch length
(100-1,000 batches, ``n`` samples) is then sized from the drawn costs so that the best epoch lasts about
``target_s`` (1-2.4 s) on a host of ``REFERENCE_CORES`` cores (``Spec.estimate_s``; the batch size is moved, within
its range, where the epoch would fall outside 100-1,000 batches). The family is ``FAMILIES[seed % len(FAMILIES)]``,
so any ``len(FAMILIES)`` consecutive seeds draw every family once, and 24 draw each three times. The draws use
``random.Random(seed)`` alone: a seed is the same spec on any machine (``test_drawn_workloads.py`` pins two).
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from cores_data import VirtualHost

FAMILIES = ("ceiling", "cpu-step", "copy-on-read", "mix", "torch-step", "start-cost", "big-samples", "gpu-step")
"""In the order seeds draw them (``seed % len(FAMILIES)``): seeds 0-2 are a ceiling, a CPU step and copy-on-read."""
MEMORY_FAMILIES = ("copy-on-read", "big-samples")
"""The families the benchmark also runs under a memory budget."""
STEP_KINDS = ("none", "sleep", "python", "torch")

REFERENCE_CORES = 2
"""The host the epochs are sized for (this project's VM): a spec is the same on any machine."""
MAX_WORKERS = 32
"""The most workers the estimate counts on (the benchmark's sweep stops there too)."""
MIN_BATCHES, MAX_BATCHES = 100, 1000
MIN_BATCH, MAX_BATCH = 8, 128
SAMPLE_OVERHEAD_S = 40e-6
"""The estimate's CPU per sample beyond the drawn work: fetching it, its tensors, collating it (about 30-50 us on the
VM)."""
BATCH_OVERHEAD_S = 1.5e-3
"""The estimate's CPU per batch beyond its samples: handing it from a worker to the loop, both sides."""
COPY_BYTES_PER_S = 2e9
"""The estimate's memory copy speed: a sample's bytes are written once when made and once when collated."""
OBJECT_OVERHEAD_BYTES = 33 + 8
"""A ``bytes`` object's header and its slot in the list: what a worker copies per object beyond its payload."""
KIB, MIB = 1 << 10, 1 << 20


# ---------------------------------------------------------------- costs

def burn(seconds: float) -> float:
    """``seconds`` of the calling thread's CPU time, spent on numpy scalar arithmetic (as ``workloads.CpuBound``)."""
    start = time.thread_time()
    x = np.float32(1.0)
    while time.thread_time() - start < seconds:
        x = x * np.float32(1.0000001) + np.float32(1e-7)
    return float(x)


_FORK_COSTS: List[Tuple[int, float]] = []
"""(pid, seconds) of every ``DrawnDataset.active()`` in force: that process pays the seconds before each fork. An
at-fork hook cannot be unregistered: this list is the gate."""
_HOOKED = False


def _before_fork() -> None:
    pid = os.getpid()
    for owner, seconds in list(_FORK_COSTS):
        if owner == pid:
            burn(seconds)


# ---------------------------------------------------------------- the spec

@dataclass(frozen=True)
class Spec:
    """One drawn workload. Costs are seconds (per sample, per batch for the step, per fork, per worker).

    ``ceiling``: 0 for none, else at most that many samples wait at once (every process together). ``objects``: the
    length of the list the samples read (0: none), ``object_bytes`` each, ``touches`` objects per sample.
    ``budget_share``: memory families only: where the benchmark puts the memory budget, as a share of the way from
    its one-worker pool's measured peak to its largest pool's (0.25-0.75, so that some counts fit and some do not).
    """

    seed: int
    family: str
    n: int
    batch_size: int
    sample_bytes: int
    cpu_s: float
    wait_s: float
    ceiling: int = 0
    step_kind: str = "none"
    step_s: float = 0.0
    fork_s: float = 0.0
    init_s: float = 0.0
    objects: int = 0
    object_bytes: int = 0
    touches: int = 0
    budget_share: Optional[float] = None
    target_s: float = 2.0

    @property
    def id(self) -> str:
        return f"{self.seed}-{self.family}"

    @property
    def batches(self) -> int:
        return math.ceil(self.n / self.batch_size)

    @property
    def memory(self) -> bool:
        return self.budget_share is not None

    # ------------------------------------------------------------ the estimate

    def batch_cpu_s(self, batch_size: Optional[int] = None) -> float:
        """CPU seconds one batch costs whoever loads it (the drawn work and the estimate's overheads)."""
        bs = self.batch_size if batch_size is None else batch_size
        per_sample = self.cpu_s + SAMPLE_OVERHEAD_S + 2 * self.sample_bytes / COPY_BYTES_PER_S
        return bs * per_sample + BATCH_OVERHEAD_S

    def batch_s(self, batch_size: Optional[int] = None) -> float:
        """The estimate of the best seconds per batch on ``REFERENCE_CORES`` cores with up to ``MAX_WORKERS``
        workers: the slowest of the step, every core's CPU (the step's included: a torch step takes them all), the
        pool's own time, and the ceiling."""
        bs = self.batch_size if batch_size is None else batch_size
        cpu = self.batch_cpu_s(bs)
        step_cpu = {"none": 0.0, "sleep": 0.0, "python": self.step_s, "torch": self.step_s * REFERENCE_CORES}
        bounds = [self.step_s, (cpu + step_cpu[self.step_kind]) / REFERENCE_CORES,
                  (cpu + bs * self.wait_s) / MAX_WORKERS]
        if self.ceiling:
            bounds.append(bs * self.wait_s / self.ceiling)
        return max(bounds)

    @property
    def workers_guess(self) -> int:
        """The fewest workers the estimate says reach ``batch_s`` (the benchmark's sweep starts there)."""
        need = (self.batch_cpu_s() + self.batch_size * self.wait_s) / self.batch_s()
        return max(1, min(MAX_WORKERS, math.ceil(need - 1e-9)))

    @property
    def start_s(self) -> float:
        """The estimate of ``workers_guess`` workers' start: their forks, and their first samples' set-up shared by
        the cores."""
        w = self.workers_guess
        return w * (self.fork_s + 0.01) + self.init_s * max(1.0, w / REFERENCE_CORES)

    @property
    def estimate_s(self) -> float:
        """The best epoch's estimate on ``REFERENCE_CORES`` cores: its batches at ``batch_s`` after ``start_s``."""
        return self.batches * self.batch_s() + self.start_s

    def worker_copy_bytes(self) -> int:
        """The most a worker copies of the object list (all of it)."""
        return self.objects * (self.object_bytes + OBJECT_OVERHEAD_BYTES)

    # ------------------------------------------------------------ text, variants, what it builds

    def line(self) -> str:
        """The spec in one line."""
        parts = [f"seed {self.seed} {self.family}: {self.n:,} samples, batch {self.batch_size} ({self.batches} "
                 f"batches), {_bytes(self.sample_bytes)}/sample, cpu {self.cpu_s * 1e3:.2f} ms + wait "
                 f"{self.wait_s * 1e3:.2f} ms" + (f" (ceiling {self.ceiling})" if self.ceiling else "")]
        parts.append("no step" if self.step_kind == "none" else f"step {self.step_kind} {self.step_s * 1e3:.1f} ms")
        if self.fork_s or self.init_s:
            parts.append(f"fork {self.fork_s * 1e3:.0f} ms + init {self.init_s * 1e3:.0f} ms")
        if self.objects:
            reads = "one object" if self.touches == 1 else f"{self.touches} objects spread"
            parts.append(f"{self.objects:,} objects of {self.object_bytes} B ({reads} per sample, "
                         f"{self.worker_copy_bytes() / MIB:,.0f} MiB a worker copies at most)")
        if self.memory:
            parts.append(f"budget at {self.budget_share:.2f} of the way from 1 worker's peak to the largest pool's")
        parts.append(f"estimate {self.estimate_s:.1f} s (~{self.workers_guess} workers, {REFERENCE_CORES} cores)")
        return "; ".join(parts)

    def scaled(self, factor: float) -> "Spec":
        """The same workload with ``factor`` times the samples (a shorter epoch for a quick run)."""
        return replace(self, n=max(self.batch_size * 20, int(self.n * factor)))

    def dataset(self) -> "DrawnDataset":
        return DrawnDataset(self)

    def step(self) -> "Step":
        return Step(self.step_kind, self.step_s)


def _bytes(n: int) -> str:
    return f"{n / KIB:.1f} KiB" if n >= KIB else f"{n} B"


def _log(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _maybe(rng: random.Random, lo: float, hi: float, zero: float = 0.2) -> float:
    """0 with probability ``zero``, else uniform in [lo, hi]."""
    return 0.0 if rng.random() < zero else rng.uniform(lo, hi)


def draw(seed: int) -> Spec:
    """The workload of ``seed`` (an int >= 0): its family is ``FAMILIES[seed % len(FAMILIES)]``, the rest drawn."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r}: pass an int >= 0")
    rng = random.Random(seed)
    family = FAMILIES[seed % len(FAMILIES)]
    target_s = rng.uniform(1.0, 2.4)
    batch_size = int(round(_log(rng, MIN_BATCH, MAX_BATCH)))
    sample_bytes = int(_log(rng, 64, 64 * KIB))
    cpu_s, wait_s = _maybe(rng, 0.05e-3, 3e-3), _maybe(rng, 0.1e-3, 8e-3)
    kw: dict = {}
    if family == "ceiling":
        kw = dict(ceiling=rng.randint(3, 24), step_kind="sleep" if rng.random() < 0.5 else "none")
        cpu_s, wait_s = _maybe(rng, 0.02e-3, 0.3e-3, zero=0.5), rng.uniform(1e-3, 8e-3)
        kw["step_s"] = rng.uniform(0.5e-3, 5e-3) if kw["step_kind"] == "sleep" else 0.0
    elif family in ("gpu-step", "cpu-step", "torch-step"):
        kind = {"gpu-step": "sleep", "cpu-step": "python", "torch-step": "torch"}[family]
        kw = dict(step_kind=kind, step_s=_log(rng, 1e-3, 20e-3))
    elif family == "start-cost":
        kw = dict(fork_s=rng.uniform(0.01, 0.06), init_s=rng.uniform(0.05, 0.3),
                  step_kind="sleep" if rng.random() < 0.5 else "none")
        kw["step_s"] = rng.uniform(0.5e-3, 5e-3) if kw["step_kind"] == "sleep" else 0.0
    elif family == "copy-on-read":
        spread = (seed // len(FAMILIES)) % 2 == 0  # both kinds among any 2 * len(FAMILIES) consecutive seeds
        kw = dict(objects=rng.randint(100_000, 400_000), object_bytes=rng.randint(128, 640),
                  touches=rng.randint(8, 64) if spread else 1, budget_share=rng.uniform(0.25, 0.75))
        cpu_s, wait_s = _maybe(rng, 0.02e-3, 0.5e-3, zero=0.5), rng.uniform(0.5e-3, 3e-3)
    elif family == "big-samples":
        sample_bytes = int(_log(rng, 64 * KIB, 512 * KIB))
        batch_size = rng.randint(8, 32)
        cpu_s, wait_s = _maybe(rng, 0.02e-3, 0.5e-3, zero=0.5), rng.uniform(1e-3, 6e-3)
        kw = dict(budget_share=rng.uniform(0.25, 0.75))
    spec = Spec(seed=seed, family=family, n=1, batch_size=batch_size, sample_bytes=sample_bytes, cpu_s=cpu_s,
                wait_s=wait_s, target_s=target_s, **kw)
    return _sized(spec, big=family == "big-samples")


def parse_seeds(text: str) -> List[int]:
    """``"0-23"``, ``"3,7,12"`` or both (``"0-5,9"``) as a list of seeds, in order, without repeats."""
    seeds: List[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        found = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        lo, hi = (int(found.group(1)), int(found.group(2) or found.group(1))) if found else (0, -1)
        if hi < lo:
            raise ValueError(f"seeds {text!r}: {part!r} is neither a seed nor a range of them; pass e.g. "
                             f"AUTOLOADER_BENCH_DRAWN_SEEDS=0-23 or 3,7,12")
        seeds += [s for s in range(lo, hi + 1) if s not in seeds]
    return seeds


def _sized(spec: Spec, *, big: bool) -> Spec:
    """``spec`` with the batch count that makes its best epoch ``target_s``, its start included (within 100-1,000
    batches: the batch size moves within its range first)."""
    lo_bs, hi_bs = (8, 32) if big else (MIN_BATCH, MAX_BATCH)

    def batches(bs: int) -> float:
        at = replace(spec, batch_size=bs)
        return max(spec.target_s - at.start_s, 0.0) / at.batch_s()

    bs = spec.batch_size
    for _ in range(8):
        count = batches(bs)
        if count > MAX_BATCHES and bs < hi_bs:
            bs = min(hi_bs, math.ceil(bs * count / MAX_BATCHES))
        elif count < MIN_BATCHES and bs > lo_bs:
            bs = max(lo_bs, math.floor(bs * max(count, 1.0) / MIN_BATCHES))
        else:
            break
    count = min(MAX_BATCHES, max(MIN_BATCHES, round(batches(bs))))
    return replace(spec, batch_size=bs, n=count * bs)


# ---------------------------------------------------------------- the dataset and the step

class DrawnDataset(Dataset):
    """The samples of ``spec``: sample ``i`` is ``(i, payload)``, the payload ``spec.sample_bytes`` uint8 bytes.

    Per sample, in order: a worker's set-up on its first sample (``init_s`` of CPU; the process that built the
    dataset has none), the object reads, ``cpu_s`` of CPU, then ``wait_s`` asleep (holding a slot of the ceiling
    when there is one). ``close()`` once every process that used it is gone."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.creator = os.getpid()
        self._inited = self.creator
        self.host: Optional[VirtualHost] = VirtualHost(spec.ceiling) if spec.ceiling else None
        self.items: List[bytes] = [bytes([i % 251]) * spec.object_bytes for i in range(spec.objects)]

    def __len__(self) -> int:
        return self.spec.n

    def positions(self, i: int) -> List[int]:
        """The objects sample ``i`` reads: ``touches`` of them, one in each of ``touches`` equal stretches of the
        list, so that the samples together read it evenly (``(j * n + i) / (n * touches)`` of the way along)."""
        spec = self.spec
        total = spec.n * spec.touches
        return [((j * spec.n + i) * spec.objects) // total for j in range(spec.touches)]

    def __getitem__(self, i: int) -> Tuple[int, torch.Tensor]:
        spec = self.spec
        if not 0 <= i < spec.n:
            raise IndexError(f"index {i} out of range for {spec.n} samples")
        pid = os.getpid()
        if spec.init_s and self._inited != pid:
            self._inited = pid
            burn(spec.init_s)
        acc = 0
        if spec.objects:
            for p in self.positions(i):
                acc += self.items[p][0]
        if spec.cpu_s:
            burn(spec.cpu_s)
        if spec.wait_s:
            if self.host is not None:
                self.host.hold(spec.wait_s)
            else:
                time.sleep(spec.wait_s)
        return i, torch.full((spec.sample_bytes,), (i + acc) % 251, dtype=torch.uint8)

    @contextlib.contextmanager
    def active(self) -> Iterator["DrawnDataset"]:
        """While the block runs, this process pays ``spec.fork_s`` of CPU before each fork (a no-op without it)."""
        global _HOOKED
        if not self.spec.fork_s:
            yield self
            return
        if not _HOOKED:
            os.register_at_fork(before=_before_fork)
            _HOOKED = True
        entry = (os.getpid(), self.spec.fork_s)
        _FORK_COSTS.append(entry)
        try:
            yield self
        finally:
            _FORK_COSTS.remove(entry)

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host = None
        self.items = []


TORCH_STEP_FIXED_S, TORCH_STEP_ROW_S = 0.25e-3, 3.9e-6
"""The torch step's seconds on ``REFERENCE_CORES`` idle cores: a fixed part plus one per row of its batch (its MLP
forward and backward took 0.46, 1.11 and 4.24 ms at 64, 256 and 1,024 rows on the project's VM). The step is sized
from these, not calibrated where it runs: a calibration on a busy machine (a load average of 50 on this VM while
others ran) sized a 3 ms step at 17 rows, so the same seed would be another workload."""


class Step:
    """The training step of a spec, called with each batch (and ignoring it): ``"none"``; ``"sleep"`` for
    ``seconds`` (a GPU step); ``"python"``: ``seconds`` of one core's CPU (``burn``); ``"torch"``: a two-layer MLP's
    forward and backward on torch's intra-op threads (every core: torch's default), its batch of ``rows`` sized so
    that one call takes ``seconds`` on the reference VM (``TORCH_STEP_ROW_S``): the same work on any machine.
    ``measured_s``: the median wall seconds of 5 calls, timed at construction here (None for "none")."""

    FEATURES = 256

    def __init__(self, kind: str, seconds: float) -> None:
        if kind not in STEP_KINDS:
            raise ValueError(f"kind={kind!r}: pass one of {STEP_KINDS}")
        self.kind, self.seconds = kind, float(seconds)
        self.rows = 0
        self.measured_s: Optional[float] = None
        if kind == "torch":
            generator = torch.Generator().manual_seed(0)
            self.layers = [torch.nn.Linear(self.FEATURES, self.FEATURES) for _ in range(2)]
            self.rows = max(8, round((self.seconds - TORCH_STEP_FIXED_S) / TORCH_STEP_ROW_S))
            self.x = torch.randn(self.rows, self.FEATURES, generator=generator)
        if kind != "none":
            self.measured_s = self._median_s()

    def _median_s(self) -> float:
        for _ in range(2):
            self()
        times = []
        for _ in range(5):
            started = time.perf_counter()
            self()
            times.append(time.perf_counter() - started)
        return sorted(times)[2]

    def __call__(self, batch: Any = None) -> None:
        if self.kind == "sleep":
            time.sleep(self.seconds)
        elif self.kind == "python":
            burn(self.seconds)
        elif self.kind == "torch":
            out = self.x
            for k, layer in enumerate(self.layers):
                out = layer(out) if k == 0 else layer(torch.relu(out))
            out.sum().backward()
            for layer in self.layers:
                layer.zero_grad(set_to_none=True)

    def describe(self) -> str:
        if self.kind == "none":
            return "no step"
        rows = f", {self.rows} rows" if self.kind == "torch" else ""
        return f"{self.kind} {self.seconds * 1e3:.1f} ms (measured {self.measured_s * 1e3:.1f} ms{rows})"
