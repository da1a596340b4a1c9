"""Datasets that misbehave, for tests/measure/test_failures.py and tests/stress; module-level so workers (and
subprocesses) can import them.

Each slow path sleeps only in the main process (``get_worker_info() is None``), so the serial trial is slow enough that
the tuner goes on to try workers, where the fault happens.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

MAIN_S = 0.005
"""Seconds per sample in the main process: slow enough that workers look worth trying."""


def in_worker() -> bool:
    return get_worker_info() is not None


class KillWorkers(Dataset):
    """Workers are SIGKILLed (as the OOM killer does) on their first sample when ``num_workers >= from_workers``."""

    def __init__(self, n: int = 64, *, from_workers: int = 1) -> None:
        self.n, self.from_workers = n, from_workers

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        if info is None:
            time.sleep(MAIN_S)
        elif info.num_workers >= self.from_workers:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((4,), float(i))


class KillWorkersLater(Dataset):
    """Each worker is SIGKILLed on its ``at``-th sample, after it has already sent batches of ``sample_bytes``
    samples (shared-memory tensors whose descriptors the main process may still be receiving from it)."""

    def __init__(self, n: int = 4096, *, at: int = 40, sample_bytes: int = 16) -> None:
        self.n, self.at, self.served, self.numel = n, at, 0, max(1, sample_bytes // 4)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if in_worker():
            self.served += 1
            if self.served == self.at:
                os.kill(os.getpid(), signal.SIGKILL)
        else:
            time.sleep(MAIN_S)
        return torch.full((self.numel,), float(i))


class CorruptSample(Exception):
    """The user's own error, as a dataset raises it."""


class Raising(Dataset):
    """Raises ``CorruptSample``: ``where="always"`` at index 3, ``where="workers"`` for odd indices inside workers."""

    def __init__(self, where: str, n: int = 64) -> None:
        self.where, self.n = where, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.where == "always" and i == 3:
            raise CorruptSample(f"sample {i} is corrupt")
        if self.where == "workers" and in_worker() and i % 2 == 1:
            raise CorruptSample(f"sample {i} is corrupt")
        if not in_worker():
            time.sleep(MAIN_S)
        return torch.full((4,), float(i))


class Hang(Dataset):
    """Blocks for ``hang_s`` in ``__getitem__``: ``where="always"``, or only inside workers."""

    def __init__(self, where: str, hang_s: float = 60.0, n: int = 64) -> None:
        self.where, self.hang_s, self.n = where, hang_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.where == "always" or in_worker():
            time.sleep(self.hang_s)
        else:
            time.sleep(MAIN_S)
        return torch.zeros(4)


class Stream(IterableDataset):
    """``n`` samples (None: endless); ``sharded`` splits them between workers, else every worker yields them all."""

    def __init__(self, n: Optional[int] = None, *, sharded: bool = True, constant: bool = False) -> None:
        self.n, self.sharded, self.constant = n, sharded, constant

    def __iter__(self) -> Iterator[torch.Tensor]:
        ids: Iterator[int] = itertools.count() if self.n is None else iter(range(self.n))
        info = get_worker_info()
        if self.sharded and info is not None:
            ids = itertools.islice(ids, info.id, None, info.num_workers)
        for i in ids:
            yield torch.zeros(8) if self.constant else torch.full((8,), float(i))


class PythonInts(Dataset):
    """Copy-on-read: ``n`` Python ints in a list; each sample sums a chunk of them, touching their reference counts."""

    def __init__(self, n: int = 4_000_000, chunk: int = 1024) -> None:
        self.values = list(range(10**9, 10**9 + n))
        self.chunk = chunk

    def __len__(self) -> int:
        return len(self.values) // self.chunk

    def __getitem__(self, i: int) -> int:
        return sum(self.values[i * self.chunk:(i + 1) * self.chunk]) % 1000


class NumpyInts(PythonInts):
    """The fix: the same values in one numpy array; reading copies nothing."""

    def __init__(self, n: int = 4_000_000, chunk: int = 1024) -> None:
        self.values = np.arange(10**9, 10**9 + n, dtype=np.int64)  # type: ignore[assignment]
        self.chunk = chunk

    def __getitem__(self, i: int) -> int:
        return int(self.values[i * self.chunk:(i + 1) * self.chunk].sum() % 1000)


class Tensors(Dataset):
    """Plain, fast, well-behaved samples of ``sample_bytes`` bytes each."""

    def __init__(self, n: int = 64, sample_bytes: int = 32, sleep_s: float = 0.0) -> None:
        self.n, self.numel, self.sleep_s = n, max(1, sample_bytes // 4), sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.full((self.numel,), float(i))


class LambdaInside(Dataset):
    """Holds a lambda: fine under fork, unpicklable under spawn."""

    def __init__(self) -> None:
        self.transform = lambda x: x * 2

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(torch.full((2,), float(i)))


class CudaInWorker(Dataset):
    """Touches CUDA in ``__getitem__``: a user bug in a forked worker once the parent has initialised CUDA."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if not in_worker():
            time.sleep(MAIN_S)
        return torch.ones(4, device="cuda").cpu()


def cpu_only_collate(batch: list) -> torch.Tensor:
    """default_collate that fails unless it runs in a worker and builds the batch on the CPU: device moves (and so
    CUDA) belong to the main process."""
    if not in_worker():
        raise AssertionError("collate ran in the main process; the test expects workers")
    stacked = torch.utils.data.default_collate(batch)
    if stacked.device.type != "cpu":
        raise AssertionError(f"a worker produced a batch on {stacked.device}; only the main process moves batches")
    return stacked
