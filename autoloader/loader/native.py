"""Native thread pools inside DataLoader workers: ``NativeLimit``, the ``worker_init_fn`` that limits them (before the
user's own), and what each worker found (``worker_pools``). The share each worker gets is ``search/native_policy.py``'s.

# NOTE [ Native thread pools ]
# Why in the worker. torch's worker loop calls ``torch.set_num_threads(1)`` for its own pool, but numpy's OpenBLAS or
# MKL, other OpenMP runtimes, OpenCV and numexpr keep the size they chose when loaded, one thread per core: N workers
# start N x cores threads on the cores, and a dataset doing BLAS per sample then runs slower the more workers it has.
# Limiting in the parent would change the main process, whose training step wants every core (it is touched only
# while its DataLoader forks, below), and environment variables come too late for libraries already loaded. So every
# DataLoader autoloader builds with
# workers (``Request.data_loader``: trials, online candidates, the returned loader) gets a ``worker_init_fn`` that
# runs in each worker after fork (or after a spawn/forkserver child unpickled the dataset), before its first sample.
# What it limits, to ``LoaderConfig.native_threads`` threads each, never raising one (torch's 1 stays 1):
# - the BLAS and OpenMP libraries threadpoolctl finds loaded in the worker (under fork: all the parent loaded, numpy's
#   OpenBLAS and torch's libgomp included; under spawn: what importing torch and the dataset's modules loaded);
# - OpenCV and numexpr, when imported (``cv2.setNumThreads(0)`` for one thread: sequential, no pool);
# - the thread variables (OMP_NUM_THREADS, MKL_NUM_THREADS, ...), at most the limit in the worker's own environment,
#   for the libraries it loads later and the processes it starts.
# What it cannot see: a library first loaded inside ``__getitem__`` (threadpoolctl lists loaded libraries only; the
# variables cover OpenBLAS, MKL, OpenMP and numexpr, which read them when loaded, not OpenCV: import cv2 at module
# level); OpenMP's setting is per thread, so threads the worker starts itself (``ThreadedDataset``'s) keep the
# runtime's initial size; pools no one exposes (OpenCV's TBB). threadpoolctl is a dependency; where it is missing all
# the same, only OpenCV, numexpr and the variables are limited: a BLAS or OpenMP library already loaded (under fork,
# numpy's OpenBLAS, the usual offender) keeps its size. That is logged once per process, the pools are then unknown
# (``pools_here`` is None), and the reports say the limit was not seen applied (``probe._pools.limit_held``).
# Forked pools: a pool started in the parent comes to the worker without its threads, and the library starts them
# again (OpenBLAS's fork handler, the OpenMP runtime on its next parallel region); the hangs reported with OpenCV and
# albumentations under fork are of that kind. A limit of one makes OpenCV sequential in the worker, so it starts no
# pool there; what a library does at fork itself, before any worker_init_fn runs, no limit can change.
# Order: ours first, then the user's ``worker_init_fn``, so theirs wins (a ``threadpool_limits(4)`` of theirs raises
# what we limited: their explicit choice). Their exceptions reach the DataLoader unchanged; ours never raise (a pool
# that refuses is logged at debug level and the worker goes on). ``loader.worker_init_fn`` reads as theirs (None when
# they gave none, so that Lightning's ``seed_everything(workers=True)`` still installs its own) and setting it keeps
# the limit (``users_init``, ``rewrap``; NOTE [ What frameworks read ] in mirror.py).
# At fork (``limited_at_fork``, around every ``iter()`` of ours that starts workers: ``epochs.epoch_iter``'s, not when
# it reuses persistent ones, and a resumed epoch's). A worker that sets OpenBLAS's size itself pays for it: OpenBLAS's
# fork handler shut its pool down, and setting the size starts it again, whose threads spin: many workers doing so
# on few cores slow the parent's next forks, on the loop's thread. So the parent's BLAS and OpenMP pools over the
# limit are held at it while ``iter()`` forks (the loop's thread is in ``iter()``, not in its step; another thread's
# BLAS call runs with fewer threads for that moment) and restored after: the workers inherit the size, find nothing
# over the limit and set nothing, and report the size the parent had as what they found (``at_fork``). Under spawn or
# forkserver nothing is inherited: the workers limit as above.
# Facts: the workers of a measured loader (trials, online candidates) append what they found and kept, one JSON line,
# to a file of the parent's; only the first worker does (the workers of one loader are alike, and reading the
# pools costs each milliseconds of CPU beside the forks): ``worker_pools`` reads it. The served loader's workers
# report nothing.
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import tempfile
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..probe._process import THREAD_ENV_VARS
from ..probe._pools import NativePool, library_pools, module_pools, module_threads, pools_here, threadpoolctl

log = logging.getLogger("autoloader.native")

_told_without_threadpoolctl = False


class NativeLimit:
    """A DataLoader ``worker_init_fn``: in each worker, limits the native pools to ``threads`` threads (None: only
    reads them, in the first worker), the first worker appends what it found to ``report`` (a file, when measured),
    then calls ``then``, the user's ``worker_init_fn`` (see NOTE [ Native thread pools ])."""

    def __init__(self, threads: Optional[int], then: Optional[Callable[[int], Any]] = None,
                 report: Optional[str] = None) -> None:
        self.threads, self.then, self.report = threads, then, report
        self.at_fork: Dict[str, int] = {}
        """The parent's pools (library: threads) that ``limited_at_fork`` holds at the limit while workers fork."""

    def __call__(self, worker_id: int) -> None:
        try:
            report = self.report if worker_id == 0 else None
            pools = limit_here(self.threads, at_fork=self.at_fork) if self.threads is not None else \
                pools_here() if report is not None else None
            if report is not None:
                _append(report, {"worker": worker_id, "threads": self.threads,
                                      "pools": None if pools is None else [p.to_dict() for p in pools]})
        except Exception as err:  # noqa: BLE001 - never the worker's end: its pools stay as they were
            log.debug("worker %d: native thread pools not limited: %s", worker_id, err)
        if self.then is not None:
            self.then(worker_id)

    def __repr__(self) -> str:
        return f"NativeLimit(threads={self.threads}, then={self.then!r})"


