"""What one configuration adds to the process tree's memory (``footprint``, NOTE [ Memory budget ] in budget.py): the
one formula every memory check and forecast uses, a pure function of the configuration and two measured sizes; and
how much of a worker's growth during a window counts (``window_growth_bytes``: beyond ``growth_noise_bytes``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..config import LoaderConfig
from .._text import mib
from ..results import TrialResult

__all__ = ["GROWTH_NOISE_BYTES", "Footprint", "footprint", "growth_noise_bytes", "shm_need_bytes",
           "window_growth_bytes"]


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

    @property
    def least_bytes(self) -> int:
        """``total_bytes``, or, while one worker's memory is not known, the rest: what no worker size makes smaller."""
        total = self.total_bytes
        return self.shm_bytes + self.pinned_bytes + self.threads_bytes if total is None else total

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


GROWTH_NOISE_BYTES = 4 * 2**20
"""A worker's USS grows this much once in any trial, whatever it reads: allocator warm-up, the collector's first pass
over inherited objects, batches being built (measured 1-3 MiB in a pytest process)."""


def growth_noise_bytes(trial: TrialResult) -> int:
    """Growth any worker shows once during a trial: ``GROWTH_NOISE_BYTES``, or the batches a worker holds
    (``LoaderConfig.worker_batches``) when more (a batch built in shared memory counts as the worker's own until the
    main process maps it)."""
    return max(GROWTH_NOISE_BYTES, trial.config.worker_batches() * (trial.batch_bytes or 0))


def window_growth_bytes(trial: TrialResult) -> int:
    """What one worker of ``trial`` grew during its window beyond what any worker shows once (``growth_noise_bytes``):
    the growth every memory check adds to a worker's measured size (budget.py); 0 when not measured. Below the noise,
    the difference of two readings is the batches a worker was building at each, which its size already holds (a
    waiting-bound worker of 12 MiB read 3.2 MiB "growth" from 6 MiB batches, and 13 workers were refused under a
    budget their epoch peaked at 82 % of)."""
    return max(0, (trial.worker_uss_growth_bytes or 0) - growth_noise_bytes(trial))
