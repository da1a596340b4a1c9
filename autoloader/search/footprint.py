"""What one configuration adds to the process tree's memory (``footprint``, NOTE [ Memory budget ] in budget.py): the
one formula every memory check and forecast uses, a pure function of the configuration and two measured sizes."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..config import LoaderConfig
from .._text import mib

__all__ = ["Footprint", "footprint", "shm_need_bytes"]


@dataclass(frozen=True)
class Footprint:
    """What one configuration adds to the process tree's memory (see NOTE [ Memory budget ]); ``workers_bytes`` is
    None when one worker's memory is not known yet."""

    workers_bytes: Optional[int]
    shm_bytes: int
    pinned_bytes: int
    threads_bytes: int

    @property
    def total_bytes(self) -> Optional[int]:
        if self.workers_bytes is None:
            return None
        return self.workers_bytes + self.shm_bytes + self.pinned_bytes + self.threads_bytes

    def describe(self) -> str:
        parts = [("workers", self.workers_bytes), ("batches in /dev/shm", self.shm_bytes),
                 ("pinned copies", self.pinned_bytes), ("thread buffers", self.threads_bytes)]
        return " + ".join(f"{mib(v)} {name}" for name, v in parts if v)


def shm_need_bytes(config: LoaderConfig, batch_bytes: int) -> int:
    """/dev/shm the batches in flight take (``LoaderConfig.shm_batches``)."""
    return config.shm_batches() * batch_bytes


def footprint(config: LoaderConfig, *, per_worker_bytes: Optional[int], batch_bytes: Optional[int]) -> Footprint:
    """THE footprint of ``config`` when one worker takes ``per_worker_bytes`` (USS plus growth) and a batch
    ``batch_bytes`` (unknown: 0 for the batch parts)."""
    n, batch = config.num_workers, batch_bytes or 0
    shm = shm_need_bytes(config, batch)
    pinned = (shm if n else 2 * batch) if config.pin_memory else 0
    threads = max(1, n) * config.threads * math.ceil(batch / config.threads) if config.threads > 1 else 0
    workers = 0 if n == 0 else (None if per_worker_bytes is None else n * per_worker_bytes)
    return Footprint(workers, shm, pinned, threads)