def worker_init(threads: Optional[int], user: Optional[Callable[[int], Any]], *,
                report: bool = False) -> Optional[Callable[[int], Any]]:
    """The ``worker_init_fn`` of a DataLoader with workers: the user's alone when nothing is limited nor read, else a
    ``NativeLimit`` calling it (``report``: its workers write what they found, for ``worker_pools``)."""
    user = users_init(user)
    if threads is None and not report:
        return user
    if threads is not None:
        _tell_without_threadpoolctl()
    path = None
    if report:
        fd, path = tempfile.mkstemp(prefix="autoloader-pools-", suffix=".jsonl")
        os.close(fd)
    limit = NativeLimit(threads, user, path)
    if path is not None:
        weakref.finalize(limit, _remove, path, os.getpid())
    return limit


def users_init(fn: Any) -> Any:
    """The user's ``worker_init_fn`` inside ``fn`` (a ``NativeLimit``'s), or ``fn`` itself."""
    return fn.then if isinstance(fn, NativeLimit) else fn


def rewrap(current: Any, fn: Any) -> Any:
    """``fn`` set as the user's ``worker_init_fn`` where ``current`` is: under the same limit when it has one."""
    if isinstance(current, NativeLimit) and current.threads is not None:
        return NativeLimit(current.threads, users_init(fn))
    return fn


@contextmanager
def limited_at_fork(loader: Any) -> Iterator[None]:
    """While ``loader`` (a DataLoader) forks its workers: this process's BLAS and OpenMP pools over the limit of its
    ``worker_init_fn`` held at it, and restored after (NOTE [ Native thread pools ], At fork). Nothing for a loader
    without workers, one autoloader does not limit, one that spawns them, or without threadpoolctl."""
    init = getattr(loader, "worker_init_fn", None) if getattr(loader, "num_workers", 0) else None
    if not isinstance(init, NativeLimit):
        yield
        return
    threads = init.threads if _forks(loader) else None
    module = threadpoolctl() if threads is not None else None
    limiter, over = None, {}
    if module is not None and threads is not None:
        try:
            controller = module.ThreadpoolController()
            over = {c.prefix: c.num_threads for c in controller.lib_controllers if c.num_threads > threads}
            if over:
                limiter = controller.limit(limits={library: threads for library in over})
        except Exception as err:  # noqa: BLE001 - the workers limit themselves, as under spawn
            log.debug("native thread pools not held at %s threads while forking: %s", threads, err)
            limiter, over = None, {}
    init.at_fork = over
    try:
        yield
    finally:
        init.at_fork = {}
        if limiter is not None:
            limiter.restore_original_limits()


