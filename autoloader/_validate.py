"""Checks of what users pass to ``make_loader``/``tune``: each error names the argument, its value and the fix."""
from __future__ import annotations

import inspect
import multiprocessing
import multiprocessing.context
import numbers
import os
from typing import Any, Mapping, Optional, Union

from torch.utils.data import DataLoader, IterableDataset, IterDataPipe

from .consumer import check_step
from .config import BY_NAME, check_knobs
from .errors import warn_user
from .loader.threads import ThreadedDataset, has_own_getitems, refuse_iterable

_DATALOADER_ARGS = frozenset(inspect.signature(DataLoader.__init__).parameters) - {"self", "dataset"}
_OURS = frozenset({"batch_size", "shuffle"})


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_batch_size(batch_size: Any) -> None:
    """An int >= 1, or None (no automatic batching: the dataset yields ready batches); a ``ValueError`` otherwise,
    whose message starts with the one DataLoader's ``BatchSampler`` raises."""
    if batch_size is None:
        return
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}: pass a "
                         f"positive int such as batch_size=32, or None when the dataset yields ready batches")


def check_budget(budget: Any) -> None:
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"budget must be a number of seconds such as budget=30, got {budget!r}")
    if not float(budget) > 0:
        raise ValueError(f"budget={budget!r} must be > 0 seconds; pass num_workers=... to skip tuning instead")


def check_max_workers(max_workers: Any) -> None:
    if max_workers is None:
        return
    if not _is_int(max_workers):
        raise TypeError(f"max_workers must be an int >= 0 or None, got {max_workers!r}")
    if max_workers < 0:
        raise ValueError(f"max_workers={max_workers} must be >= 0 (0 means no worker processes)")


def check_memory_budget(memory_budget: Any) -> Union[None, int, float]:
    """``memory_budget=`` of ``make_loader``/``tune``: None (the default share of the memory available to this
    process), bytes as an int >= 1, or a fraction in (0, 1] of that memory (NOTE [ Memory budget ] in
    search/memory.py). Returns it as an int or a float."""
    if memory_budget is None:
        return None
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Real):
        raise TypeError(f"memory_budget must be bytes (an int such as memory_budget=8 * 2**30) or a fraction of the "
                        f"available memory (a float in (0, 1] such as memory_budget=0.5), got {memory_budget!r} "
                        f"({type(memory_budget).__name__})")
    if isinstance(memory_budget, numbers.Integral):  # an int (a bool was refused above)
        if memory_budget < 1:
            raise ValueError(f"memory_budget={memory_budget} must be >= 1 byte (e.g. memory_budget=8 * 2**30), or a "
                             f"fraction such as memory_budget=0.5; leave it out for the default")
        return int(memory_budget)
    value = float(memory_budget)
    if not 0 < value <= 1:
        whole = int(value) if 1 <= value < float("inf") else 8
        raise ValueError(f"memory_budget={memory_budget!r} must be a fraction in (0, 1] of the available memory (e.g. "
                         f"memory_budget=0.5) or whole bytes as an int (e.g. memory_budget={whole}"
                         f"{' * 2**30' if whole < 2**20 else ''})")
    return value


def check_dataset(dataset: Any) -> None:
    """What no DataLoader can load, reading nothing of ``dataset`` (not even ``len()``: NOTE [ Nothing before
    iter() ] in loader/lazy.py)."""
    if isinstance(dataset, IterableDataset):
        return
    if not hasattr(dataset, "__getitem__"):
        raise TypeError(f"dataset must be a torch.utils.data.Dataset (with __getitem__ and __len__) or an "
                        f"IterableDataset, got {type(dataset).__name__}")
    if not hasattr(dataset, "__len__"):
        raise TypeError(f"dataset {type(dataset).__name__} has no __len__; map-style datasets need one "
                        f"(or make it an IterableDataset)")


def check_loader_kwargs(dataset: Any, *, batch_size: Optional[int], shuffle: Any,
                        kwargs: Mapping[str, Any]) -> Optional[bool]:
    """The DataLoader's own rules, checked before any trial, each raised with the exception type DataLoader raises and
    a message that starts with DataLoader's own words and then names the fix (``dataloader_rules``); then the knob
    table's stricter ones (``config.check_knobs``). Returns ``shuffle`` as DataLoader reads it: a bool, or, for an
    ``IterDataPipe``, None when unset (its shufflers are then left as they are; True or False turns them on or
    off)."""
    unknown = sorted(set(kwargs) - _DATALOADER_ARGS - _OURS)
    if unknown:
        raise TypeError(f"make_loader got unexpected keyword argument(s) {unknown}: every keyword other than "
                        f"make_loader's own must be a torch.utils.data.DataLoader argument")
    shuffle = dataloader_rules(dataset, batch_size=batch_size, shuffle=shuffle, kwargs=kwargs)
    check_knobs({k: v for k, v in kwargs.items() if k in BY_NAME}, hint="; leave it out to let autoloader tune it")
    return shuffle


