"""Datasets and samplers for tests/loader/test_slices.py; module-level so DataLoader workers can import them."""
from __future__ import annotations

import os
import signal
from typing import Iterator, List

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info


class Indices(Dataset):
    """Sample ``i`` is ``i``: a batch shows exactly which indices it holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class DieInWorker(Indices):
    """A worker is SIGKILLed (as the OOM killer does) when it reaches index ``at``; the main process serves it."""

    def __init__(self, n: int, at: int) -> None:
        super().__init__(n)
        self.at = at

    def __getitem__(self, i: int) -> int:
        if i == self.at and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(10))


class EagerChunks(Sampler):
    """A batch sampler that draws from the global RNG eagerly, in ``iter()``, and yields batches of 1 to 5 indices."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return len(self._chunks(list(range(self.n)), torch.Generator().manual_seed(0)))

    @staticmethod
    def _chunks(order: List[int], sizes: torch.Generator) -> List[List[int]]:
        out, i = [], 0
        while i < len(order):
            k = int(torch.randint(1, 6, (), generator=sizes))
            out.append(order[i:i + k])
            i += k
        return out

    def __iter__(self) -> Iterator[List[int]]:
        order = torch.randperm(self.n).tolist()  # global RNG, now
        return iter(self._chunks(order, torch.Generator().manual_seed(0)))


class CountingSampler(Sampler):
    """Sequential; counts how many indices were pulled from it."""

    def __init__(self, n: int) -> None:
        self.n, self.pulled = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.pulled += 1
            yield i