def _forks(loader: Any) -> bool:
    """``loader`` starts its workers by fork (its ``multiprocessing_context``, else the default one's method)."""
    context = getattr(loader, "multiprocessing_context", None)
    method = context.get_start_method() if context is not None else \
        multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]  # not fixed
    return method == "fork"


def limit_here(limit: int, *, at_fork: Optional[Dict[str, int]] = None) -> Optional[List[NativePool]]:
    """Limit this process's native pools to ``limit`` threads each, never raising one; the pools as found (the
    parent's size for those it held at the limit while forking: ``at_fork``) and kept (None without threadpoolctl: the
    BLAS and OpenMP pools are unknown and not limited, the others are)."""
    for name in THREAD_ENV_VARS:
        value = os.environ.get(name, "").strip()
        os.environ[name] = str(min(int(value), limit) if value.isdigit() and int(value) > 0 else limit)
    found = library_pools()
    module = threadpoolctl()
    over = {p.library: limit for p in found or () if p.found > limit}
    if module is not None and over:
        module.threadpool_limits(limits=over)
    kept = {p.library: p.found for p in library_pools() or ()} if over else {}
    pools = [NativePool(p.library, p.user_api, p.internal_api, (at_fork or {}).get(p.library, p.found),
                        kept.get(p.library, p.found)) for p in found or ()]
    for pool in module_pools():
        if pool.found > limit:
            _set_module_threads(pool.library, limit)
        pools.append(NativePool(pool.library, pool.user_api, pool.internal_api, pool.found,
                                module_threads(pool.library)))
    return None if found is None else pools


def worker_pools(init: Any) -> Optional[Tuple[NativePool, ...]]:
    """The pools the first worker (the one that reports; the workers of one loader are alike) of a DataLoader whose
    ``worker_init_fn`` is ``init`` reported; None when it did not, or could not tell (no threadpoolctl)."""
    path = init.report if isinstance(init, NativeLimit) else None
    if path is None:
        return None
    reports = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    reports.append(json.loads(line))
                except ValueError:  # a line still being written
                    continue
    except OSError:
        return None
    reports = sorted((r for r in reports if isinstance(r, dict) and r.get("pools") is not None),
                     key=lambda r: r.get("worker", 0))
    if not reports:
        return None
    try:
        return tuple(NativePool.from_dict(p) for p in reports[0]["pools"])
    except (TypeError, ValueError):
        return None


def _set_module_threads(name: str, limit: int) -> None:
    module = sys.modules[name]
    if name == "cv2":
        module.setNumThreads(0 if limit == 1 else limit)  # 0: sequential, OpenCV's own advice for workers
    else:
        module.set_num_threads(limit)


def _append(path: str, record: dict) -> None:
    """One line, one ``write`` with O_APPEND: the workers' lines never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # never from a forked worker's copy of the limit
        try:
            os.unlink(path)
        except OSError:
            pass


def _tell_without_threadpoolctl() -> None:
    global _told_without_threadpoolctl
    if threadpoolctl() is None and not _told_without_threadpoolctl:
        _told_without_threadpoolctl = True
        log.warning("threadpoolctl is not installed: in DataLoader workers autoloader limits only OpenCV, numexpr "
                    "and libraries loaded after a worker starts (OMP_NUM_THREADS, ...); the BLAS and OpenMP pools "
                    "already loaded (numpy's OpenBLAS or MKL) keep one thread per core in every worker. "
                    "pip install threadpoolctl (a dependency of autoloader the install left out) to limit them too")
