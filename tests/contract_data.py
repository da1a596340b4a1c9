"""Datasets and samplers for the contract properties (tests/properties): module level, so that workers of any start
method can load them. Every sample carries its index, so a batch says which samples it holds."""
from __future__ import annotations

import random
import re
from typing import Iterator, List, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler


class BadSample(Exception):
    """What loading a sample in ``bad`` raises: ``sample {i} is corrupt``."""


def bad_index(error: BaseException) -> int:
    """The sample a ``BadSample`` names (raised here, or re-raised by a DataLoader from a worker)."""
    found = re.search(r"sample (\d+) is corrupt", str(error))
    if found is None:
        raise AssertionError(f"not a BadSample message: {error!r}")
    return int(found.group(1))


class Items(Dataset):
    """Sample ``i`` is ``tensor([i, draw])``; ``draw`` is 0, or with ``augment`` a value drawn from torch's, Python's
    and numpy's global RNGs in whichever process loads the sample (as random augmentation does). Loading a sample in
    ``bad`` raises ``BadSample`` once ``armed``."""

    def __init__(self, n: int, augment: bool = False, bad: Tuple[int, ...] = (), armed: bool = True) -> None:
        self.n, self.augment, self.bad, self.armed = n, augment, bad, armed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.armed and i in self.bad:
            raise BadSample(f"sample {i} is corrupt")
        draw = 0
        if self.augment:
            draw = int(torch.randint(0, 1000, ())) * 1_000_000 + random.randrange(1000) * 1000 \
                + int(np.random.randint(1000))
        return torch.tensor([i, draw])


class Stream(IterableDataset):
    """``0, 1, ... n - 1`` (as ``tensor([i, draw])``, ``draw`` as ``Items``'s), its position its ``state_dict()``;
    reaching a position in ``bad`` raises ``BadSample`` once ``armed`` (which ends a generator's stream)."""

    def __init__(self, n: int, augment: bool = False, bad: Tuple[int, ...] = (), armed: bool = True) -> None:
        self.n, self.augment, self.position, self.bad, self.armed = n, augment, 0, bad, armed

    def __iter__(self) -> Iterator[torch.Tensor]:
        while self.position < self.n:
            self.position += 1
            if self.armed and self.position - 1 in self.bad:
                raise BadSample(f"sample {self.position - 1} is corrupt")
            draw = int(torch.randint(0, 1000, ())) if self.augment else 0
            yield torch.tensor([self.position - 1, draw])
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


class OwnStateSampler(Sampler):
    """Shuffles with a ``random.Random`` of its own, which its ``state_dict()`` holds."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, random.Random(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        self.rng.shuffle(order)
        return iter(order)

    def state_dict(self) -> dict:
        version, words, gauss = self.rng.getstate()
        return {"version": version, "words": list(words), "gauss": gauss}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate((state["version"], tuple(state["words"]), state["gauss"]))


class PrivateSampler(OwnStateSampler):
    """Shuffles with a ``random.Random`` of its own and has no ``state_dict()``: autoloader cannot see its RNG."""

    state_dict = None  # type: ignore[assignment]
    load_state_dict = None  # type: ignore[assignment]


class GlobalRngSampler(Sampler):
    """No ``state_dict``: draws its order from torch's global RNG, lazily, at the first ``next()``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(self.n).tolist()


class PythonRandomSampler(Sampler):
    """No ``state_dict``: shuffles with Python's global ``random``, eagerly, at ``iter()``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        random.shuffle(order)
        return iter(order)


class ChunkBatchSampler(Sampler):
    """A batch sampler of its own: batches of 1 to ``most`` indices (sizes drawn from ``generator``), in a shuffled
    order; lazy (a generator function), as most are."""

    def __init__(self, n: int, most: int, generator: torch.Generator) -> None:
        self.n, self.most, self.generator = n, most, generator
        self._sizes = torch.randint(1, most + 1, (n,), generator=torch.Generator().manual_seed(n * 31 + most))

    def __len__(self) -> int:
        return len(self._batches(list(range(self.n))))

    def _batches(self, order: List[int]) -> List[List[int]]:
        out, at, i = [], 0, 0
        while at < len(order):
            size = int(self._sizes[i])
            out.append(order[at:at + size])
            at, i = at + size, i + 1
        return out

    def __iter__(self) -> Iterator[List[int]]:
        yield from self._batches(torch.randperm(self.n, generator=self.generator).tolist())
