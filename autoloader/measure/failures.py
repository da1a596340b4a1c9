"""How a trial fails: which exceptions are the candidate's fault rather than the user's.

A dataset or step that raises is the user's bug and surfaces unchanged. A worker killed (the OOM killer, a bus error
from a full /dev/shm), a timeout, or running out of file descriptors, memory or /dev/shm is a property of the
candidate: fewer workers or a smaller queue may well work, so the tuner records it and goes on.
"""
from __future__ import annotations

import errno
import logging
import re
import traceback
from typing import Optional

from ..config import LoaderConfig
from ..errors import TrialTimeout, TuningError, warn_user
from ..loader.lost_worker import WORKER_DEATH
from ..results import TrialResult

log = logging.getLogger("autoloader.trial")

CONTROL = (KeyboardInterrupt, SystemExit, GeneratorExit)
"""What ends a candidate without being its failure: Ctrl-C, ``SystemExit`` and a closed generator, always re-raised
as they are."""
HARD_LIMIT_GRACE_S = 2.0
"""A trial is cut this long after its soft limit (checked after each batch), when a batch or a step never returns."""


_IN_WORKER = re.compile(r"Caught \w+ in DataLoader worker process \d+")
_TOO_MANY_FILES = ("Too many open files", "received 0 items of ancdata")
_SHM_FULL = ("No space left on device", "unable to write to file </torch_", "unable to allocate shared memory")


def failure_reason(exc: BaseException, *, workers: int = 0, stream: bool = False) -> Optional[str]:
    """Why a candidate failed, when ``exc`` is the candidate's fault; None when it is the user's own error.

    A dataset or step that raises is the user's bug and must surface unchanged. A worker killed (OOM killer, bus error
    from a full /dev/shm), a timeout, running out of file descriptors, memory or /dev/shm is a property of the
    candidate: fewer workers or a smaller queue may well work. With ``workers``, so is a connection to them that
    breaks (a worker killed after it sent batches resets it), and, for a ``stream`` (an IterableDataset), an error
    raised inside a worker: the tuner only gets there when fewer workers ran, and a stream split between workers
    fails with too many of them (WebDataset's "No samples found in dataset; perhaps you have fewer shards than
    workers").
    """
    message = str(exc).strip()
    lines = message.splitlines() or [type(exc).__name__]
    text = lines[-1] if message.startswith("Caught ") else lines[0]  # a worker's error: its last line says what
    if workers and stream and _IN_WORKER.match(message):
        return (f"raised in a worker with {workers} workers, not with fewer (an IterableDataset split between "
                f"workers may have fewer shards than workers): {type(exc).__name__}: {text}")
    if workers and isinstance(exc, (ConnectionError, EOFError)) and not message.startswith("Caught "):
        return f"worker died: its connection broke ({type(exc).__name__}: {text})"
    if isinstance(exc, TrialTimeout):
        return f"timed out: {text}"
    if isinstance(exc, MemoryError):
        return "out of memory (MemoryError)"
    if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
        return f"too many open files (raise `ulimit -n`): {text}"
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return f"out of memory starting workers: {text}"
    if not isinstance(exc, (RuntimeError, OSError)):
        return None
    if any(marker in message for marker in _TOO_MANY_FILES):
        return f"too many open files (raise `ulimit -n`): {text}"
    if not isinstance(exc, RuntimeError):
        return None
    if any(marker in message for marker in _SHM_FULL) and ("shm" in message or "/torch_" in message):
        return f"/dev/shm full (Docker: --shm-size): {text}"
    if WORKER_DEATH.search(message):
        if "Bus error" in message or "SIGBUS" in message:
            return f"worker crashed with a bus error, usually /dev/shm too small: {text}"
        if "Killed" in message:
            return f"worker killed (SIGKILL, usually the out-of-memory killer): {text}"
        return f"worker died: {text}"
    if message.startswith("DataLoader timed out"):
        return f"timed out: {text}"
    return None


def thread_failure_reason(exc: BaseException, *, threads: int) -> str:
    """Why a candidate fetching with ``threads`` threads per process failed with the user's own error, when the
    serial candidates before it did not: most likely ``__getitem__`` is not thread-safe. The tuner records it as the
    candidate's failure (and keeps no threads) when it chose to try threads; an error with ``threads=N`` fixed by the
    user surfaces unchanged."""
    message = str(exc).strip()
    lines = message.splitlines() or [type(exc).__name__]
    text = lines[-1] if message.startswith("Caught ") else lines[0]
    return (f"raised with {threads} threads per process, not without threads ({type(exc).__name__}: {text}): is "
            f"__getitem__ thread-safe? A file handle shared by all threads (e.g. one h5py.File opened in __init__) "
            f"is not; open one per thread (threading.local()) or leave threads=False")


def thread_failure(config: LoaderConfig, exc: BaseException) -> TrialResult:
    """The failed result of a thread candidate the tuner chose to try (``threads=True``) that raised the user's own
    error (``thread_failure_reason``), with a warning: the search goes on without threads."""
    reason = thread_failure_reason(exc, threads=config.threads)
    warn_user(f"autoloader tried threads and the dataset raised: {reason}; keeping a configuration without threads")
    return TrialResult(config=config, status="failed", reason=reason)


def classify(error: BaseException, config: LoaderConfig, *, user: bool, threads_tuned: bool, stream: bool = False,
             **measured: object) -> TrialResult:
    """The failed ``TrialResult`` of a candidate that raised ``error``, when it is the candidate's fault (``measured``:
    what it measured before, e.g. ``startup_s``); otherwise re-raise: Ctrl-C, ``SystemExit`` and a closed generator
    as they are, the user's own error unchanged (``user``: it came from the dataset, the collate_fn or the step),
    autoloader's own as a ``TuningError``. A thread candidate the tuner chose to try (``threads_tuned``) that raised
    the user's error failed (``thread_failure``): the search goes on without threads."""
    if isinstance(error, CONTROL):
        raise error
    reason = str(error) if isinstance(error, TuningError) else \
        failure_reason(error, workers=config.num_workers, stream=stream)
    if reason is None and threads_tuned and config.threads > 1 and isinstance(error, Exception):
        return thread_failure(config, error)
    if reason is None and user:
        raise error
    if reason is None:
        raise TuningError(f"candidate {config.label()} failed inside autoloader: {error!r}") from error
    log.info("candidate %s failed: %s", config.label(), reason)
    return TrialResult(config=config, status="failed", reason=reason, **measured)  # type: ignore[arg-type]


def forget(error: BaseException) -> None:
    """Drop the tracebacks of ``error`` and of every exception it was raised from or during: a candidate's failure
    kept from the loop (classified, logged) would otherwise hold the frames it passed through, and through their
    callers the epoch's runs and their workers, until a garbage collection (a worker killed while handing over a
    batch: torch's error chains the socket error raised deep in ``multiprocessing``)."""
    seen = set()
    pending: list = [error]
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
        pending += [exc.__cause__, exc.__context__]
