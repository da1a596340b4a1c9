#!/usr/bin/env python
"""Checks of autoloader's CUDA claims (README) on a real GPU; one line per check:
``PASS|FAIL|SKIP <name>: <figures> [<seconds>]``, then ``no_process_left`` and a summary.

    python scripts/gpu_check.py                  # every check: about 4 minutes on one H200 (228 s measured), 5 at most
    python scripts/gpu_check.py overlap stall    # only the checks whose name contains "overlap" or "stall"
    python scripts/gpu_check.py --list           # the checks, their time limits and what each asserts
    python scripts/gpu_check.py --cpu-dry-run    # the same code paths on the CPU (small sizes; no GPU verdicts)
    python scripts/gpu_check.py -v               # also show every check's stderr (trial tables, warnings)

Exit status 1 if any check fails, else 0. Without CUDA it prints ``SKIP <name>: no CUDA device`` per check and
exits 0.

How it runs: each check runs in a fresh Python process (``--child NAME``) in its own session, so a check has its
own time limit (the process group is killed when it passes; a traceback of every thread is dumped to its stderr just
before), its own CUDA context (memory figures are not polluted by another check), and a crash or hang fails that
check only. After each check, any process left in its session (a DataLoader worker, a fork server) is reported and
killed; ``no_process_left`` fails if there was any. There is an overall deadline (``--deadline``, 300 s): a check
that would start after it is skipped, one that would run past it gets a shorter limit.

With ``--cpu-dry-run`` the checks run on the CPU with small sizes: a check marked ``cpu=verdict`` asserts the same
things (they hold on the CPU too), one marked ``cpu=dry`` runs its code but its verdict is CUDA-specific, so it
prints ``DRY`` (and what it would have said) unless it raised; ``cpu=skip`` checks only make sense on CUDA.

To add a check: ``@check(limit_s=..., cpu=...)`` on ``def check_<name>(ctx) -> Tuple[bool, str]``; datasets go in
``scripts/gpu_data.py`` (workers under spawn/forkserver import them by module name).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import gc
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import gpu_data as data  # noqa: E402
from gpu_data import MEAN, STD, reference_normalize  # noqa: E402

Outcome = Tuple[bool, str]
RESULT_MARK = "@@gpu_check-result@@ "
MIB = 2 ** 20
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""multiprocessing's own long-lived helpers (started by the first spawn/forkserver worker, one per process)."""


# -- the registry -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[["Ctx"], Outcome]
    limit_s: float
    cpu: str
    """``verdict``: runs on the CPU with the same assertions; ``dry``: runs on the CPU, verdict is CUDA-only;
    ``skip``: CUDA only."""

    @property
    def summary(self) -> str:
        return " ".join((self.fn.__doc__ or "").split())


CHECKS: List[Check] = []


def check(limit_s: float, cpu: str = "verdict") -> Callable[[Callable[["Ctx"], Outcome]], Callable[["Ctx"], Outcome]]:
    assert cpu in ("verdict", "dry", "skip")

    def register(fn: Callable[["Ctx"], Outcome]) -> Callable[["Ctx"], Outcome]:
        CHECKS.append(Check(fn.__name__[len("check_"):], fn, limit_s, cpu))
        return fn

    return register


class Skip(Exception):
    """Raised by a check that cannot run here (e.g. a second GPU is needed)."""


class Verdict:
    """A check's sub-assertions: each failed one is marked ``[X]`` in the figures."""

    def __init__(self) -> None:
        self.ok = True
        self.parts: List[str] = []

    def need(self, condition: Any, text: str) -> None:
        if not condition:
            self.ok = False
        self.parts.append(text if condition else f"[X] {text}")

    def info(self, text: str) -> None:
        self.parts.append(text)

    def outcome(self) -> Outcome:
        return self.ok, "; ".join(self.parts)


# -- the device, or the CPU standing in for it --------------------------------------------------------------------

class CpuEvent:
    """``torch.cuda.Event``'s timing interface on the host clock, for ``--cpu-dry-run``."""

    def __init__(self) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "CpuEvent") -> float:
        return (end.t - self.t) * 1000.0


