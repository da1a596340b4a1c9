#!/usr/bin/env python
"""Checks of autoloader that need a real GPU; one line per check: ``PASS|FAIL <name>: <figure>``.

    python scripts/gpu_check.py              # every check (a few minutes at most on one GPU)
    python scripts/gpu_check.py overlap      # only the checks whose name contains "overlap"

Exits 1 if any check fails, 0 otherwise; without CUDA it prints ``SKIP: no CUDA device`` and exits 0.
To add a check, write ``def check_<name>() -> Tuple[bool, str]`` (passed?, the figure to print) and decorate it
with ``@check``. Data sets are module-level classes so DataLoader workers can pickle them under any start method.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autoloader.prefetch import PrefetchLoader  # noqa: E402

Outcome = Tuple[bool, str]
CHECKS: List[Tuple[str, Callable[[], Outcome]]] = []
MEAN = (123.675, 116.28, 103.53)  # ImageNet statistics in uint8 units
STD = (58.395, 57.12, 57.375)


def check(fn: Callable[[], Outcome]) -> Callable[[], Outcome]:
    CHECKS.append((fn.__name__[len("check_"):], fn))
    return fn


class Images(Dataset):
    """Deterministic uint8 CHW images (seeded by index), with the index and a CPU-side checksum of the image."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
        return image, i, checksum(image.unsqueeze(0))[0]


