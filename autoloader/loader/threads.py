"""Threads inside each DataLoader process: ``ThreadedDataset`` fetches a batch's samples with a pool of threads.

A sample that waits (network, object storage, a slow disk, a decoder that releases the GIL) needs a thread, not a
process. Wrapped, a map-style dataset is fetched ``threads`` samples at a time in every process that loads it: the
main one with ``num_workers=0``, else each worker (torch's fetcher calls ``dataset.__getitems__(indices)``)::

    loader = DataLoader(with_threads(dataset, 8), batch_size=64, num_workers=2)   # 2 processes x 8 threads

Thread safety: ``__getitem__`` then runs in several threads at once, so it must be thread-safe. A file handle shared
by all threads (e.g. one ``h5py.File`` opened in ``__init__``) is not; open one per thread instead, e.g. in a
``threading.local()`` on first use. Reading numpy arrays or tensors, or opening a file per sample, is safe.

What the user sees through ``loader.dataset``: the wrapper, not their object.
- ``isinstance(loader.dataset, TheirClass)`` is False; ``unwrap(loader.dataset)`` gives their dataset (and returns any
  other dataset unchanged); the threads are in its ``repr`` and in ``loader.tuning.threads``.
- Every attribute that is not a dunder is read from, set on and deleted from their dataset (``loader.dataset.transform
  = t`` changes theirs); the wrapper has no public attribute of its own, so ``loader.dataset.dataset`` is their
  ``.dataset`` (a Subset's, say). ``len()``, ``[index]``, ``iter()`` and ``repr()`` behave as theirs (``repr`` adds
  the threads); ``pickle`` and ``copy`` copy the wrapper with their dataset and without the pool.

A dataset with its own ``__getitems__`` already fetches a batch its own way (one query for many keys, one slice of a
memory map) and may return any batch shape its ``collate_fn`` expects, so it is called as is, once per batch, without
threads (splitting it would change what it is asked for and what it returns); ``threads > 1`` then warns. torch's
``Subset`` (and so ``random_split``) only forwards ``__getitems__`` to its dataset's: it counts as what it ends in.

With ``make_loader(dataset, ..., threads=N)`` (or ``threads=True`` when the tuner chose more than one thread), every
DataLoader autoloader builds for a configuration iterates ``loader_dataset(dataset, config)``: so ``loader.dataset`` is
such a ``ThreadedDataset`` (``unwrap(loader.dataset) is dataset``), and with ``threads=1`` chosen (or ``threads=False``,
the default) it is the user's dataset itself. Online tuning decides during the first epoch: ``loader.dataset`` is the
user's dataset until the decision, then the wrapper if the decision uses threads.
"""
from __future__ import annotations

import logging
import numbers
import os
from typing import TYPE_CHECKING, Any, Sequence, Union

from torch.utils.data import Dataset, IterableDataset, Subset

from ..errors import warn_user
from .thread_pool import DaemonPool, pool_lock

if TYPE_CHECKING:
    from ..config import LoaderConfig

logger = logging.getLogger("autoloader.threads")

_OWN = frozenset({"_autoloader_dataset", "_autoloader_threads", "_autoloader_pool"})


