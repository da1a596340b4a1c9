"""What the benchmarks share: an epoch of any length over a small dataset (``Cycle``) and files read cold (written
once, dropped from the page cache with ``posix_fadvise``, checked with ``mincore``)."""
from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
from torch.utils.data import Dataset


LONG = 10 ** 9
"""The default length of a cycled dataset: no window reaches it."""


class Cycle(Dataset):
    """``n`` samples of ``base``, repeating it: an epoch of any length over the same data."""

    def __init__(self, base: Any, n: int = LONG) -> None:
        self.base, self.n = base, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.base[i % len(self.base)]


class FileSet(Dataset):
    """``n`` files of ``size`` bytes under ``root``, one per sample: subclasses read them in ``__getitem__``."""

    def __init__(self, root: str, n: int, size: int) -> None:
        self.root, self.n, self.size = root, n, size

    def path(self, i: int) -> str:
        return os.path.join(self.root, f"{i:07d}.bin")

    def write(self) -> None:
        write_files(self.path, self.n, self.size)

    def drop_cache(self) -> None:
        drop_cached(self.path, self.n)

    def __len__(self) -> int:
        return self.n


def write_files(path: Callable[[int], str], n: int, size: int) -> None:
    """``n`` files of ``size`` random bytes (``path(i)`` names them), synced: dirty pages cannot be dropped."""
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, size + 4096, dtype=np.uint8).tobytes()
    for i in range(n):
        with open(path(i), "wb") as fh:
            fh.write(blob[i % 4096:i % 4096 + size])
    os.sync()


def drop_cached(path: Callable[[int], str], n: int) -> None:
    """Drop every file's pages from the page cache: ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)``."""
    for i in range(n):
        fd = os.open(path(i), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(paths: Sequence[str]) -> Optional[float]:
    """The share of the files' pages in the page cache (``mincore``); None when it cannot be read."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        page = os.sysconf("SC_PAGE_SIZE")
        resident = total = 0
        for path in paths:
            size = os.path.getsize(path)
            pages = (size + page - 1) // page
            fd = os.open(path, os.O_RDONLY)
            try:
                addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
                if addr is None or addr == ctypes.c_void_p(-1).value:
                    return None
                vec = (ctypes.c_ubyte * pages)()
                ok = libc.mincore(addr, size, vec) == 0
                libc.munmap(addr, size)
                if not ok:
                    return None
            finally:
                os.close(fd)
            resident += sum(b & 1 for b in vec)
            total += pages
        return resident / total if total else None
    except (OSError, AttributeError):
        return None
