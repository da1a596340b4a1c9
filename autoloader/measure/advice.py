"""What a trial reveals about the user's dataset that the user should fix, as pure decisions, and how it is told.

Two mistakes show up only once workers run, and both cost silently rather than fail:
- an ``IterableDataset`` that is not sharded per worker: every worker yields the whole stream, so each sample arrives
  ``num_workers`` times per epoch (see ``RepeatCheck``);
- copy-on-read: a dataset holding Python objects (a list of ints, dicts, strings) that forked workers copy page by
  page as they read them (see NOTE [ Copy-on-read ]).
``run_trial`` measures, these functions decide, and ``warn_once`` tells the user once per dataset object
(``warn_user`` points any autoloader warning at the user's own line).

# NOTE [ Copy-on-read ]
# A forked worker shares the parent's memory until it writes to a page. CPython writes the reference count of every
# object it reads, so a worker that reads a list of N Python objects ends up with a private copy of every page those
# objects live on: each worker's private memory (USS) grows towards the size of the objects, and with N workers the
# dataset is held N + 1 times (PyTorch issue 13246, "memory leak" reports whose RSS grows every epoch). numpy arrays
# and tensors hold their elements in one buffer with one reference count, so reading them copies nothing.
# A trial sees it as USS growth between the first batch and the end of the trial. A healthy worker is flat there
# (measured: 1-3 MiB, allocator noise and the batch being built); so growth is flagged only when it is all of
# - at least 32 MiB: far above that noise, yet reached by a few hundred thousand objects read in a short trial;
# - at least a quarter of the worker's USS at the end: for a worker that legitimately holds gigabytes (a decoder's
#   buffers) tens of MiB of churn are noise, while a copy-on-read worker's USS is mostly the growth;
# - more than the batches a worker holds (``LoaderConfig.worker_batches`` x batch bytes): batches built in shared
#   memory count as the worker's own until the main process maps them, so big batches alone move USS by that much.
# The trial sees only part of an epoch, so the growth it measures is a lower bound of what an epoch costs. A full
# collection in a worker copies pages too (the collector writes to every tracked object it scans, the inherited ones
# included): ``gc.freeze()`` in the parent before the workers start moves them out of its reach.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Set

import torch

from ..loader.batch import iter_tensors, map_tensors
from ..errors import warn_user
from ..results import TrialResult

COPY_ON_READ_MIN_BYTES = 32 * 2**20
COPY_ON_READ_MIN_SHARE = 0.25

_warned: "weakref.WeakKeyDictionary[object, Set[str]]" = weakref.WeakKeyDictionary()
_warned_ids: Set[tuple] = set()


def copy_on_read_advice(trial: TrialResult, *, dataset_name: str = "the dataset") -> Optional[str]:
    """The warning text when ``trial``'s workers grew as copy-on-read makes them grow, else None (see NOTE
    [ Copy-on-read ]). Pure: reads only the trial's measurements."""
    growth, uss = trial.worker_uss_growth_bytes, trial.worker_uss_bytes
    if trial.config.num_workers == 0 or growth is None or uss is None:
        return None
    in_flight = trial.config.worker_batches() * (trial.batch_bytes or 0)
    if growth < max(COPY_ON_READ_MIN_BYTES, COPY_ON_READ_MIN_SHARE * uss, in_flight):
        return None
    return (
        f"each DataLoader worker's private memory grew by {growth / 2**20:.0f} MiB during a "
        f"{trial.elapsed_s:.1f} s trial (to {uss / 2**20:.0f} MiB): forked workers are copying Python objects they "
        f"inherited, most likely {dataset_name}'s (a list of ints, dicts or strings), because reading an object "
        f"writes its reference count (PyTorch issue 13246); the garbage collector scanning the parent's objects in a "
        f"worker does the same. Over an epoch each of the {trial.config.num_workers} workers can grow to the size of "
        f"those objects. Store the data in numpy arrays or tensors instead (e.g. one np.array of values, or of "
        f"offsets into one bytes buffer, rather than a list of objects), and call gc.freeze() before the loader "
        f"starts its workers so their collector leaves the inherited objects alone; a per-worker cache that fills up "
        f"looks the same and needs the same fix"
    )


def same_batches(a: Any, b: Any) -> bool:
    """True when two batches hold tensors of identical shapes and values (and at least one tensor)."""
    left, right = list(iter_tensors(a)), list(iter_tensors(b))
    if not left or len(left) != len(right):
        return False
    return all(x.dtype == y.dtype and x.device == y.device and torch.equal(x, y) for x, y in zip(left, right))


class RepeatCheck:
    """Spots an IterableDataset whose workers all yield the same stream, from the batches of a trial in order.

    Batches come round-robin from workers 0, 1, ...: batch 0 is worker 0's first and batch 1 worker 1's first. They
    are equal in a stream every worker repeats; a later batch that differs from batch 0 (worker 0's second, batch
    ``num_workers``, comes before ``horizon``) rules out data that is merely constant.
    """

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.seen = 0
        self.first: Any = None
        self.suspect = False
        self.repeated = False

    def see(self, batch: Any) -> None:
        if self.seen >= self.horizon or (self.seen >= 2 and not self.suspect):
            self.first = None
            return
        if self.seen == 0:
            self.first = map_tensors(torch.Tensor.clone, batch)
        elif self.seen == 1:
            self.suspect = same_batches(self.first, batch)
        elif not same_batches(self.first, batch):
            self.repeated, self.suspect, self.first = True, False, None
        self.seen += 1


def repeated_stream_advice(dataset: object, num_workers: int) -> str:
    name = type(dataset).__name__
    return (
        f"IterableDataset {name} yields the same data in every DataLoader worker: worker 0's first batch equals "
        f"worker 1's, so with num_workers={num_workers} each sample would be loaded {num_workers} times per epoch. "
        f"Shard the stream in {name}.__iter__ with torch.utils.data.get_worker_info(): e.g. "
        f"`info = get_worker_info(); if info is not None: items = itertools.islice(items, info.id, None, "
        f"info.num_workers)`, or split the files by info.id (see the IterableDataset docs), or use num_workers=0"
    )


def warn_once(dataset: object, kind: str, message: str) -> None:
    """``warn_user(message)`` once per dataset object and ``kind`` (an object that cannot be weakly referenced is
    remembered by ``id``)."""
    try:
        kinds = _warned.setdefault(dataset, set())
    except TypeError:
        key = (id(dataset), kind)
        if key in _warned_ids:
            return
        _warned_ids.add(key)
    else:
        if kind in kinds:
            return
        kinds.add(kind)
    warn_user(message)