_TUNE_IT = "leave it out to let autoloader tune it"


def _worker_rules(kwargs: Mapping[str, Any]) -> None:
    """DataLoader's checks of the worker keywords, in its order and words (torch 2.13, ``DataLoader.__init__`` and
    its ``multiprocessing_context`` setter). Without ``num_workers`` autoloader picks the workers, so the keywords
    that need some are kept for when it does (README "Use it")."""
    given, timeout = kwargs.get("num_workers"), kwargs.get("timeout", 0)
    workers = given if isinstance(given, int) and not isinstance(given, bool) else None  # a wrong type: check_knobs
    fixed = workers is not None
    if workers is not None and workers < 0:
        raise ValueError(f"num_workers option should be non-negative; use num_workers=0 to disable multiprocessing. "
                         f"Got num_workers={workers}: pass an int >= 0, or {_TUNE_IT}")
    if isinstance(timeout, numbers.Real) and timeout < 0:
        raise ValueError(f"timeout option should be non-negative: got timeout={timeout!r}, pass a number of seconds "
                         f">= 0 (0 waits for ever)")
    prefetch = kwargs.get("prefetch_factor")
    if fixed and workers == 0 and prefetch is not None:
        raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to "
                         "enable multiprocessing, otherwise set prefetch_factor to None. Drop prefetch_factor, or set "
                         "num_workers > 0 (or leave num_workers out to let autoloader pick the workers)")
    if isinstance(prefetch, int) and prefetch < 0:  # a bool is never negative
        raise ValueError(f"prefetch_factor option should be non-negative: got prefetch_factor={prefetch}, pass an "
                         f"int >= 1, or {_TUNE_IT}")
    if fixed and workers == 0 and kwargs.get("persistent_workers"):
        raise ValueError("persistent_workers option needs num_workers > 0: drop persistent_workers, or set "
                         "num_workers > 0 (or leave num_workers out to let autoloader pick the workers)")
    context = kwargs.get("multiprocessing_context")
    if context is None:
        return
    if fixed and workers == 0:
        raise ValueError(f"multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
                         f"but got num_workers={workers}: drop multiprocessing_context, or set num_workers > 0 (or "
                         f"leave num_workers out to let autoloader pick the workers)")
    methods = multiprocessing.get_all_start_methods()
    if isinstance(context, str) and context not in methods:
        raise ValueError(f"multiprocessing_context option should specify a valid start method in {methods!r}, but "
                         f"got multiprocessing_context={context!r}: pass one of them, or a multiprocessing context")
    if not isinstance(context, (str, multiprocessing.context.BaseContext)):
        raise TypeError(f"multiprocessing_context option should be a valid context object or a string specifying the "
                        f"start method, but got multiprocessing_context={context}: pass one of {methods!r}, or "
                        f"multiprocessing.get_context(...)")


def dataloader_rules(dataset: Any, *, batch_size: Optional[int], shuffle: Any,
                     kwargs: Mapping[str, Any]) -> Optional[bool]:
    """What ``DataLoader(dataset, batch_size, shuffle, **kwargs)`` refuses, in its order: the exception DataLoader
    raises, its message starting with DataLoader's own text (so a test written against DataLoader's message passes),
    then the fix. Returns ``shuffle`` as DataLoader reads it (``check_loader_kwargs``)."""
    _worker_rules(kwargs)
    sampler, batch_sampler, drop_last = kwargs.get("sampler"), kwargs.get("batch_sampler"), kwargs.get("drop_last")
    if isinstance(dataset, IterableDataset):
        shuffle = _iterable_shuffle(dataset, shuffle)
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} option, but got "
                                 f"{name}={value}: an IterableDataset decides its own order; drop {name} (shuffle "
                                 f"or batch inside the dataset's __iter__ instead)")
    else:
        shuffle = bool(shuffle)
    if shuffle and sampler is not None:
        raise ValueError("sampler option is mutually exclusive with shuffle: the sampler decides the order. Use "
                         "shuffle=False, or a shuffling sampler such as RandomSampler")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                             "drop_last: the batch sampler decides the batches; leave batch_size=1, shuffle=False, "
                             "sampler=None and drop_last=False")
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last: the "
                         "dataset yields ready batches, so there is no last batch to drop; leave drop_last=False, or "
                         "pass a batch_size")
    elif batch_size is not None and "drop_last" in kwargs and not isinstance(drop_last, bool):
        raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}: pass True or False")
    return shuffle