class ThreadedDataset(Dataset):
    """A map-style dataset whose batches are fetched ``threads`` samples at a time in each process that loads it.

    A ``DataLoader`` over it calls ``__getitems__(indices)`` once per batch (torch >= 2.0), which maps your
    ``__getitem__`` over a pool of daemon threads made lazily in each process (the main one with ``num_workers=0``,
    else each worker, after fork or spawn; never pickled): for samples that wait (network, object storage, a slow
    disk, a decoder that releases the GIL), many in flight at the memory cost of threads, not processes. The batch
    keeps sampler order, and the first error in batch order is raised unchanged. ``make_loader(..., threads=...)``
    wraps your dataset in it; ``loader.dataset`` is then the wrapper: attribute reads and writes go to your dataset,
    ``len()``, ``[i]`` and ``iter()`` behave as yours, ``isinstance(loader.dataset, YourClass)`` is False and
    ``autoloader.unwrap(loader.dataset)`` gives yours back (NOTE [ Threads inside workers ] in loader/thread_pool.py).

    Thread safety is yours: ``__getitem__`` runs in several threads at once. Reading files you open per call,
    ``requests``/``boto3`` sessions per thread, PIL decoding, numpy on arrays you only read are safe; one ``h5py``
    file, ``lmdb`` transaction, ``sqlite3`` connection or file handle opened in ``__init__`` and shared by every
    call is not (open one per thread, e.g. in a ``threading.local()``). A dataset with its own ``__getitems__``
    fetches batches its own way: it is called as is, without threads, with a warning.

    Example:
        loader = DataLoader(ThreadedDataset(dataset, threads=8), batch_size=64, num_workers=2)  # 2 x 8 threads

    Args:
        dataset: A map-style dataset (with ``__getitem__``); a ``ThreadedDataset`` is unwrapped first.
        threads (int): Threads per process, an int >= 1 (1 fetches serially and makes no pool; ``with_threads``
            returns the dataset itself then).

    Raises:
        TypeError: ``threads`` is not an int, or ``dataset`` has no ``__getitem__``.
        ValueError: ``threads`` < 1, or ``dataset`` is an ``IterableDataset`` (its one ``__iter__`` cannot be split
            between threads: overlap its waiting inside ``__iter__``, or use more workers).
    """

    def __init__(self, dataset: Any, *, threads: int) -> None:
        threads = _check_threads(threads)
        dataset = unwrap(dataset)
        refuse_iterable(dataset)
        if not callable(getattr(type(dataset), "__getitem__", None)):
            raise TypeError(f"ThreadedDataset needs a map-style dataset (one with __getitem__), got "
                            f"{type(dataset).__name__}; wrap a torch.utils.data.Dataset")
        object.__setattr__(self, "_autoloader_dataset", dataset)
        object.__setattr__(self, "_autoloader_threads", threads)
        object.__setattr__(self, "_autoloader_pool", None)
        if threads > 1 and has_own_getitems(dataset):
            warn_user(f"threads={threads} has no effect: {type(dataset).__name__} defines __getitems__, which "
                      f"fetches each batch its own way and is called as is; drop __getitems__ to fetch its samples "
                      f"in threads, or use threads=1")

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        """The samples at ``indices``, fetched by this process's pool. Every sample is submitted, then the results are
        read in batch order, so the batch is in sampler order and the exception raised is the first failing sample's
        in batch order, even if a later one failed sooner; the samples not started yet are cancelled before it
        propagates (those running finish on their own)."""
        dataset = self._autoloader_dataset
        if has_own_getitems(dataset):
            return dataset.__getitems__(indices)
        if self._autoloader_threads == 1 or len(indices) <= 1:
            return [dataset[index] for index in indices]
        pool = _pool_of(self)
        futures = [pool.submit(dataset.__getitem__, index) for index in indices]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def __getitem__(self, index: Any) -> Any:
        return self._autoloader_dataset[index]

    def __len__(self) -> int:
        return len(self._autoloader_dataset)

    def __iter__(self) -> Any:
        return iter(self._autoloader_dataset)

    def __getattr__(self, name: str) -> Any:
        # Reached only when normal lookup fails. While unpickling or copying, __dict__ is still empty: read it
        # directly (never through self.<name>, which would come back here), and never forward dunders that copy and
        # pickle probe on the instance (__deepcopy__ etc.): the user's would copy their dataset, not the wrapper.
        dataset = self.__dict__.get("_autoloader_dataset")
        if dataset is None or name in _OWN or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._autoloader_dataset, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._autoloader_dataset, name)

    def __dir__(self) -> list:
        return sorted(set(dir(type(self))) | set(dir(self._autoloader_dataset)))

    def __repr__(self) -> str:
        return f"ThreadedDataset({self._autoloader_dataset!r}, threads={self._autoloader_threads})"

    def __getstate__(self) -> dict:
        return {"dataset": self._autoloader_dataset, "threads": self._autoloader_threads}

    def __setstate__(self, state: dict) -> None:
        object.__setattr__(self, "_autoloader_dataset", state["dataset"])
        object.__setattr__(self, "_autoloader_threads", state["threads"])
        object.__setattr__(self, "_autoloader_pool", None)