class PinnedBatches(Dataset):
    """Whole pre-pinned float32 batches (use with ``batch_size=None``), so the host hands them out at no cost."""

    def __init__(self, n: int, distinct: int, shape: Sequence[int]) -> None:
        self.n = n
        self.batches = [torch.randn(*shape).pin_memory() for _ in range(distinct)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.batches[i % len(self.batches)]


def checksum(images: torch.Tensor) -> torch.Tensor:
    """Per-image int64 checksum, sensitive to values and positions; exact on CPU and GPU alike."""
    flat = images.reshape(images.shape[0], -1).to(torch.int64)
    weights = torch.arange(flat.shape[1], device=flat.device, dtype=torch.int64) % 251 + 1
    return (flat * weights).sum(dim=1)


def reference_normalize(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (images.to(torch.float32) - mean) / std


def cuda_time_ms(fn: Callable[[], object], repeat: int = 5) -> float:
    """Median GPU time of ``fn`` on the current stream, by CUDA events."""
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@check
def check_normalize_matches_cpu() -> Outcome:
    """(a) uint8 NCHW batches normalised on the GPU equal the CPU reference."""
    data = Images(96, 64)
    loader = PrefetchLoader(DataLoader(data, batch_size=16, pin_memory=True, num_workers=2), device="cuda",
                            normalize=(MEAN, STD), dtype=torch.float32)
    worst, batches, close = 0.0, 0, True
    for (images, _, _), (raw, _, _) in zip(loader, DataLoader(data, batch_size=16)):
        got, want = images.cpu(), reference_normalize(raw)
        worst = max(worst, (got - want).abs().max().item())
        close = close and images.is_cuda and images.dtype == torch.float32 and torch.allclose(got, want, 1e-5, 1e-5)
        batches += 1
    return close and batches == 6, f"max |gpu - cpu| = {worst:.2e} over {batches} batches"


@check
def check_overlap_speedup() -> Outcome:
    """(b) a step as long as the copy of a 64x3x224x224 float32 pinned batch: plain loop vs PrefetchLoader."""
    data = PinnedBatches(60, 4, (64, 3, 224, 224))
    sample = data[0]
    copy_ms = cuda_time_ms(lambda: sample.to("cuda", non_blocking=True))
    cycles = 10_000_000
    cycles_per_ms = cycles / cuda_time_ms(lambda: torch.cuda._sleep(cycles))
    step_cycles = int(copy_ms * cycles_per_ms)

    def step(x: torch.Tensor) -> None:
        torch.cuda._sleep(step_cycles)
        x.view(-1)[:1024].sum()

    def plain_epoch() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in DataLoader(data, batch_size=None, pin_memory=True):
            step(batch.to("cuda"))
        torch.cuda.synchronize()
        return time.perf_counter() - start

    prefetch = PrefetchLoader(DataLoader(data, batch_size=None, pin_memory=True), device="cuda")

    def prefetch_epoch() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in prefetch:
            step(batch)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    plain_epoch(), prefetch_epoch()
    plain = min(plain_epoch() for _ in range(3))
    overlapped = min(prefetch_epoch() for _ in range(3))
    speedup = plain / overlapped
    return speedup >= 1.3, (f"{speedup:.2f}x faster with PrefetchLoader (plain {plain * 1e3:.1f} ms, prefetch "
                            f"{overlapped * 1e3:.1f} ms per {len(data)} batches; copy {copy_ms:.2f} ms, step ~ copy)")


@check
def check_reserved_memory_stable() -> Outcome:
    """(c) memory_reserved() does not grow over 5 epochs, and one side stream serves them all."""
    loader = PrefetchLoader(DataLoader(Images(320, 128), batch_size=32, pin_memory=True, num_workers=2),
                            device="cuda", normalize=(MEAN, STD), dtype=torch.float32)
    reserved, streams = [], set()
    for _ in range(5):
        for images, _, _ in loader:
            images.mul_(1.0)
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
        streams.add(id(loader.stream))
    mib = ", ".join(f"{r / 2**20:.0f}" for r in reserved)
    ok = reserved[-1] <= reserved[0] and len(streams) == 1
    return ok, f"reserved MiB after each epoch: {mib}; {len(streams)} side stream(s)"


def _churn_epoch(loader: PrefetchLoader, epoch: int, big: int) -> Tuple[int, int]:
    """Consume one epoch while allocating, filling and freeing big tensors; (batches, corrupted)."""
    sums, expected = [], []
    for i, (images, _, cpu_sums) in enumerate(loader):
        junk = [torch.empty(big + (i * 7919 % 4096), dtype=torch.uint8, device="cuda").fill_(i % 255)
                for _ in range(3)]
        torch.cuda._sleep(200_000)
        sums.append(checksum(images))
        expected.append(cpu_sums)
        del junk, images
        if (i + epoch) % 5 == 0:
            torch.cuda.empty_cache()
    if not sums:
        return 0, 0
    bad = (torch.cat(sums) != torch.cat(expected).to("cuda")).view(len(sums), -1).any(dim=1)
    return len(sums), int(bad.sum().item())


@check
def check_no_corruption_under_allocator_churn() -> Outcome:
    """(d) a consumer that frees and reallocates aggressively never sees a corrupted batch (GPU vs CPU checksums)."""
    loader = PrefetchLoader(DataLoader(Images(960, 128), batch_size=32, pin_memory=True, num_workers=2),
                            device="cuda")
    big = 64 * 2**20
    batches = corrupted = 0
    user_stream = torch.cuda.Stream()
    for epoch in range(3):
        if epoch == 2:
            with torch.cuda.stream(user_stream):
                n, bad = _churn_epoch(loader, epoch, big)
            torch.cuda.synchronize()
        else:
            n, bad = _churn_epoch(loader, epoch, big)
        batches, corrupted = batches + n, corrupted + bad
    return corrupted == 0 and batches == 90, (f"{corrupted} of {batches} batches corrupted "
                                               "(last epoch consumed on a non-default stream)")


class CudaInWorker(Dataset):
    """Touches CUDA in __getitem__: a user bug under fork once the parent has initialised CUDA."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(4, device="cuda").cpu()


@check
def check_cuda_initialised_before_tuning() -> Outcome:
    """CUDA initialised in the parent, then tuning with forked workers: the worker trials run (workers never touch
    CUDA; the prefetcher moves batches in the main process), and a dataset that does touch CUDA in a worker surfaces
    torch's own "Cannot re-initialize CUDA in forked subprocess" error, not a tuner error or a hang."""
    import warnings

    from autoloader import make_loader
    from autoloader.errors import TuningError

    torch.zeros(1, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = make_loader(Images(512, 64), batch_size=32, device="cuda", step=0.002, budget=8, cache=False,
                             num_workers=2, multiprocessing_context="fork")
    worker_trials = [t for t in loader.tuning.trials if t.config.num_workers > 0]
    on_gpu = sum(1 for images, _, _ in loader if images.is_cuda)
    del loader
    surfaced = "nothing raised"
    try:
        make_loader(CudaInWorker(), batch_size=8, device="cuda", cache=False, budget=4, num_workers=2,
                    multiprocessing_context="fork")
    except TuningError as err:
        surfaced = f"TuningError: {err}"
    except RuntimeError as err:
        surfaced = ("torch's error" if "Cannot re-initialize CUDA in forked subprocess" in str(err)
                    else f"RuntimeError: {str(err)[:200]}")
    ok = bool(worker_trials) and all(t.ok for t in worker_trials) and on_gpu == 16 and surfaced == "torch's error"
    return ok, (f"{len(worker_trials)} worker trial(s), failed: {[t.reason for t in worker_trials if not t.ok]}; "
                f"{on_gpu}/16 batches on cuda; CUDA touched in a worker gives: {surfaced}")

@check
def check_simulated_step_is_calibrated() -> Outcome:
    """``step=0.01`` on CUDA is a GPU-side spin calibrated to seconds: ~10 ms of GPU time, and the host returns at
    once (it stays free, as with a real GPU step)."""
    from autoloader._consumer import Consumer

    consumer = Consumer(0.01, torch.device("cuda"))
    consumer(None)
    torch.cuda.synchronize()
    host = time.perf_counter()
    for _ in range(10):
        consumer(None)
    host_ms = (time.perf_counter() - host) * 1000 / 10
    torch.cuda.synchronize()
    gpu_ms = cuda_time_ms(lambda: consumer(None), repeat=10)
    ok = 8.0 <= gpu_ms <= 12.5 and host_ms < 1.0
    return ok, f"step=0.01 takes {gpu_ms:.2f} ms on the GPU (target 10 +/- 2) and {host_ms:.3f} ms of host time"


@check
def check_tuning_on_gpu() -> Outcome:
    """make_loader on CUDA with a simulated 5 ms step: trials run against the GPU step, pin_memory is tried, the
    chosen loader delivers normalised float batches on the GPU, and no worker survives."""
    import warnings

    import psutil

    from autoloader import make_loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = make_loader(Images(2048, 96), batch_size=64, device="cuda", step=0.005, budget=15, cache=False,
                             normalize=(MEAN, STD), dtype=torch.float32)
    tuning = loader.tuning
    pins = {t.config.pin_memory for t in tuning.trials if t.ok}
    batches = [images for images, _, _ in loader]
    on_gpu = all(b.is_cuda and b.dtype == torch.float32 for b in batches)
    del loader, batches
    time.sleep(1.0)
    left = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    ok = tuning.source == "tuned" and tuning.samples_per_s and on_gpu and pins == {True, False} and not left
    return bool(ok), (f"{tuning.config.label()} {tuning.samples_per_s or 0:,.0f} samples/s, bottleneck "
                      f"{tuning.bottleneck}, {len(tuning.trials)} trials in {tuning.seconds:.1f} s, pin tried "
                      f"{sorted(pins)}, batches on cuda float32: {on_gpu}, processes left: {len(left)}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    wanted = list(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    failed = 0
    for name, fn in CHECKS:
        if wanted and not any(w in name for w in wanted):
            continue
        try:
            ok, figure = fn()
        except Exception as exc:  # a crashing check is reported as a failure; the others still run
            ok, figure = False, f"error: {type(exc).__name__}: {exc}"
        print(f"{'PASS' if ok else 'FAIL'} {name}: {figure}", flush=True)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
