"""Datasets and worker_init_fns for the native thread pool tests (tests/loader/test_native.py and others); module-level
so that spawned workers can import them."""
from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any, Dict, Optional

from torch.utils.data import Dataset

SEEN: Dict[str, Any] = {}
"""What ``user_init`` saw in this worker when it started (before its own limit)."""
USER_LIMIT = 2
"""The BLAS limit ``user_init`` sets: its own, which must win over autoloader's."""


def pools() -> Optional[Dict[str, int]]:
    """Threads per native pool of this process, read with threadpoolctl even where a test hid it (a worker of such a
    test: its limit ran already); None when it is not installed at all."""
    hidden = "threadpoolctl" in sys.modules and sys.modules["threadpoolctl"] is None
    if hidden:
        del sys.modules["threadpoolctl"]
    try:
        module = importlib.import_module("threadpoolctl")
    except ImportError:
        return None
    finally:
        if hidden:
            sys.modules["threadpoolctl"] = None  # type: ignore[assignment]
    return {p["user_api"]: p["num_threads"] for p in module.threadpool_info()}


class PoolsInWorker(Dataset):
    """Sample ``i``: the native pools of the process that loads it (``pools()``), ``SEEN``, the worker's
    ``OMP_NUM_THREADS``, the fake OpenCV's threads when one is imported, and the pid. ``wait_s``: each sample first
    sleeps so long (waiting-bound data, for which any search tries workers whatever the machine's CPU count)."""

    def __init__(self, n: int = 8, wait_s: float = 0.0) -> None:
        self.n, self.wait_s = n, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if self.wait_s:
            time.sleep(self.wait_s)
        cv2 = sys.modules.get("cv2")
        return {"pools": pools(), "seen": dict(SEEN), "omp": os.environ.get("OMP_NUM_THREADS"), "pid": os.getpid(),
                "cv2": cv2.getNumThreads() if cv2 is not None else None}


def user_init(worker_id: int) -> None:
    """A user's worker_init_fn: notes the pools it finds, then limits BLAS to ``USER_LIMIT`` threads itself."""
    from threadpoolctl import threadpool_limits

    SEEN.update(pools() or {}, worker=worker_id)
    threadpool_limits(limits=USER_LIMIT, user_api="blas")


def mark_init(worker_id: int) -> None:
    """A user's worker_init_fn that only notes it ran (no threadpoolctl needed)."""
    SEEN.update(worker=worker_id, ran=True)


class FakeCv2:
    """Stands in for OpenCV (not installed here): ``getNumThreads``/``setNumThreads`` as cv2 has them (0: sequential,
    which cv2 reports as 1 thread)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def getNumThreads(self) -> int:  # noqa: N802 - OpenCV's name
        return self.threads

    def setNumThreads(self, n: int) -> None:  # noqa: N802 - OpenCV's name
        self.threads = max(1, n)