def _iterable_shuffle(dataset: Any, shuffle: Any) -> Optional[bool]:
    """An IterableDataset's ``shuffle``: an ``IterDataPipe``'s as given (DataLoader turns its shufflers on or off),
    else unset (None or False), a ValueError otherwise."""
    if isinstance(dataset, IterDataPipe):
        return None if shuffle is None else bool(shuffle)
    if shuffle is not None and shuffle is not False and shuffle != 0:
        raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                         f"shuffle={shuffle}: an IterableDataset decides its own order; leave shuffle unset and "
                         f"shuffle inside the dataset's __iter__ (e.g. a shuffle buffer), or use a DataPipe with a "
                         f"shuffler")
    return False


def check_tuning_arguments(*, batch_size: Any, step: Any, budget: Any, max_workers: Any) -> None:
    """What ``tune`` and ``make_loader`` share."""
    check_batch_size(batch_size)
    check_step(step)
    check_budget(budget)
    check_max_workers(max_workers)


def check_threads(threads: Any, dataset: Any) -> Union[bool, int]:
    """``threads=`` of ``make_loader``/``tune``, normalised: False (none: also for ``threads=1``), True (the tuner
    chooses threads per process) or an int >= 2 (every candidate fetches with that many threads per process).

    Raises ``TypeError``/``ValueError`` naming the fix, and the ``ValueError`` of ``threads.refuse_iterable`` for an
    IterableDataset. A dataset with its own ``__getitems__`` fetches batches its own way, without threads: it warns
    and gets False.
    """
    if threads is True or threads is False:
        mode: Union[bool, int] = threads
    elif _is_int(threads):
        if threads < 1:
            raise ValueError(f"threads={threads} must be >= 1 (threads per process); pass threads=False for none, "
                             f"threads=True to let autoloader choose, or e.g. threads=8")
        mode = False if threads == 1 else int(threads)
    else:
        raise TypeError(f"threads must be False (none), True (autoloader chooses threads per process) or an int >= 1 "
                        f"(threads per process), got {threads!r} ({type(threads).__name__}); e.g. threads=True")
    if mode is False:
        return False
    refuse_iterable(dataset)
    if isinstance(dataset, ThreadedDataset):
        raise ValueError(f"dataset is already a ThreadedDataset ({dataset!r}) and threads={threads!r} would choose "
                         f"the threads again: pass the dataset itself (autoloader.threads.unwrap(dataset)) with "
                         f"threads=..., or keep the ThreadedDataset with threads=False")
    if has_own_getitems(dataset):
        warn_user(f"threads={threads!r} has no effect: {type(dataset).__name__} defines __getitems__, which fetches "
                  f"each batch its own way and is called as is; drop __getitems__ to fetch its samples in threads, "
                  f"or leave threads=False")
        return False
    return mode


def check_native_threads(native_threads: Any) -> Union[None, bool, int]:
    """``native_threads=`` of ``make_loader``/``tune``: None (autoloader limits each worker's native pools to its share
    of the CPUs, and measures without the limit when they are in use), False (never touched) or an int >= 1 (every
    worker's pools limited to that many threads, never tuned). Raises ``TypeError``/``ValueError`` naming the fix."""
    if native_threads is None or native_threads is False:
        return native_threads
    if native_threads is True:
        raise ValueError("native_threads=True is not a setting: leave it out (None) to let autoloader limit each "
                         "worker's native thread pools and measure whether the limit pays, pass an int such as "
                         "native_threads=1 to fix the limit, or native_threads=False to leave the pools alone")
    if not _is_int(native_threads):
        raise TypeError(f"native_threads must be None (autoloader decides), False (pools left alone) or an int >= 1 "
                        f"(threads per worker for numpy's BLAS, OpenMP, OpenCV, numexpr), got {native_threads!r} "
                        f"({type(native_threads).__name__})")
    if native_threads < 1:
        raise ValueError(f"native_threads={native_threads} must be >= 1 (threads each worker's native pools keep): "
                         f"native_threads=1 for single-threaded workers, or native_threads=False to leave the pools "
                         f"alone")
    return int(native_threads)


