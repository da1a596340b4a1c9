"""Datasets and steps for ``scripts/gpu_check.py``, in a module of their own so DataLoader workers can unpickle them
under any start method (fork, spawn, forkserver): a worker imports ``gpu_data`` by name.

Nothing here initialises CUDA at import or in a worker, except ``CudaInWorker`` (on purpose) and ``PinnedBatches``
(built in the main process only, used with ``num_workers=0``).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any, Sequence, Tuple

import torch
from torch.utils.data import Dataset, get_worker_info

MEAN = (123.675, 116.28, 103.53)  # ImageNet statistics in uint8 units
STD = (58.395, 57.12, 57.375)


def checksum(images: torch.Tensor) -> torch.Tensor:
    """Per-image int64 checksum, sensitive to values and positions; exact on CPU and GPU alike."""
    flat = images.reshape(images.shape[0], -1).to(torch.int64)
    weights = torch.arange(flat.shape[1], device=flat.device, dtype=torch.int64) % 251 + 1
    return (flat * weights).sum(dim=1)


def reference_normalize(images: torch.Tensor) -> torch.Tensor:
    """What ``normalize=(MEAN, STD), dtype=torch.float32`` must give, computed on the CPU."""
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (images.to(torch.float32) - mean) / std


def _pool(distinct: int, shape: Sequence[int], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (distinct, *shape), dtype=torch.uint8, generator=g)
    return torch.randn((distinct, *shape), generator=g).to(dtype)


class Images(Dataset):
    """Deterministic uint8 CHW images (seeded by index), with the index and a CPU-side checksum of the image."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
        return image, i, checksum(image.unsqueeze(0))[0]


class Pool(Dataset):
    """``n`` samples ``(tensor, index)`` cycling through ``distinct`` tensors made up front: loading costs only the
    collate (fast in-memory data), plus ``sleep_s`` per sample when given (data-bound: the process waits, as on a
    network read)."""

    def __init__(self, n: int, shape: Sequence[int], dtype: torch.dtype = torch.uint8, *, distinct: int = 16,
                 sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s
        self.pool = _pool(distinct, shape, dtype)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.pool[i % len(self.pool)], i


def spin_cpu(seconds: float) -> None:
    """Keep this thread's CPU busy for ``seconds`` of its own CPU time (not wall time): a fixed CPU cost per call,
    whatever the other threads and processes do."""
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


class CpuBound(Dataset):
    """``(uint8 image, index)`` samples that each cost ``cpu_ms`` of one core (a decode/augment stand-in)."""

    def __init__(self, n: int, shape: Sequence[int] = (3, 32, 32), cpu_ms: float = 1.0) -> None:
        self.n, self.shape, self.cpu_ms = n, tuple(shape), cpu_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        spin_cpu(self.cpu_ms / 1000.0)
        return torch.full(self.shape, i % 256, dtype=torch.uint8), i


class DictImages(Dataset):
    """Samples as Hugging Face datasets yield them: ``{"pixels": uint8 CHW tensor, "label": int}``."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        pixels = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
        return {"pixels": pixels, "label": i % 10}


class KillAt(Dataset):
    """In-memory ``(tensor, index)`` samples; the worker that reads index ``kill_at`` SIGKILLs itself (as the OOM
    killer would). The main process (the serial trial, the cache key's sample) never dies."""

    def __init__(self, n: int, shape: Sequence[int], kill_at: int, dtype: torch.dtype = torch.float32) -> None:
        self.n, self.kill_at = n, kill_at
        self.pool = _pool(8, shape, dtype)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        if i == self.kill_at and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.pool[i % len(self.pool)], i


class CudaInWorker(Dataset):
    """Touches CUDA in ``__getitem__``: a user bug under fork once the parent has initialised CUDA."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(4, device="cuda").cpu()


class PinnedBatches(Dataset):
    """Whole batches made up front (use with ``batch_size=None``, ``num_workers=0``), pinned when ``pin``: the host
    hands them out at no cost, so an epoch is bound by the copy and the step."""

    def __init__(self, n: int, distinct: int, shape: Sequence[int], *, pin: bool) -> None:
        self.n = n
        self.batches = [torch.randn(*shape) for _ in range(distinct)]
        if pin:
            self.batches = [b.pin_memory() for b in self.batches]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.batches[i % len(self.batches)]


class SyncStep:
    """A training step that waits for the device: a small kernel on the input, then ``torch.cuda.synchronize``.
    Timing against it measures what the GPU actually received, whatever the host queued."""

    def __call__(self, batch: Any) -> None:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if isinstance(x, torch.Tensor) and x.is_cuda:
            x.float().mean()
            torch.cuda.synchronize(x.device)
