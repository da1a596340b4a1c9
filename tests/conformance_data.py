"""Datasets, samplers and functions for the DataLoader conformance suite (tests/conformance): module level, so that
workers of any start method can load them."""
from __future__ import annotations

import collections
import math
import os
import signal
import time
from typing import Any, Dict, Iterator, List

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

Pair = collections.namedtuple("Pair", ["x", "y"])


class Numbers(Dataset):
    """Sample ``i`` is ``tensor([i])``; the samples in ``bad`` raise ``ValueError`` (``KeyError`` when ``key``)."""

    def __init__(self, n: int = 20, bad: tuple = (), key: bool = False) -> None:
        self.n, self.bad, self.key = n, bad, key

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.bad:
            raise (KeyError if self.key else ValueError)(f"sample {i} is corrupt")
        return torch.tensor([i])


class Records(Dataset):
    """Dict samples holding a tensor, a numpy array, a namedtuple, a str and an int."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"image": torch.full((2, 3), float(i)), "mask": np.arange(3) + i,
                "pair": Pair(torch.tensor(i), i * 0.5), "name": f"item-{i}", "label": i % 3}


class Ready(Dataset):
    """Each item is a ready batch (for ``batch_size=None``): a numpy array of 4 rows and its label."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        return np.full((4, 2), i, dtype=np.float32), i


INITIALISED = -1
"""Set by ``mark_worker`` (a ``worker_init_fn``) in each worker: ``100 + its id``."""


class WhoLoads(Dataset):
    """Sample ``i`` says who loaded it: ``[i, worker id (-1 in the main process), workers, the process's torch seed,
    what its worker_init_fn set, a draw from numpy's RNG]``."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        worker, workers = (-1, 0) if info is None else (info.id, info.num_workers)
        return torch.tensor([i, worker, workers, torch.initial_seed() % 2 ** 62, INITIALISED,
                             int(np.random.randint(1 << 30))])


def mark_worker(worker_id: int) -> None:
    """A ``worker_init_fn``: records that it ran (``INITIALISED``) and seeds numpy from the worker's seed."""
    global INITIALISED
    INITIALISED = 100 + worker_id
    np.random.seed(torch.initial_seed() % 2 ** 32)


def failing_init(worker_id: int) -> None:
    """A ``worker_init_fn`` that fails in worker 1."""
    if worker_id == 1:
        raise ValueError("worker 1 cannot start")


class Pids(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, os.getpid()])


class Slow(Dataset):
    """Each sample sleeps ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.tensor([i])


class Segfault(Dataset):
    """Every sample kills the process that loads it with SIGSEGV (as a crashing C extension does), ``delay_s`` after
    it was asked for."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay_s)
        os.kill(os.getpid(), signal.SIGSEGV)
        return torch.tensor([i])


class Counting(Dataset):
    """Counts its reads in this process; ``scale`` may be set after the loader is built, before ``iter()``."""

    def __init__(self, n: int = 8) -> None:
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self.reads += 1
        return torch.tensor([i]) * self.scale  # AttributeError until the user sets ``scale``


class Sharded(IterableDataset):
    """``[i, worker id (-1 in the main process)]`` for ``i`` in ``0 .. n-1``, split between workers by
    ``get_worker_info()`` when ``shard``; ``len()`` is ``n``."""

    def __init__(self, n: int = 20, shard: bool = True) -> None:
        self.n, self.shard = n, shard

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        if info is None or not self.shard:
            start, step = 0, 1
        else:
            start, step = info.id, info.num_workers
        for i in range(start, self.n, step):
            yield torch.tensor([i, -1 if info is None else info.id])


class Unsized(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(7))


class BrokenIter(IterableDataset):
    """``__iter__`` raises."""

    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("cannot open the stream")


class RaggedBatches(Sampler):
    """A batch sampler of batches of 1, 2, 3, ... indices, in order."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return math.ceil((math.sqrt(8 * self.n + 1) - 1) / 2)

    def __iter__(self) -> Iterator[List[int]]:
        at, size = 0, 1
        while at < self.n:
            yield list(range(at, min(self.n, at + size)))
            at, size = at + size, size + 1


def keep_as_list(samples: list) -> list:
    """A ``collate_fn`` that returns the samples as they are."""
    return samples


def bad_collate(samples: list) -> torch.Tensor:
    """A ``collate_fn`` that refuses batches holding sample 5."""
    if any(int(s) == 5 for s in samples):
        raise TypeError("cannot collate sample 5")
    return torch.stack(samples)


class Record:
    """A custom batch type a ``collate_fn`` returns."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and [s.tolist() for s in self.samples] == [s.tolist() for s in other.samples]


def as_record(samples: list) -> Record:
    return Record(samples)


