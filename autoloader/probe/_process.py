"""Facts about this process that decide how DataLoader workers start and what they may hold: the start method, the
open-files limit, the thread variables, and the memory a worker could copy. Read, never set."""
from __future__ import annotations

import multiprocessing
import resource
from multiprocessing.context import BaseContext
from typing import Optional, Tuple, Union

import psutil

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
"""The variables that size the thread pools numpy (OpenBLAS/MKL), torch and numexpr start in every process."""


def start_method(multiprocessing_context: Union[str, BaseContext, None] = None) -> Optional[str]:
    """How DataLoader workers will start: the context the user passed (a name or a context object), else the one set
    for this process, else the platform default. Never fixes the default as a side effect, as
    ``multiprocessing.get_start_method()``/``get_context()`` without arguments would (a later ``set_start_method()``
    of the user's would then fail)."""
    if isinstance(multiprocessing_context, str):
        return multiprocessing_context
    if multiprocessing_context is not None:
        return multiprocessing_context.get_start_method()
    method = multiprocessing.get_start_method(allow_none=True)
    if method is None:
        methods = multiprocessing.get_all_start_methods()  # documented: the first is the default
        method = methods[0] if methods else None
    return method


def open_files_limit() -> Tuple[Optional[int], Optional[int]]:
    """``ulimit -n``: the (soft, hard) limit on open file descriptors; None for unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (None if soft == resource.RLIM_INFINITY else int(soft),
            None if hard == resource.RLIM_INFINITY else int(hard))


def private_bytes() -> int:
    """The memory a worker this process forks could ever copy: its anonymous pages (heap, arrays, Python objects;
    ``Anonymous`` in ``/proc/self/smaps_rollup``), not the libraries' file pages a child shares read-only. Its
    resident set (RSS, larger) where that file cannot be read (not Linux)."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as fh:
            rollup = fh.read()
    except OSError:
        rollup = b""
    for line in rollup.splitlines():
        fields = line.split()
        if fields[:1] == [b"Anonymous:"] and len(fields) >= 2 and fields[1].isdigit():
            return int(fields[1]) * 1024
    return int(psutil.Process().memory_info().rss)
