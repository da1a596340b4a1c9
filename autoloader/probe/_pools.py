"""The native thread pools of this process (BLAS, OpenMP, OpenCV, numexpr): which there are and how many threads each
keeps. Read, never set: ``loader/native.py`` limits them inside DataLoader workers (NOTE [ Native thread pools ]).

threadpoolctl, a dependency (``install_requires``), finds the BLAS and OpenMP libraries loaded in the process; OpenCV
and numexpr are read when they are imported. Where it is missing all the same (an install that left it out, a test
that hides it) the BLAS and OpenMP pools are unknown: ``pools_here()`` is None then, never a partial list that would
read as "no BLAS pool".
"""
from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, List, Mapping, Optional, Sequence

log = logging.getLogger("autoloader.probe")

MODULE_POOLS = ("cv2", "numexpr")
"""Python modules with a pool of their own that threadpoolctl does not see, read (and limited) when imported."""


@dataclass(frozen=True)
class NativePool:
    """One native thread pool of a process: ``library`` (threadpoolctl's prefix, e.g. ``libscipy_openblas``,
    ``libgomp``, ``libmkl_rt``; or ``cv2``, ``numexpr``), its ``user_api`` (``blas``, ``openmp``, ``opencv``,
    ``numexpr``) and ``internal_api`` (``openblas``, ``mkl``, ``openmp``, ...), the threads it had when found, and
    the threads it kept after a limit (``limited_to``; None when no limit was applied)."""

    library: str
    user_api: str
    internal_api: str
    found: int
    limited_to: Optional[int] = None

    @property
    def kept(self) -> int:
        """The threads it kept: ``limited_to`` after a limit, else ``found``."""
        return self.found if self.limited_to is None else self.limited_to

    def label(self) -> str:
        """``libscipy_openblas (blas) 2 -> 1``: the library, its API, the threads found and kept."""
        kept = "" if self.limited_to is None or self.limited_to == self.found else f" -> {self.limited_to}"
        return f"{self.library} ({self.user_api}) {self.found}{kept}"

    def to_dict(self) -> dict:
        return {"library": self.library, "user_api": self.user_api, "internal_api": self.internal_api,
                "found": self.found, "limited_to": self.limited_to}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NativePool":
        """Rebuild from ``to_dict``; ``ValueError`` on anything else."""
        if not isinstance(data, Mapping) or set(data) - {"library", "user_api", "internal_api", "found",
                                                         "limited_to"}:
            raise ValueError(f"a native pool must be an object of NativePool fields, got {data!r}")
        pool = cls(**data)
        texts = (pool.library, pool.user_api, pool.internal_api)
        counts = (pool.found,) + (() if pool.limited_to is None else (pool.limited_to,))
        if not all(isinstance(t, str) for t in texts) or \
                not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise ValueError(f"a native pool needs text names and thread counts >= 0, got {data!r}")
        return pool


def limit_held(limit: Optional[int], pools: Optional[Sequence[NativePool]]) -> Optional[bool]:
    """Whether a worker's native pools were seen held to ``limit`` threads: None without a limit; False when its pools
    are unknown (None: threadpoolctl missing, or not measured; the BLAS and OpenMP pools were then neither seen nor
    limited) or one kept more threads than the limit (a library that refused); True when every pool kept at most
    ``limit``. What a report may claim of a limit (it never claims one it did not see applied)."""
    if limit is None:
        return None
    if pools is None:
        return False
    return all(p.kept <= limit for p in pools)


def threadpoolctl() -> Optional[ModuleType]:
    """The threadpoolctl module, or None when it is not installed (looked up each time: a test may hide it)."""
    try:
        return importlib.import_module("threadpoolctl")
    except ImportError:
        return None


def library_pools() -> Optional[List[NativePool]]:
    """The BLAS and OpenMP libraries loaded in this process, as threadpoolctl finds them; None without it."""
    module = threadpoolctl()
    if module is None:
        return None
    return [NativePool(str(info.get("prefix") or info.get("filepath")), str(info.get("user_api")),
                       str(info.get("internal_api")), int(info.get("num_threads") or 0))
            for info in module.threadpool_info()]


def module_threads(name: str) -> Optional[int]:
    """Threads of the pool of ``name`` (one of ``MODULE_POOLS``) when it is imported here, else None."""
    module = sys.modules.get(name)
    getter = getattr(module, "getNumThreads" if name == "cv2" else "get_num_threads", None)
    if getter is None:
        return None
    try:
        return int(getter())
    except Exception as err:  # noqa: BLE001 - a broken or stubbed module: its pool is unknown
        log.debug("could not read the threads of %s: %s", name, err)
        return None


def module_pools() -> List[NativePool]:
    """The OpenCV and numexpr pools, for those imported in this process."""
    pools = []
    for name in MODULE_POOLS:
        found = module_threads(name)
        if found is not None:
            pools.append(NativePool(name, "opencv" if name == "cv2" else name, name, found))
    return pools


def pools_here() -> Optional[List[NativePool]]:
    """Every native pool of this process (``library_pools`` then ``module_pools``); None without threadpoolctl."""
    libraries = library_pools()
    return None if libraries is None else libraries + module_pools()
