"""Datasets of the Ray integration tests, importable in Ray's workers (their PYTHONPATH holds this folder)."""
from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset

from _helpers import Indexed

__all__ = ["Blocking", "Failing", "Indexed", "Where"]


class Where(Indexed):
    """``(image, index, node id)``: the node whose worker loaded the sample (the driver reports "driver")."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.driver = os.getpid()

    def __getitem__(self, index: int):
        image, index = super().__getitem__(index)
        node = "driver"
        if os.getpid() != self.driver:
            import ray

            node = ray.get_runtime_context().get_node_id()
        return image, index, node


class Failing(Indexed):
    """Raises ``ValueError`` for index ``bad`` when loaded outside the driver."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad, self.driver = bad, os.getpid()

    def __getitem__(self, index: int):
        if index == self.bad and os.getpid() != self.driver:
            raise ValueError(f"sample {index} is corrupt")
        return super().__getitem__(index)


class Blocking(Dataset):
    """Sleeps ``seconds`` per sample outside the driver: a task that does not come back in time."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds, self.driver = n, seconds, os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if os.getpid() != self.driver:
            time.sleep(self.seconds)
        return torch.zeros(2), index
