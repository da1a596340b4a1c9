"""Datasets for tests/tuning/test_online.py (module level, so workers of any start method can load them)."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import torch
from torch.utils.data import Dataset, get_worker_info


class Indexed(Dataset):
    """Sample ``i`` is ``tensor([i])``; each waits ``latency_s`` (changeable between epochs: a regime change)."""

    def __init__(self, n: int, latency_s: float = 0.0) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.latency_s:
            time.sleep(self.latency_s)
        return torch.tensor([i])


class Regime(Indexed):
    """Like ``Indexed``, its latency in shared memory: a change reaches workers already running (persistent ones), as
    a warmer page cache does; set it with ``latency(seconds)``."""

    def __init__(self, n: int, latency_s: float = 0.0) -> None:
        super().__init__(n)
        self._shared = multiprocessing.get_context("fork").RawValue("d", latency_s)

    def latency(self, seconds: float) -> None:
        self._shared.value = seconds

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._shared.value:
            time.sleep(self._shared.value)
        return torch.tensor([i])


class KilledFromWorkers(Indexed):
    """Like ``Indexed``, but every worker of a loader with ``from_workers`` or more workers is SIGKILLed (as the OOM
    killer does) on its third sample."""

    def __init__(self, n: int, latency_s: float = 0.001, from_workers: int = 2) -> None:
        super().__init__(n, latency_s)
        self.from_workers = from_workers
        self.served = 0

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        if info is not None and info.num_workers >= self.from_workers:
            self.served += 1
            if self.served == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class Corrupt(Exception):
    """The user's own error."""


class RaisesAt(Indexed):
    """Raises ``Corrupt`` at index ``bad`` (in whichever process reads it)."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise Corrupt(f"sample {i} is corrupt")
        return super().__getitem__(i)


class NeedsWorkerInit(Indexed):
    """Like ``Indexed``, but a worker that did not run ``mark_initialised`` (the loader's ``worker_init_fn``) raises."""

    initialised = False

    def __getitem__(self, i: int) -> torch.Tensor:
        if get_worker_info() is not None and not self.initialised:
            raise RuntimeError("worker_init_fn did not run in this worker")
        return super().__getitem__(i)


def mark_initialised(worker_id: int) -> None:
    """A ``worker_init_fn`` for ``NeedsWorkerInit``."""
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    info.dataset.initialised = True