def _pool_of(wrapper: ThreadedDataset) -> DaemonPool:
    """The wrapper's pool in this process, made on first use here (see NOTE [ Threads inside workers ])."""
    with pool_lock():
        pool = wrapper._autoloader_pool
        if pool is None or pool.pid != os.getpid():
            pool = DaemonPool(wrapper._autoloader_threads)
            object.__setattr__(wrapper, "_autoloader_pool", pool)
            logger.debug("process %d: %d threads for %s", pool.pid, wrapper._autoloader_threads,
                         type(wrapper._autoloader_dataset).__name__)
    return pool


def refuse_iterable(dataset: Any) -> None:
    """Raise the ``ValueError`` that says what to do instead when ``dataset`` is an IterableDataset."""
    if isinstance(dataset, IterableDataset):
        raise ValueError(
            f"threads are for map-style datasets; {type(dataset).__name__} is an IterableDataset, whose samples "
            f"come from one __iter__ that threads cannot split. Overlap the waiting inside its own __iter__ (e.g. "
            f"a concurrent.futures.ThreadPoolExecutor's map over what it reads) or use more DataLoader workers "
            f"(num_workers), and leave threads off (threads=False)")


def loader_dataset(dataset: Any, config: "LoaderConfig") -> Any:
    """The dataset a DataLoader built for ``config`` iterates: the one rule every loader autoloader builds follows
    (trials, online candidates, the returned loader). ``config.threads == 1``: ``dataset`` itself; more: a
    ``ThreadedDataset`` of the user's dataset with that many threads (rewrapped, never wrapped twice)."""
    if config.threads == 1:
        return dataset
    return with_threads(dataset, config.threads)


def fixed_threads(mode: Union[bool, int]) -> int:
    """Threads per process of every candidate for ``threads=`` as ``check_threads`` normalised it: the user's N when
    they fixed it, else 1 (False: none; True: the process-only candidates, before the tuner tries threads)."""
    return 1 if isinstance(mode, bool) else int(mode)


def with_threads(dataset: Any, threads: int) -> Any:
    """``dataset`` fetched ``threads`` samples at a time in each process that loads it.

    Args:
        dataset: A map-style dataset, or a ``ThreadedDataset`` (rewrapped, never wrapped twice).
        threads (int): Threads per process, an int >= 1.

    Returns:
        Dataset: A ``ThreadedDataset`` of your dataset, or your dataset itself (unwrapped if it was one) when
        ``threads == 1``.

    Raises:
        TypeError: ``threads`` is not an int, or ``dataset`` has no ``__getitem__``.
        ValueError: ``threads`` < 1, or ``dataset`` is an ``IterableDataset``.
    """
    if _check_threads(threads) == 1:
        return unwrap(dataset)
    return ThreadedDataset(dataset, threads=threads)


def unwrap(dataset: Any) -> Any:
    """Your dataset, whether or not it is wrapped for threads (e.g. ``unwrap(loader.dataset)``).

    Args:
        dataset: A ``ThreadedDataset`` or any other dataset.

    Returns:
        Dataset: The dataset inside a ``ThreadedDataset``; any other dataset unchanged.
    """
    return dataset._autoloader_dataset if isinstance(dataset, ThreadedDataset) else dataset


def threads_of(dataset: Any) -> int:
    """Threads per process a ``ThreadedDataset`` was made with; 1 for any other dataset."""
    return dataset._autoloader_threads if isinstance(dataset, ThreadedDataset) else 1


def has_own_getitems(dataset: Any) -> bool:
    """True when ``dataset`` fetches batches with its own ``__getitems__`` (a ``Subset`` counts as what it ends in)."""
    while getattr(type(dataset), "__getitems__", None) is Subset.__getitems__ \
            and type(dataset).__getitem__ is Subset.__getitem__:
        dataset = dataset.dataset
    return callable(getattr(dataset, "__getitems__", None))


def _check_threads(threads: Any) -> int:
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        raise TypeError(f"threads must be an int >= 1 (threads per process fetching a batch's samples), got "
                        f"{threads!r} ({type(threads).__name__}); pass e.g. threads=8, or threads=1 for none")
    if threads < 1:
        raise ValueError(f"threads must be >= 1 (threads per process fetching a batch's samples), got {threads}; "
                         f"pass threads=1 to fetch serially, or e.g. threads=8")
    return int(threads)