class Ctx:
    """What a check runs on: ``cuda`` (the real thing) or the CPU (``--cpu-dry-run``: small sizes, no streams)."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.cuda = not dry
        self.device = torch.device("cpu" if dry else "cuda")

    def size(self, gpu: Any, cpu: Any) -> Any:
        return cpu if self.dry else gpu

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True) if self.cuda else CpuEvent()

    def reserved(self) -> int:
        return torch.cuda.memory_reserved() if self.cuda else 0

    def allocated(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else 0

    def new_stream(self) -> Any:
        return torch.cuda.Stream() if self.cuda else None

    def current_stream(self) -> Any:
        return torch.cuda.current_stream() if self.cuda else None

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def time_ms(self, fn: Callable[[], object], repeat: int = 5) -> float:
        """Median time of ``fn`` on the current stream (CUDA events), or on the host clock."""
        times = []
        for _ in range(repeat):
            start, end = self.event(), self.event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    def spin_step(self, ms: float) -> Callable[[Any], None]:
        """A step of ``ms`` milliseconds: a GPU spin calibrated here (not with autoloader's calibration), or a sleep."""
        if not self.cuda:
            return lambda batch: time.sleep(ms / 1000.0)
        torch.cuda._sleep(int(2e8))  # ~100 ms: an idle GPU runs slow clocks until it has work
        cycles = 10_000_000
        per_ms = cycles / self.time_ms(lambda: torch.cuda._sleep(cycles))
        n = max(1, int(ms * per_ms))

        def step(batch: Any) -> None:
            torch.cuda._sleep(n)
            if isinstance(batch, torch.Tensor):
                batch.view(-1)[:1024].sum()  # reads the batch: its copy must have finished

        return step


def mib(n: float) -> str:
    return f"{n / MIB:,.0f}"


def children_left(grace: float = 3.0) -> Tuple[List[str], List[str]]:
    """This process's descendants still running after up to ``grace`` seconds: (others, multiprocessing helpers).
    A forkserver's workers are the fork server's children, so they count as others."""
    import multiprocessing

    import psutil

    deadline = time.monotonic() + grace
    while True:
        multiprocessing.active_children()
        gc.collect()
        others, helpers = [], []
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                line = f"{proc.pid} {' '.join(proc.cmdline())[:120]}"
            except psutil.Error:
                continue
            (helpers if any(h in line for h in HELPERS) else others).append(line)
        if not others or time.monotonic() >= deadline:
            return others, helpers
        time.sleep(0.1)


@contextlib.contextmanager
def quiet() -> Iterator[List[warnings.WarningMessage]]:
    """Collect warnings (AutoloaderWarning, DataLoader's) instead of printing them; the check reports what matters."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    for w in caught:
        print(f"warning: {w.category.__name__}: {w.message}", file=sys.stderr)


def show(title: str, obj: Any) -> None:
    """Context for a failure: printed to stderr, which the harness shows for a failed check (all of it with -v)."""
    print(f"--- {title}\n{obj}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def counting_streams(ctx: Ctx, sink: List[Any]) -> Iterator[None]:
    """Record every new ``torch.cuda.Stream`` made inside (autoloader makes its side streams through that name).
    ``torch.cuda.current_stream()`` also goes through that name, to wrap an existing stream (``stream_id=``): those
    are not new streams and are not recorded."""
    if not ctx.cuda:
        yield
        return
    original = torch.cuda.Stream

    class Counted(original):  # type: ignore[misc, valid-type]
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            stream = super().__new__(cls, *args, **kwargs)
            if "stream_id" not in kwargs:
                sink.append(stream)
            return stream

    torch.cuda.Stream = Counted  # type: ignore[misc]
    try:
        yield
    finally:
        torch.cuda.Stream = original  # type: ignore[misc]


def trial_rows(trials: Sequence[Any]) -> str:
    return ", ".join(f"{t.config.label()}: " + (f"{t.samples_per_s:,.0f}/s" if t.ok else f"{t.status} ({t.reason})")
                     for t in trials)


# -- the checks ---------------------------------------------------------------------------------------------------

@check(limit_s=25)
def check_normalize_matches_cpu(ctx: Ctx) -> Outcome:
    """uint8 NCHW batches (2 workers, pinned) normalised to float32 by PrefetchLoader on the device equal the CPU
    reference: max |device - cpu| <= 1e-5, 6 of 6 batches, all on the device as float32."""
    from autoloader.loader.prefetch import PrefetchLoader

    ds = data.Images(96, ctx.size(64, 16))
    loader = PrefetchLoader(DataLoader(ds, batch_size=16, pin_memory=ctx.cuda, num_workers=2), device=ctx.device,
                            normalize=(MEAN, STD), dtype=torch.float32)
    worst, batches, close = 0.0, 0, True
    for (images, _, _), (raw, _, _) in zip(loader, DataLoader(ds, batch_size=16)):
        got, want = images.cpu(), reference_normalize(raw)
        worst = max(worst, (got - want).abs().max().item())
        close = close and images.device.type == ctx.device.type and images.dtype == torch.float32 \
            and torch.allclose(got, want, 1e-5, 1e-5)
        batches += 1
    v = Verdict()
    v.need(close and batches == 6, f"max |{ctx.device.type} - cpu| = {worst:.2e} over {batches}/6 batches, "
                                   f"float32 on {ctx.device.type}")
    return v.outcome()


def _intervals(origin: Any, pairs: Sequence[Tuple[Any, Any]]) -> List[Tuple[float, float]]:
    return [(origin.elapsed_time(a), origin.elapsed_time(b)) for a, b in pairs]


def _overlap(copies: Sequence[Tuple[float, float]], steps: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """(ms of copy time during which a step ran, total copy ms)."""
    both = sum(max(0.0, min(ce, se) - max(cs, ss)) for cs, ce in copies for ss, se in steps)
    return both, sum(ce - cs for cs, ce in copies)


@contextlib.contextmanager
def traced_side_copies(ctx: Ctx, sink: List[Tuple[Any, Any, Any]]) -> Iterator[bool]:
    """Events around each copy PrefetchLoader queues: ``stream_copy.load`` calls ``map_tensors`` inside the side
    stream's context, after ``stream.wait_stream(consumer)``, so events recorded around that call time the copy itself
    on the side stream. Yields False when stream_copy.py no longer calls ``map_tensors`` (update this tracer)."""
    from autoloader.loader import stream_copy

    original = getattr(stream_copy, "map_tensors", None)
    if original is None:
        yield False
        return

    def traced(fn: Callable[[Any], Any], batch: Any) -> Any:
        stream = torch.cuda.current_stream() if ctx.cuda else None
        start, end = ctx.event(), ctx.event()
        start.record(stream)
        out = original(fn, batch)
        end.record(stream)
        sink.append((start, end, stream))
        return out

    stream_copy.map_tensors = traced
    try:
        yield True
    finally:
        stream_copy.map_tensors = original


@check(limit_s=40, cpu="dry")
def check_overlap(ctx: Ctx) -> Outcome:
    """A copy-bound epoch (60 pinned 64x3x224x224 float32 batches, a GPU step as long as one copy): PrefetchLoader
    against a plain loop doing .to(device, non_blocking=True) on the current stream. Asserts: prefetch epoch >= 1.3x
    faster (best of 3 each); in a traced epoch, CUDA events on the side stream around each copy and on the current
    stream around each step show >= 50 % of the copy time overlapping a step, the copies ran on a stream other than
    the consumer's, and the plain loop (the control) overlaps < 5 %."""
    from autoloader.loader.prefetch import PrefetchLoader

    shape = ctx.size((64, 3, 224, 224), (8, 3, 32, 32))
    ds = data.PinnedBatches(ctx.size(60, 12), 4, shape, pin=ctx.cuda)
    dev = ctx.device
    sample = ds[0]
    copy_ms = ctx.time_ms(lambda: sample.to(dev, non_blocking=True)) if ctx.cuda else 1.0
    step = ctx.spin_step(copy_ms)
    step_ms = ctx.time_ms(lambda on_device=sample.to(dev): step(on_device))

    def plain_epoch(trace: Optional[List[Tuple[Any, Any]]] = None,
                    steps: Optional[List[Tuple[Any, Any]]] = None) -> float:
        ctx.sync()
        start = time.perf_counter()
        for batch in DataLoader(ds, batch_size=None):
            if trace is None:
                step(batch.to(dev, non_blocking=True))
                continue
            a, b, c, d = ctx.event(), ctx.event(), ctx.event(), ctx.event()
            a.record()
            x = batch.to(dev, non_blocking=True)
            b.record()
            c.record()
            step(x)
            d.record()
            trace.append((a, b))
            steps.append((c, d))  # type: ignore[union-attr]
        ctx.sync()
        return time.perf_counter() - start

    loader = PrefetchLoader(DataLoader(ds, batch_size=None), device=dev)

    def prefetch_epoch(steps: Optional[List[Tuple[Any, Any]]] = None) -> float:
        ctx.sync()
        start = time.perf_counter()
        for batch in loader:
            if steps is None:
                step(batch)
                continue
            c, d = ctx.event(), ctx.event()
            c.record()
            step(batch)
            d.record()
            steps.append((c, d))
        ctx.sync()
        return time.perf_counter() - start

    plain_epoch(), prefetch_epoch()  # warm-up: the allocator's cache, the pinned pages, the clocks
    plain = min(plain_epoch() for _ in range(3))
    overlapped = min(prefetch_epoch() for _ in range(3))
    speedup = plain / overlapped

    # traced epochs: events only here, so they cannot slow the timed ones
    origin = ctx.event()
    ctx.sync()
    origin.record()
    plain_copies: List[Tuple[Any, Any]] = []
    plain_steps: List[Tuple[Any, Any]] = []
    plain_epoch(plain_copies, plain_steps)
    plain_both, plain_total = _overlap(_intervals(origin, plain_copies), _intervals(origin, plain_steps))

    side: List[Tuple[Any, Any, Any]] = []
    pf_steps: List[Tuple[Any, Any]] = []
    consumer_stream = ctx.current_stream()
    with traced_side_copies(ctx, side) as traceable:
        origin = ctx.event()
        ctx.sync()
        origin.record()
        prefetch_epoch(pf_steps)
    both, total = _overlap(_intervals(origin, [(a, b) for a, b, _ in side]), _intervals(origin, pf_steps))
    share = both / total if total > 0 else 0.0
    plain_share = plain_both / plain_total if plain_total > 0 else 0.0
    on_side = bool(side) and all(s is not None and s != consumer_stream for _, _, s in side)

    v = Verdict()
    v.need(speedup >= 1.3, f"{speedup:.2f}x faster with PrefetchLoader (target >= 1.3x): plain {plain * 1e3:.1f} ms, "
                           f"prefetch {overlapped * 1e3:.1f} ms per {len(ds)} batches")
    v.info(f"one copy {copy_ms:.2f} ms ({math.prod(shape) * 4 / 1e6:.0f} MB), one step {step_ms:.2f} ms")
    v.need(traceable and len(side) == len(ds), f"{len(side)}/{len(ds)} side-stream copies traced")
    v.need(on_side, "copies on a side stream, not the consumer's")
    v.need(share >= 0.5, f"{share:.0%} of the copy time overlaps a step (target >= 50 %)")
    v.need(plain_share < 0.05, f"control: plain loop overlaps {plain_share:.0%} (target < 5 %)")
    return v.outcome()


@check(limit_s=40, cpu="dry")
def check_reserved_memory_flat(ctx: Ctx) -> Outcome:
    """memory_reserved() after each of 5 epochs of a PrefetchLoader (2 persistent workers, pinned, uint8 32x3x224x224
    normalised to float32 on the device, a step that reads a value back each batch) never exceeds the first epoch's
    by more than one float32 batch, with one side stream for all epochs; the negative control (a new
    torch.cuda.Stream per epoch for the copies, the same loop otherwise) grows by >= 3 batches over the 5 epochs."""
    from autoloader.loader.prefetch import PrefetchLoader

    shape = ctx.size((3, 224, 224), (3, 32, 32))
    bs = 32
    batch_bytes = bs * math.prod(shape) * 4
    ds = data.Pool(8 * bs, shape, torch.uint8, distinct=32)
    loader = PrefetchLoader(DataLoader(ds, batch_size=bs, num_workers=2, pin_memory=ctx.cuda, persistent_workers=True),
                            device=ctx.device, normalize=(MEAN, STD), dtype=torch.float32)
    reserved, streams = [], set()
    for _ in range(5):
        for images, _ in loader:
            images.mul_(1.0)
            float(images.view(-1)[0])  # the loop's loss.item(): the host waits for the step, as training does
        ctx.sync()
        reserved.append(ctx.reserved())
        stream = getattr(loader, "stream", None)
        streams.add(None if stream is None else stream.cuda_stream)
    del loader
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()

    control = []
    plain = DataLoader(ds, batch_size=bs, num_workers=0, pin_memory=ctx.cuda)
    for _ in range(5):
        side = ctx.new_stream()  # the mistake: a stream per epoch strands the previous epochs' cached blocks
        consumer = ctx.current_stream()
        for images, _ in plain:
            with ctx.on(side):
                if side is not None:
                    side.wait_stream(consumer)
                x = images.to(ctx.device, non_blocking=True).to(torch.float32)
            if side is not None:
                consumer.wait_stream(side)
                x.record_stream(consumer)
            x.mul_(1.0)
            float(x.view(-1)[0])
        ctx.sync()
        control.append(ctx.reserved())
    growth, control_growth = max(reserved) - reserved[0], control[-1] - control[0]
    v = Verdict()
    v.need(growth <= batch_bytes, f"PrefetchLoader reserved MiB after each epoch: {', '.join(mib(r) for r in reserved)}"
                                  f" (growth {mib(growth)} MiB, limit one batch = {mib(batch_bytes)} MiB)")
    v.need(len(streams) == 1 and None not in streams, f"{len(streams)} side stream(s) over 5 epochs"
           + (" (loader.stream is None)" if None in streams else ""))
    v.need(control_growth >= 3 * batch_bytes, f"control, a stream per epoch: {', '.join(mib(r) for r in control)} "
                                              f"(growth {mib(control_growth)} MiB, target >= {mib(3 * batch_bytes)})")
    return v.outcome()


@check(limit_s=40, cpu="dry")
def check_tuning_releases_memory(ctx: Ctx) -> Outcome:
    """make_loader with its trials on the GPU (uint8 64x3x224x224 batches normalised to float32, step=0.005,
    budget 8 s) gives back what tuning cached: memory_reserved() right after make_loader is <= before + 32 MiB (the
    peak during tuning is shown, to prove the check can tell). At most one torch.cuda.Stream is
    created by tuning plus the returned loader's first batches (one side stream per device, shared)."""
    from autoloader import make_loader

    shape = ctx.size((3, 224, 224), (3, 32, 32))
    bs = ctx.size(64, 16)
    ds = data.Pool(4096, shape, torch.uint8, distinct=64)
    if ctx.cuda:
        torch.zeros(1, device=ctx.device)
        ctx.sync()
        torch.cuda.reset_peak_memory_stats()
    before, allocated_before = ctx.reserved(), ctx.allocated()
    created: List[Any] = []
    with quiet(), counting_streams(ctx, created):
        loader = make_loader(ds, batch_size=bs, device=ctx.device, step=0.005, budget=ctx.size(8, 4), cache=False,
                             normalize=(MEAN, STD), dtype=torch.float32, max_workers=4, tuning="trials")
        ctx.sync()
        after, allocated_after = ctx.reserved(), ctx.allocated()
        peak = torch.cuda.max_memory_reserved() if ctx.cuda else 0
        in_tuning = len(created)
        for i, (images, _) in enumerate(loader):
            if i == 4:
                break
    show("tuning", loader.tuning)
    v = Verdict()
    v.need(after - before <= 32 * MIB, f"reserved {mib(before)} MiB before make_loader, {mib(after)} MiB after "
                                       f"(limit +32 MiB); peak during tuning {mib(peak)} MiB")
    v.info(f"allocated {mib(allocated_before)} -> {mib(allocated_after)} MiB; {len(loader.tuning.trials)} trials")
    if ctx.cuda and peak - before < 64 * MIB:
        v.info("tuning cached < 64 MiB: this run cannot tell whether it is released")
    handles = {stream.cuda_stream for stream in created}
    v.need(len(handles) <= 1, f"{len(handles)} side stream(s) made by tuning and the loader's first batches "
                              f"({len(created)} torch.cuda.Stream() calls, {in_tuning} during tuning; "
                              f"one per device)")
    return v.outcome()


def _churn_epoch(ctx: Ctx, loader: Any, epoch: int, big: int) -> Tuple[int, int]:
    """Consume one epoch while allocating, filling and freeing big tensors; (batches, corrupted)."""
    sums, expected = [], []
    for i, (images, _, cpu_sums) in enumerate(loader):
        junk = [torch.empty(big + (i * 7919 % 4096), dtype=torch.uint8, device=ctx.device).fill_(i % 255)
                for _ in range(3)]
        if ctx.cuda:
            torch.cuda._sleep(200_000)
        sums.append(data.checksum(images))
        expected.append(cpu_sums)
        del junk, images
        if ctx.cuda and (i + epoch) % 5 == 0:
            torch.cuda.empty_cache()
    if not sums:
        return 0, 0
    bad = (torch.cat(sums) != torch.cat(expected).to(ctx.device)).view(len(sums), -1).any(dim=1)
    return len(sums), int(bad.sum().item())


@check(limit_s=40)
def check_no_corruption_under_allocator_churn(ctx: Ctx) -> Outcome:
    """A consumer that allocates, fills and frees 3 x 64 MiB per batch (and empties the cache every 5 batches) never
    sees a corrupted batch: 0 of 90 GPU checksums differ from the CPU ones (the last epoch consumed on a non-default
    stream)."""
    from autoloader.loader.prefetch import PrefetchLoader

    loader = PrefetchLoader(DataLoader(data.Images(960, ctx.size(128, 32)), batch_size=32, pin_memory=ctx.cuda,
                                       num_workers=2), device=ctx.device)
    big = ctx.size(64 * MIB, MIB)
    batches = corrupted = 0
    user_stream = ctx.new_stream()
    for epoch in range(3):
        if epoch == 2 and user_stream is not None:
            with torch.cuda.stream(user_stream):
                n, bad = _churn_epoch(ctx, loader, epoch, big)
            ctx.sync()
        else:
            n, bad = _churn_epoch(ctx, loader, epoch, big)
        batches, corrupted = batches + n, corrupted + bad
    v = Verdict()
    v.need(corrupted == 0 and batches == 90, f"{corrupted} of {batches}/90 batches corrupted"
           + (" (last epoch consumed on a non-default stream)" if ctx.cuda else ""))
    return v.outcome()


@check(limit_s=30, cpu="dry")
def check_gpu_bound_tuning(ctx: Ctx) -> Outcome:
    """tune() with step=0.05 (the simulated GPU step) and fast in-memory data (batch 32 of 3x32x32 uint8, budget
    6 s): no trial failed or was skipped, every trial's rate is within 10 % of 32/0.05 = 640 samples/s, the
    bottleneck is "consumer"."""
    from autoloader import tune

    bs = 32
    with quiet():
        result = tune(data.Pool(4096, (3, 32, 32), torch.uint8, distinct=64), batch_size=bs, step=0.05,
                      device=ctx.device, budget=6)
    show("tuning", result)
    target = bs / 0.05
    bad = [t for t in result.trials if not t.ok]
    rates = [t.samples_per_s for t in result.trials if t.ok]
    v = Verdict()
    v.need(result.source == "tuned" and rates and not bad,
           f"{len(result.trials)} trials, {len(bad)} failed or skipped" + (f" ({trial_rows(bad)})" if bad else ""))
    v.need(rates and all(abs(r / target - 1) <= 0.10 for r in rates),
           f"rates {', '.join(f'{r:,.0f}' for r in rates)} samples/s vs {target:,.0f} (+-10 %)")
    v.need(result.bottleneck == "consumer", f"bottleneck {result.bottleneck!r} (want 'consumer')")
    first = result.trials[0] if result.trials else None
    if first is not None and first.consumer_s_per_batch:
        v.info(f"step measured {first.consumer_s_per_batch * 1e3:.1f} ms/batch")
    return v.outcome()


def _h2d_gbs(ctx: Ctx, shape: Sequence[int]) -> Dict[str, float]:
    """Host-to-device bandwidth measured directly: median of 5 synchronised copies into a preallocated tensor."""
    dst = torch.empty(tuple(shape), device=ctx.device)
    nbytes = dst.numel() * dst.element_size()
    out = {}
    for name, src in (("pinned", torch.randn(tuple(shape)).pin_memory()), ("pageable", torch.randn(tuple(shape)))):
        times = []
        for _ in range(6):
            ctx.sync()
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            ctx.sync()
            times.append(time.perf_counter() - start)
        out[name] = nbytes / sorted(times[1:])[2] / 1e9
    return out


@check(limit_s=45, cpu="dry")
def check_pin_memory_chosen(ctx: Ctx) -> Outcome:
    """tune() on a copy-bound dataset (in-memory 3x224x224 float32 samples, batch 64 = 38.5 MB, no step, budget
    10 s, max_workers 8) chooses pin_memory=True, having timed both pin=True and pin=False; pinned vs pageable GB/s
    measured directly are printed."""
    from autoloader import tune

    shape = ctx.size((3, 224, 224), (3, 32, 32))
    bs = 64
    v = Verdict()
    if ctx.cuda:
        gbs = _h2d_gbs(ctx, (bs, *shape))
        v.info(f"host->device {gbs['pinned']:.1f} GB/s pinned vs {gbs['pageable']:.1f} GB/s pageable")
    with quiet():
        result = tune(data.Pool(4096, shape, torch.float32, distinct=64), batch_size=bs, device=ctx.device,
                      budget=ctx.size(10, 4), max_workers=8)
    show("tuning", result)
    same_n = [t for t in result.trials if t.config.num_workers == result.num_workers]
    pins = {t.config.pin_memory for t in result.trials if t.ok}
    v.need(result.pin_memory, f"chosen {result.config.label()} ({result.samples_per_s or 0:,.0f} samples/s, "
                              f"{result.samples_per_s and result.samples_per_s * math.prod(shape) * 4 / 1e9 or 0:.1f}"
                              f" GB/s)")
    v.need(pins == {True, False}, f"pin tried {sorted(pins)}; at workers={result.num_workers}: {trial_rows(same_n)}")
    return v.outcome()


@check(limit_s=80)
def check_tuner_vs_sweep(ctx: Ctx) -> Outcome:
    """On a CPU-bound dataset (1 ms of one core per sample, batch 32) with a syncing step (a kernel then
    torch.cuda.synchronize), the tuner's choice (max_workers 8, budget 8 s), re-timed with
    autoloader.measure.trial.run_trial and the same Consumer as a sweep of num_workers 0,1,2,4,8 x pin True/False
    (2.5 s limit per trial, two interleaved rounds, mean rate per config), reaches >= 0.90 of the sweep's best
    rate."""
    from autoloader import tune
    from autoloader.config import LoaderConfig
    from autoloader.consumer import Consumer
    from autoloader.measure.trial import run_trial
    from autoloader.request import Request

    workers = ctx.size([0, 1, 2, 4, 8], [0, 1, 2])
    pins = ctx.size([True, False], [False])
    ds = data.CpuBound(100_000, (3, 32, 32), cpu_ms=ctx.size(1.0, 0.5))
    bs = 32
    step = data.SyncStep()
    with quiet():
        result = tune(ds, batch_size=bs, step=step, device=ctx.device, budget=ctx.size(8, 5),
                      max_workers=max(workers))
    show("tuning", result)
    tuned = dataclasses.replace(result.config, persistent_workers=False)  # a trial never keeps its workers
    grid = [LoaderConfig(n, 2 if n else None, pin, False) for n in workers for pin in pins]
    consumer = Consumer(step, ctx.device)
    request = Request.checked(ds, bs, step=step, device=ctx.device)
    configs = grid + ([] if tuned in grid else [tuned])
    runs: Dict[LoaderConfig, List[Optional[float]]] = {c: [] for c in configs}
    with quiet():
        for config in configs + configs[::-1]:  # two interleaved rounds, forward then reverse: drift cancels
            trial = run_trial(request, config, consumer=consumer, limit_s=2.5)
            runs[config].append(trial.samples_per_s if trial.ok else None)
    rates = {c: (sum(r) / len(r) if all(r) else None) for c, r in runs.items()}  # type: ignore[arg-type]
    show("sweep (two rounds, then their mean)", "\n".join(
        f"{c.label():28} " + " ".join(f"{x or 0:10,.0f}" for x in runs[c]) + f" {rates[c] or 0:10,.0f}"
        for c in configs))
    measured = {c: r for c, r in rates.items() if r}
    best = max(measured, key=lambda c: measured[c]) if measured else None
    ratio = (rates.get(tuned) or 0.0) / measured[best] if best is not None else 0.0
    v = Verdict()
    v.need(best is not None and ratio >= 0.90,
           f"tuned {tuned.label()} {rates.get(tuned) or 0:,.0f} samples/s = {ratio:.2f} of the sweep's best "
           f"({best.label() if best else None} {measured.get(best, 0) if best else 0:,.0f}) (target >= 0.90)")
    v.info(f"tuner: {len(result.trials)} trials in {result.seconds:.1f} s, bottleneck {result.bottleneck}")
    v.need(len(measured) == len(rates), f"{len(measured)}/{len(rates)} sweep trials measured a rate")
    return v.outcome()


def tuning_mode(mode: str) -> Dict[str, str]:
    """``tuning=mode`` for make_loader when it has that parameter (it chooses between trials and online tuning)."""
    import inspect

    from autoloader import make_loader

    return {"tuning": mode} if "tuning" in inspect.signature(make_loader).parameters else {}


@check(limit_s=40)
def check_dict_batches_input_key(ctx: Ctx) -> Outcome:
    """make_loader on {"pixels": uint8, "label": int} samples with normalize, dtype=float32 and input_key="pixels",
    with tuning="trials" (the trials must get input_key) and with the default (online tuning when
    there is no step): tuning runs with no failed trial, and each of the 16 batches is a dict whose pixels are
    float32 on the device equal to the CPU reference (<= 1e-5) and whose labels are on the device and equal."""
    from autoloader import make_loader

    ds = data.DictImages(256, ctx.size(32, 16))
    v = Verdict()
    variants = [("trials", tuning_mode("trials"))] + ([("default", {})] if tuning_mode("trials") else [])
    for label, mode in variants:
        try:
            with quiet():
                loader = make_loader(ds, batch_size=16, device=ctx.device, normalize=(MEAN, STD),
                                     dtype=torch.float32, input_key="pixels", budget=4, cache=False, **mode)
        except Exception as exc:  # the other variant still runs
            traceback.print_exc()
            v.need(False, f"{label}: make_loader raised {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
            continue
        batches, good, worst = 0, 0, 0.0
        for got, want in zip(loader, DataLoader(ds, batch_size=16)):
            batches += 1
            pixels, labels = got["pixels"], got["label"]
            ref = reference_normalize(want["pixels"])
            worst = max(worst, (pixels.cpu() - ref).abs().max().item())
            good += (pixels.device.type == ctx.device.type and pixels.dtype == torch.float32
                     and torch.allclose(pixels.cpu(), ref, 1e-5, 1e-5) and labels.device.type == ctx.device.type
                     and torch.equal(labels.cpu(), want["label"]))
        tuning = loader.tuning
        show(f"tuning ({label})", tuning)
        trials = list(getattr(tuning, "trials", ()) or ())
        failed = [t for t in trials if t.status == "failed"]
        tuned = tuning is not None and (tuning.source != "fallback") and (label != "trials" or trials)
        v.need(tuned and not failed and batches == 16 and good == batches,
               f"{label}: {tuning.config.label() if tuning else None} from {tuning.source if tuning else None}, "
               f"{len(trials)} trials, {len(failed)} failed" + (f" ({trial_rows(failed)})" if failed else "")
               + f"; {good}/{batches} of 16 batches right (max |err| {worst:.1e})")
        del loader
    return v.outcome()


@check(limit_s=30)
def check_stall_fraction(ctx: Ctx) -> Outcome:
    """PrefetchLoader.stats.stall_fraction is < 0.10 when the GPU is the limit (fast in-memory data, a 50 ms
    simulated step, the loop reading one value back per batch as loss.item() does) and > 0.90 when data is the
    limit (5 ms per sample, no step). The same GPU-bound loop without any read-back is shown for information."""
    from autoloader.consumer import Consumer
    from autoloader.loader.prefetch import PrefetchLoader

    fast = data.Pool(20 * 32, (3, 64, 64), torch.uint8, distinct=32)
    gpu_bound = PrefetchLoader(DataLoader(fast, batch_size=32, pin_memory=ctx.cuda), device=ctx.device)
    step = Consumer(0.05, ctx.device)
    for images, _ in gpu_bound:
        step(images)
        float(images.view(-1)[0])
    synced = gpu_bound.stats
    unsynced = None
    if ctx.cuda:
        for images, _ in gpu_bound:
            step(images)
        unsynced = gpu_bound.stats
        ctx.sync()
    slow = data.Pool(10 * 8, (3, 64, 64), torch.uint8, distinct=8, sleep_s=0.005)
    data_bound = PrefetchLoader(DataLoader(slow, batch_size=8, pin_memory=ctx.cuda), device=ctx.device)
    for images, _ in data_bound:
        pass
    starved = data_bound.stats
    v = Verdict()
    v.need(synced.stall_fraction < 0.10 and synced.batches == 20,
           f"GPU-bound: stall {synced.stall_fraction:.3f} (target < 0.10) over {synced.batches} batches, "
           f"{synced.wall_s:.2f} s")
    v.need(starved.stall_fraction > 0.90 and starved.batches == 10,
           f"data-bound: stall {starved.stall_fraction:.3f} (target > 0.90) over {starved.batches} batches")
    if unsynced is not None:
        v.info(f"GPU-bound without read-back: stall {unsynced.stall_fraction:.2f} over {unsynced.wall_s:.2f} s of "
               f"host time (host-side only, as EpochStats says)")
    return v.outcome()


@check(limit_s=100)
def check_forkserver_workers(ctx: Ctx) -> Outcome:
    """make_loader with forkserver workers on a CPU-bound dataset (0.5 ms/sample, batch 32, step 0.002, the default
    budget, max_workers 4), once with multiprocessing_context="forkserver" and once with forkserver as the process's
    default start method (Python 3.14's default): each tunes with >= 1 worker trial and none failed, chooses workers,
    delivers a full epoch (64 batches) from workers that are children of the fork server, and leaves no process
    behind but multiprocessing's own helpers. For information: the same with budget=5, whose trials give each batch,
    the first included, max(1, 1.5) s (a forkserver worker imports torch before its first batch)."""
    import multiprocessing

    import psutil

    from autoloader import make_loader

    ds = data.CpuBound(2048, (3, 32, 32), cpu_ms=0.5)
    v = Verdict()
    variants = (("multiprocessing_context='forkserver'", {"multiprocessing_context": "forkserver"}, None, True),
                ("forkserver as the default start method", {}, None, True),
                ("the same with budget=5", {}, 5, False))
    for label, kwargs, budget, verdict in variants:
        if not kwargs:
            multiprocessing.set_start_method("forkserver", force=True)
        need = v.need if verdict else (lambda condition, text: v.info(f"(info) {text}"))
        try:
            with quiet():
                loader = make_loader(ds, batch_size=32, device=ctx.device, step=0.002, budget=budget, cache=False,
                                     max_workers=4, tuning="trials", **kwargs)
        except Exception as exc:  # the other variants still run
            traceback.print_exc()
            left, helpers = children_left(grace=5.0)
            need(False, f"{label}: make_loader raised {type(exc).__name__}: {' '.join(str(exc).split())[:160]}; "
                        f"left {left}, {len(helpers)} helper(s)")
            continue
        show(f"tuning ({label})", loader.tuning)
        worker_trials = [t for t in loader.tuning.trials if t.config.num_workers > 0]
        failed = [t for t in worker_trials if not t.ok]
        n, seconds = loader.tuning.num_workers, loader.tuning.seconds  # before the epoch: online re-tuning may move it
        batches, under_server, images = 0, 0, None
        for images, _ in loader:
            if batches == 0:
                for proc in psutil.Process().children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        under_server += "multiprocessing.forkserver" in " ".join(proc.parent().cmdline())
            batches += images.device.type == ctx.device.type
        del loader, images
        left, helpers = children_left(grace=5.0)
        need(worker_trials and not failed and n > 0 and under_server >= n and batches == 64 and not left,
             f"{label}: {len(worker_trials)} worker trial(s)" + (f" ({trial_rows(failed)})" if failed else "")
             + f" in {seconds:.1f} s, chose {n} workers, {under_server} under the fork server, {batches}/64 batches, "
               f"left {left}, {len(helpers)} helper(s)")
    v.info(f"start method now {multiprocessing.get_start_method()}, Python {sys.version.split()[0]}")
    return v.outcome()


@check(limit_s=50)
def check_worker_killed_while_pinning(ctx: Ctx) -> Outcome:
    """A worker SIGKILLed at sample 200 (after it has sent batches) while the main process pins memory
    (pin_memory=True, num_workers=2 fixed, 16 x 3x224x224 float32 batches, budget 6 s): make_loader returns (raises
    nothing) within budget + 10 s with a failed trial and its reason, no process left; the user's own epoch on the
    returned loader then raises torch's worker error within 15 s, no process left. (On the CPU there is no pin-memory
    thread: the main process receives the batches' shared-memory descriptors itself, and a worker killed while it
    sends them breaks that connection first; a plain DataLoader's error there may be a ConnectionError, or the bare
    EOFError of ``multiprocessing.reduction.recvfds``, and torch's report a moment later, in the loop's ``except``.
    autoloader raises torch's error once, the broken connection as its cause: NOTE [ A connection a dead worker
    broke ] in autoloader/loader/lost_worker.py.)"""
    from autoloader import make_loader

    budget = 6
    ds = data.KillAt(4096, ctx.size((3, 224, 224), (3, 32, 32)), kill_at=200)
    v = Verdict()
    start = time.perf_counter()
    loader, raised = None, ""
    try:
        with quiet():
            loader = make_loader(ds, batch_size=16, device=ctx.device, pin_memory=True, num_workers=2,
                                 budget=budget, cache=False, tuning="trials")
    except Exception as exc:  # the check goes on: what is left behind matters too
        raised = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        traceback.print_exc()  # only text is kept: a live traceback would keep the dead worker's iterator alive
    took = time.perf_counter() - start
    left, _ = children_left()
    if loader is None:
        v.need(False, f"make_loader raised {raised} after {took:.1f} s (want: a failed trial with a reason, and a "
                      f"loader)")
        v.need(not left, f"processes left after make_loader: {left}")
        return v.outcome()
    show("tuning", loader.tuning)
    failed = [t for t in loader.tuning.trials if t.status == "failed"]
    v.need(failed and all(t.reason for t in failed), "trial failed: " + ("; ".join(
        f"{t.config.label()}: {t.reason}" for t in failed) if failed else "none"))
    v.need(took <= budget + 10, f"make_loader took {took:.1f} s (limit {budget + 10} s), result from "
                                f"{loader.tuning.source}")
    v.need(not left, f"processes left after make_loader: {left}")
    start = time.perf_counter()
    error, torch_error = "no error", False
    batches = 0
    try:
        with quiet():
            for _ in loader:
                batches += 1
    except Exception as exc:  # text only, as above: the iterator (and its workers' SIGCHLD entries) must go
        first_line = (str(exc).strip().splitlines() or [""])[0][:120]
        error = f"{type(exc).__name__}: {first_line}"
        torch_error = isinstance(exc, RuntimeError) and "DataLoader worker" in str(exc)
    epoch_s = time.perf_counter() - start
    del loader
    left_after, _ = children_left()
    v.need(torch_error and epoch_s <= 15, f"user epoch: {batches} batches then {error} after {epoch_s:.1f} s "
                                          f"(want torch's RuntimeError 'DataLoader worker ...')")
    v.need(not left_after, f"processes left after the epoch: {left_after}")
    return v.outcome()


@check(limit_s=25)
def check_simulated_step_device(ctx: Ctx) -> Outcome:
    """The simulated step runs on the device it names: Consumer(0.02, device).seconds_per_batch
    is 20 ms +-10 % for cuda:0, for index-less cuda and, with 2+ GPUs, for cuda:1 without set_device; one step is
    20 ms +-10 % of GPU time (events) and < 1 ms of host time, and the current device is unchanged."""
    from autoloader.consumer import Consumer

    v = Verdict()
    names = ["cuda:0", "cuda"] + (["cuda:1"] if ctx.cuda and torch.cuda.device_count() > 1 else []) \
        if ctx.cuda else ["cpu"]
    for name in names:
        consumer = Consumer(0.02, torch.device(name))
        seconds = consumer.seconds_per_batch(None)
        v.need(0.018 <= seconds <= 0.022, f"{name}: {seconds * 1e3:.2f} ms per step")
    if ctx.cuda:
        consumer = Consumer(0.02, torch.device("cuda:0"))
        consumer(None)
        ctx.sync()
        host = time.perf_counter()
        for _ in range(5):
            consumer(None)
        host_ms = (time.perf_counter() - host) * 1000 / 5
        ctx.sync()
        gpu_ms = ctx.time_ms(lambda: consumer(None), repeat=5)
        v.need(18.0 <= gpu_ms <= 22.0 and host_ms < 1.0,
               f"one step: {gpu_ms:.2f} ms of GPU time, {host_ms:.3f} ms of host time")
        v.need(torch.cuda.current_device() == 0, f"current device {torch.cuda.current_device()}")
        if torch.cuda.device_count() < 2:
            v.info("cuda:1 not checked (1 GPU)")
    return v.outcome()


@check(limit_s=50, cpu="dry")
def check_cuda_initialised_before_fork(ctx: Ctx) -> Outcome:
    """CUDA initialised before make_loader (torch.zeros(1, device="cuda") first), fork workers: tuning a CPU-bound
    dataset runs >= 1 worker trial and none fails (workers never touch CUDA), the loader's epoch arrives on the
    device, no process left; a dataset that touches CUDA in a forked worker raises torch's own RuntimeError
    ("Cannot re-initialize CUDA in forked subprocess"), not a TuningError, within budget + 10 s, no process left."""
    import multiprocessing

    from autoloader import make_loader
    from autoloader.errors import TuningError

    # fork as the start method (Linux's default before Python 3.14), set for the process rather than passed as
    # multiprocessing_context=: make_loader's num_workers=0 trial rejects that argument (see the forkserver check)
    multiprocessing.set_start_method("fork", force=True)
    if ctx.cuda:
        torch.zeros(1, device="cuda")
    initialised = ctx.cuda and torch.cuda.is_initialized()
    with quiet():
        loader = make_loader(data.CpuBound(2048, (3, 32, 32), cpu_ms=0.5), batch_size=32, device=ctx.device,
                             step=0.002, budget=ctx.size(8, 5), cache=False, max_workers=4, tuning="trials")
    show("tuning", loader.tuning)
    worker_trials = [t for t in loader.tuning.trials if t.config.num_workers > 0]
    on_device = sum(1 for images, _ in loader if images.device.type == ctx.device.type)
    del loader
    left, _ = children_left()
    v = Verdict()
    v.info(f"CUDA initialised first: {initialised}")
    v.need(worker_trials and all(t.ok for t in worker_trials),
           f"{len(worker_trials)} worker trial(s), failed: {[t.reason for t in worker_trials if not t.ok]}")
    v.need(on_device == 64 and not left, f"{on_device}/64 batches on {ctx.device.type}, left {left}")
    if not ctx.cuda:
        v.info("CUDA in a forked worker: not checked on the CPU")
        return v.outcome()
    budget = 4
    surfaced = "nothing raised"
    start = time.perf_counter()
    try:
        with quiet():
            make_loader(data.CudaInWorker(), batch_size=8, device="cuda", cache=False, budget=budget, num_workers=2,
                        tuning="trials")
    except TuningError as err:
        surfaced = f"TuningError: {str(err)[:200]}"
    except RuntimeError as err:
        unchanged = type(err) is RuntimeError and "Cannot re-initialize CUDA in forked subprocess" in str(err)
        surfaced = "torch's error" if unchanged else f"{type(err).__name__}: {str(err)[:200]}"
    took = time.perf_counter() - start
    left, _ = children_left()
    v.need(surfaced == "torch's error" and took <= budget + 10 and not left,
           f"CUDA touched in a forked worker gives {surfaced} after {took:.1f} s, left {left}")
    return v.outcome()


@check(limit_s=20, cpu="skip")
def check_sleep_calibration(ctx: Ctx) -> Outcome:
    """The simulated step's calibration (torch.cuda._sleep cycles per second, warmed then a median) is stable: two
    calibrations in a fresh process agree within 5 %, and a spin of 50 ms worth of cycles takes 50 ms +-5 % by
    CUDA events."""
    import autoloader.consumer as consumer_module
    from autoloader.consumer import Consumer

    def calibrate() -> float:
        cache = getattr(consumer_module, "_CYCLES_PER_S", None)
        if isinstance(cache, dict):
            cache.clear()
        cycles = getattr(Consumer(1.0, torch.device("cuda:0")), "_cycles", None)
        if cycles is None:
            raise RuntimeError("Consumer no longer has _cycles (cycles per step): update this check")
        return float(cycles)

    first, second = calibrate(), calibrate()
    spread = abs(first - second) / max(first, second)
    spin_ms = ctx.time_ms(lambda: torch.cuda._sleep(int(0.05 * second)), repeat=5)
    v = Verdict()
    v.need(spread <= 0.05, f"two calibrations {first / 1e9:.3f} and {second / 1e9:.3f} G cycles/s ({spread:.1%} "
                           f"apart, limit 5 %)")
    v.need(abs(spin_ms / 50.0 - 1) <= 0.05, f"a 50 ms spin measures {spin_ms:.2f} ms")
    return v.outcome()


@check(limit_s=40, cpu="dry")
def check_tuning_on_gpu(ctx: Ctx) -> Outcome:
    """make_loader on CUDA (deterministic 3x96x96 uint8 images, batch 64, step=0.005, normalize to float32, budget
    8 s): source "tuned" with a rate, pin_memory tried both ways, the loader's batches are float32 on the device,
    and no process is left once the loader is dropped."""
    from autoloader import make_loader

    with quiet():
        loader = make_loader(data.Images(2048, ctx.size(96, 32)), batch_size=64, device=ctx.device, step=0.005,
                             budget=ctx.size(8, 4), cache=False, normalize=(MEAN, STD), dtype=torch.float32,
                             tuning="trials")
    tuning = loader.tuning
    show("tuning", tuning)
    pins = {t.config.pin_memory for t in tuning.trials if t.ok}
    batches = [images for images, _, _ in loader]
    on_device = len(batches) == 32 and all(b.device.type == ctx.device.type and b.dtype == torch.float32
                                           for b in batches)
    del loader, batches
    left, _ = children_left()
    v = Verdict()
    v.need(tuning.source == "tuned" and tuning.samples_per_s, f"{tuning.config.label()} "
           f"{tuning.samples_per_s or 0:,.0f} samples/s, bottleneck {tuning.bottleneck}, {len(tuning.trials)} trials "
           f"in {tuning.seconds:.1f} s")
    v.need(pins == {True, False}, f"pin tried {sorted(pins)}")
    v.need(on_device, f"32 batches float32 on {ctx.device.type}: {on_device}")
    v.need(not left, f"processes left: {left}")
    return v.outcome()


# -- the harness --------------------------------------------------------------------------------------------------

def child_main(name: str, dry: bool, limit: float) -> int:
    """Run one check in this (fresh) process and print its result as one JSON line."""
    chosen = next(c for c in CHECKS if c.name == name)
    faulthandler.dump_traceback_later(max(1.0, limit - 2.0), exit=False)  # a hang leaves every thread's stack
    started = time.perf_counter()
    status, figure = "FAIL", "no result"
    late: List[str] = []
    # torch's SIGCHLD handler raises "DataLoader worker ... is killed" in the main thread wherever it is, as long as
    # a dead worker's iterator was not shut down; such a late exception must not cost the check its result line
    for attempt in range(4):
        try:
            if attempt == 0:
                try:
                    ok, figure = chosen.fn(Ctx(dry))
                    status = "PASS" if ok else "FAIL"
                    if dry and chosen.cpu == "dry":
                        status, figure = "DRY", f"(would {status}) {figure}"
                except Skip as reason:
                    status, figure = "SKIP", str(reason)
                except BaseException as exc:  # noqa: B036 - a crashing check is a failure; the harness goes on
                    status, figure = "FAIL", f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                    traceback.print_exc()
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the check is over: no more handler
            faulthandler.cancel_dump_traceback_later()
            break
        except BaseException as exc:  # noqa: B036
            late.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
    if late:
        figure += f"; [X] raised later in the main thread, outside any call: {' | '.join(late)}"
        status = "FAIL" if status in ("PASS", "DRY") else status
    body = time.perf_counter() - started
    print(RESULT_MARK + json.dumps({"status": status, "figure": figure, "body_s": body}), flush=True)
    sys.stderr.flush()
    return 0


def _proc_stat(pid: int) -> Optional[Tuple[str, int, int]]:
    """(state, ppid, session) from /proc, None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def _live_pids(where: Callable[[int, int, int], bool]) -> List[int]:
    """Live (not zombie) processes whose (pid, ppid, session) match ``where``; empty without /proc."""
    if not os.path.isdir("/proc"):
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None and stat[0] != "Z" and where(int(entry), stat[1], stat[2]):
                found.append(int(entry))
    return found


def sweep_session(sid: int, grace: float = 3.0) -> List[str]:
    """Processes left in a finished check's session (its workers, its fork server) after ``grace`` seconds: described,
    then killed (they are this script's own descendants)."""
    deadline = time.monotonic() + grace
    left = _live_pids(lambda pid, ppid, session: session == sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _live_pids(lambda pid, ppid, session: session == sid)
    described = []
    for pid in left:
        line = _cmdline(pid)
        described.append(f"{pid} ({'multiprocessing helper' if any(h in line for h in HELPERS) else line})")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return described


@dataclasses.dataclass
class Result:
    status: str
    figure: str
    body_s: Optional[float]
    total_s: float
    left: List[str]
    stderr: str


def run_check(chosen: Check, *, dry: bool, limit: float, cache_dir: str) -> Result:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["AUTOLOADER_CACHE_DIR"] = cache_dir
    env["PYTHONFAULTHANDLER"] = "1"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", chosen.name, "--limit", f"{limit:.1f}"]
    if dry:
        cmd.append("--cpu-dry-run")
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        total = time.monotonic() - started
        left = sweep_session(proc.pid, grace=1.0 if timed_out else 3.0)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    result = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK):])
    if result is None:
        why = f"timed out after {limit:.0f} s" if timed_out else f"exited with status {proc.returncode}"
        return Result("FAIL", f"no result: {why} (its stderr below)", None, total, left, stderr)
    status, figure = result["status"], result["figure"]
    if timed_out:
        status, figure = "FAIL", f"{figure} -- but its process did not exit within {limit:.0f} s"
    elif proc.returncode != 0:
        status, figure = "FAIL", f"{figure} -- but its process exited with status {proc.returncode}"
    return Result(status, figure, result["body_s"], total, left, stderr)


def _tail(text: str, lines: int) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(f"    | {line}" for line in kept)


def describe_machine(dry: bool) -> str:
    """Python, torch, CPUs and GPUs, without creating a CUDA context in this process (nvidia-smi for the names)."""
    parts = [f"Python {sys.version.split()[0]}", f"torch {torch.__version__}", f"{os.cpu_count()} CPUs"]
    if dry:
        parts.append("--cpu-dry-run (device cpu, small sizes)")
        return "; ".join(parts)
    parts.append(f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        parts += [f"cuda:{i} {name.strip()}" for i, name in enumerate(names)]
    except (OSError, subprocess.SubprocessError):
        pass
    return "; ".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only the checks whose name contains one of these")
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the checks' code on the CPU (small sizes)")
    parser.add_argument("--list", action="store_true", help="list the checks and what each asserts")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds for the whole run (default 300)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every check's stderr")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child, args.cpu_dry_run, args.limit)

    selected = [c for c in CHECKS if not args.names or any(n in c.name for n in args.names)]
    if args.list:
        for c in CHECKS:
            print(f"{c.name} (limit {c.limit_s:.0f} s, cpu={c.cpu}): {c.summary}\n")
        return 0
    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        for c in selected:
            print(f"SKIP {c.name}: no CUDA device")
        print("SKIP no_process_left: no CUDA device")
        print(f"SUMMARY: 0 PASS, 0 FAIL, {len(selected) + 1} SKIP (no CUDA device)")
        return 0

    print(f"gpu_check: {describe_machine(dry)}", flush=True)
    started = time.monotonic()
    deadline = started + args.deadline
    counts: Dict[str, int] = {}
    leftovers: List[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-cache-") as cache_dir:
        for c in selected:
            if dry and c.cpu == "skip":
                status, line = "SKIP", f"SKIP {c.name}: CUDA only (--cpu-dry-run)"
            elif deadline - time.monotonic() < 10:
                status, line = "SKIP", f"SKIP {c.name}: the run's deadline ({args.deadline:.0f} s) has passed"
            else:
                limit = min(c.limit_s, deadline - time.monotonic())
                result = run_check(c, dry=dry, limit=limit, cache_dir=cache_dir)
                leftovers += [f"after {c.name}: {p}" for p in result.left]
                status = result.status
                body = "-" if result.body_s is None else f"{result.body_s:.1f}"
                line = f"{status} {c.name}: {result.figure}" + (
                    f" (left behind: {len(result.left)} process(es), see no_process_left)" if result.left else "") \
                    + f" [{body} s; {result.total_s:.1f} s with start-up]"
                if args.verbose and result.stderr.strip():
                    line += "\n" + _tail(result.stderr, 10_000)
                elif status == "FAIL" and result.stderr.strip():
                    line += "\n" + _tail(result.stderr, 60 if result.body_s is None else 30)
            counts[status] = counts.get(status, 0) + 1
            print(line, flush=True)

    mine = _live_pids(lambda pid, ppid, session: ppid == os.getpid())
    left = leftovers + [f"still a child of the harness: {pid} ({_cmdline(pid)})" for pid in mine]
    status = "PASS" if not left else "FAIL"
    counts[status] = counts.get(status, 0) + 1
    checked = "/proc" if os.path.isdir("/proc") else "nothing (no /proc here)"
    print(f"{status} no_process_left: " + ("; ".join(left) if left else
          f"no process left after any check (each check's session and this process's children, via {checked})"),
          flush=True)
    elapsed = time.monotonic() - started
    print("SUMMARY: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("PASS", "FAIL", "SKIP", "DRY") if
                                  counts.get(s) or s in ("PASS", "FAIL")) + f" in {elapsed:.0f} s", flush=True)
    return 1 if counts.get("FAIL") else 0


if __name__ == "__main__":
    sys.exit(main())
