"""The datasets of ``test_bench_peers.py`` (module level: worker processes unpickle them) and the cold-file helpers.

Every contender of a row reads the same dataset: a ``Cycle`` over one of ``tests/workloads.py``'s datasets, long enough
that no contender reaches its end within the measurement window (the cold row excepted: there each file is read once,
and a contender fast enough to reach the last file ends its window there).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from bench_files import LONG, Cycle, FileSet, resident_fraction
from workloads import CpuBound, InMemory, JpegDecode, LatencyBound, Mixed

COLD_FILE_BYTES = 4 << 10
"""One page: a cold read costs a file's latency, not its bandwidth, and many files fit on any disk."""


class Indexed(Dataset):
    """``base``'s work per sample (``CpuBound``'s spin runs for a time, not a fixed count of steps, so its value
    varies), then ``i`` as the sample: every contender's values can be checked."""

    def __init__(self, base: Any, dim: int = 16) -> None:
        self.base, self.dim = base, dim

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> torch.Tensor:
        self.base[i]
        return torch.full((self.dim,), float(i))


class ColdFiles(FileSet):
    """One 4 KiB file per sample, read whole on every access; returns its first 64 bytes as float32 and their sum
    over the whole file (so every byte read is used)."""

    def __init__(self, root: str, n: int) -> None:
        super().__init__(root, n, COLD_FILE_BYTES)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.path(i), "rb") as fh:
            data = np.frombuffer(fh.read(), dtype=np.uint8)
        head = data[:64].astype(np.float32)
        head[0] = float(data.sum(dtype=np.int64))
        return torch.from_numpy(head)


    def resident(self, count: int = 256) -> Optional[float]:
        """The share of the pages of ``count`` files spread over the set that are in the page cache (mincore)."""
        step = max(1, self.n // count)
        return resident_fraction([self.path(i) for i in range(0, self.n, step)][:count])


# ---------------------------------------------------------------- the workloads

def _in_memory() -> Dataset:
    torch.manual_seed(0)
    return Cycle(InMemory(n=20000, dim=16))


WORKLOADS: Dict[str, Dict[str, Any]] = {
    "in-memory": dict(title="in-memory (16 float32 per sample, indexed from a tensor)", make=_in_memory),
    "cpu-bound": dict(title="CPU-bound (1 ms of numpy scalar work per sample, holds the GIL)",
                      make=lambda: Indexed(CpuBound(n=LONG, cost_s=0.001))),
    "latency-bound": dict(title="waiting-bound (time.sleep 4 ms per sample)",
                          make=lambda: LatencyBound(n=LONG, latency_s=0.004)),
    "mixed": dict(title="mixed (3 ms sleep + 0.5 ms CPU per sample)",
                  make=lambda: Indexed(Mixed(n=LONG, latency_s=0.003, cost_s=0.0005))),
    "jpeg": dict(title="JPEG decode (Pillow, 256x256 -> random crop 224 + flip, uint8 CHW, label)",
                 make=lambda: Cycle(JpegDecode()), needs="PIL"),
    "cold": dict(title="cold files (one 4 KiB file per sample, page cache dropped with posix_fadvise)",
                 make=None),
}


def make_dataset(name: str, cold_root: Optional[str] = None, cold_n: int = 0) -> Dataset:
    if name == "cold":
        assert cold_root is not None, "the cold workload needs its files"
        return ColdFiles(cold_root, cold_n)
    return WORKLOADS[name]["make"]()


def flatten(sample: Any) -> List[torch.Tensor]:
    """A sample or a batch as a flat list of tensors (ints and numpy arrays converted)."""
    if isinstance(sample, (tuple, list)):
        return [t for part in sample for t in flatten(part)]
    if isinstance(sample, torch.Tensor):
        return [sample]
    return [torch.as_tensor(np.asarray(sample))]


def same(a: Any, b: Any) -> bool:
    fa, fb = flatten(a), flatten(b)
    return len(fa) == len(fb) and all(x.shape == y.shape and torch.equal(x.to(torch.float64), y.to(torch.float64))
                                      for x, y in zip(fa, fb))


def element(batch: Any, j: int) -> List[torch.Tensor]:
    """Sample ``j`` of a collated batch."""
    return [t[j] for t in flatten(batch)]


def batch_len(batch: Any) -> int:
    return int(flatten(batch)[0].shape[0])
