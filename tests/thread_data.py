"""Datasets for tests/loader/test_threads.py and tests/search/test_thread_search.py; module-level so spawned workers
(and subprocesses) can import them."""
from __future__ import annotations

import os
import threading
import time
from typing import Dict, Iterator, List, Optional

import torch
from torch.utils.data import Dataset, IterableDataset


class SampleError(RuntimeError):
    """Raised by ``Indexed`` for its failing indices."""


class Indexed(Dataset):
    """Sample ``i`` is ``{"index": i, "pid": ..., "tid": ...}``: who fetched it (process, native thread id).

    ``sleep_s``: seconds each sample sleeps (waiting, GIL released). ``fail``: index -> seconds to sleep before raising
    ``SampleError(f"sample {i} failed")``. ``started`` counts the samples begun in this process.
    """

    def __init__(self, n: int = 40, *, sleep_s: float = 0.0, fail: Optional[Dict[int, float]] = None) -> None:
        self.n, self.sleep_s, self.fail = n, sleep_s, dict(fail or {})
        self.root = "/data/indexed"
        self.transform = None
        self.started: List[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        self.started.append(int(i))
        if i in self.fail:
            time.sleep(self.fail[i])
            raise SampleError(f"sample {i} failed")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return {"index": int(i), "pid": os.getpid(), "tid": threading.get_native_id()}

    def describe(self) -> str:
        return f"{self.n} samples under {self.root}"

    def __getstate__(self) -> dict:
        return {**self.__dict__, "started": []}


class Batched(Indexed):
    """``Indexed`` with its own ``__getitems__`` that records each call's indices and runs in the calling thread."""

    def __init__(self, n: int = 40) -> None:
        super().__init__(n)
        self.calls: List[List[int]] = []

    def __getitems__(self, indices: List[int]) -> list:
        self.calls.append(list(indices))
        return [Indexed.__getitem__(self, i) for i in indices]


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(4))