def check_common(*, batch_size: Any, step: Any, budget: Any, max_workers: Any, key: Any, cache: Any) -> None:
    check_tuning_arguments(batch_size=batch_size, step=step, budget=budget, max_workers=max_workers)
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a str naming the dataset for the cache (e.g. key='imagenet-train'), "
                        f"got {type(key).__name__}")
    if not isinstance(cache, (bool, str, os.PathLike)):
        raise TypeError(f"cache must be True (default location), False (no cache) or a directory path, got {cache!r}")


class _Discard:
    """A file that drops what is written: pickling to it checks picklability without holding a copy of the bytes."""

    def write(self, data: bytes) -> int:
        return len(data)


def _pickle_error(obj: Any) -> Optional[BaseException]:
    import pickle

    try:
        pickle.Pickler(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError, ValueError) as err:
        return err
    return None


def _culprit(name: str, obj: Any, depth: int = 3) -> str:
    """The attribute path inside ``obj`` that cannot be pickled (``dataset.transform``), as deep as ``depth``."""
    attrs = getattr(obj, "__dict__", None)
    if depth == 0 or not isinstance(attrs, dict):
        return name
    for key, value in attrs.items():
        if _pickle_error(value) is not None:
            return _culprit(f"{name}.{key}", value, depth - 1)
    return name


def check_picklable(*, start_method: str, objects: Mapping[str, Any]) -> None:
    """Under spawn/forkserver every worker unpickles the dataset, collate_fn and worker_init_fn; fail before any
    worker starts, naming the object (and the attribute inside it), rather than in a worker with a traceback about
    pickling."""
    if start_method == "fork":
        return
    for name, obj in objects.items():
        if obj is None:
            continue
        err = _pickle_error(obj)
        if err is None:
            continue
        raise ValueError(
            f"{_culprit(name, obj)} cannot be pickled ({type(err).__name__}: {err}), and the '{start_method}' start "
            f"method sends {name} to every DataLoader worker. Define it at module level (not a lambda or a local "
            f"function or class), or pass multiprocessing_context='fork' (Linux), or num_workers=0"
        ) from err


ENGINES = ("dataloader", "ray")
_RAY_REFUSED = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "worker_init_fn",
                "multiprocessing_context", "in_order")
"""DataLoader keywords about worker processes, which ``engine="ray"`` has none of (Ray's tasks load)."""


def check_engine(engine: Any, address: Any) -> None:
    """``engine=`` and ``address=`` of ``make_loader``: a known engine, an address only with Ray."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} must be one of {ENGINES}: 'dataloader' (worker processes on this "
                         f"machine) or 'ray' (Ray Data tasks, on this machine or a cluster: the ray extra, "
                         f"pip install \".[ray]\" in a checkout)")
    if address is not None and not isinstance(address, str):
        raise TypeError(f"address must be a Ray cluster address such as address='10.0.0.1:6379' (or 'auto'), or "
                        f"None, got {address!r}")
    if address is not None and engine != "ray":
        raise ValueError(f"address={address!r} names a Ray cluster: pass engine='ray' with it, or drop address")


def check_ray_arguments(arguments: Mapping[str, Any]) -> None:
    """What ``engine="ray"`` cannot take, each refused with the fix: online tuning, threads and native thread
    limits, a memory budget, an IterableDataset, and the DataLoader keywords about worker processes."""
    if not isinstance(arguments["refresh"], bool):
        raise TypeError(f"refresh must be True or False, got {arguments['refresh']!r}")
    if isinstance(arguments["dataset"], IterableDataset):
        raise ValueError("engine='ray' loads a map-style dataset by index (autoloader keeps the order); an "
                         "IterableDataset decides its own: use engine='dataloader', or Ray Data's own readers")
    if arguments["tuning"] == "online":
        raise ValueError("engine='ray' tunes with trials before training: use tuning='trials' (or 'auto')")
    for name, default in (("threads", False), ("native_threads", None), ("memory_budget", None)):
        if arguments[name] is not default and arguments[name] != default:
            raise ValueError(f"{name}={arguments[name]!r} applies to DataLoader workers; engine='ray' loads in Ray's "
                             f"tasks: leave {name} out")
    refused = sorted(set(arguments["dataloader_kwargs"]) & set(_RAY_REFUSED))
    if refused:
        raise ValueError(f"{', '.join(refused)} configure DataLoader worker processes; engine='ray' loads in Ray "
                         f"tasks, which it sizes itself (max_workers= caps the tasks): leave {', '.join(refused)} out")
