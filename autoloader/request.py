"""``make_loader``'s arguments, checked once (``Request.checked``), and the DataLoader they make for a configuration
(``Request.data_loader``: the arguments of every DataLoader autoloader tunes or serves: the returned loader, trials
and online slices; ``loader.build`` constructs it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

import torch
from torch.utils.data import DataLoader, IterableDataset

from . import distributed as _distributed
from ._validate import (check_common, check_dataset, check_loader_kwargs, check_memory_budget,
                        check_native_threads, check_picklable, check_threads)
from .config import BY_NAME, USER_KNOBS, LoaderConfig, without_worker_only
from .loader.build import build
from .loader.device import resolve_device
from .loader.native import worker_init
from .loader.threads import fixed_threads, loader_dataset
from .consumer import Step
from .probe import start_method

SAMPLING = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
"""The DataLoader arguments that decide an epoch's batches: ``data_loader(sampling=...)`` replaces them together."""


@dataclass(frozen=True)
class Request:
    """``make_loader``'s arguments, checked: the knobs the user fixed apart from the other DataLoader keywords, and
    the data sharded across ranks when training is distributed."""

    dataset: Any
    batch_size: int
    """Samples per batch for every measure (1 with a ``batch_sampler`` or ``batch_size=None``); what DataLoaders get
    is ``loader_batch_size``."""
    shuffle: Optional[bool]
    """As DataLoader reads it: a bool, or None for an ``IterDataPipe`` whose shufflers are left as they are."""
    step: Step
    device: torch.device
    transform: Dict[str, Any]
    budget: Optional[float]
    max_workers: Optional[int]
    key: Optional[str]
    loader_kwargs: Dict[str, Any]
    fixed: Dict[str, Any]
    group: Optional[_distributed.Group] = field(default=None, compare=False)
    unsharded: bool = False
    """A map-style dataset with no sampler of the user's, loaded by one process because torch.distributed was not
    initialised (yet): iterating it later under a group of several processes is a mistake PrefetchLoader reports."""
    threads: Union[bool, int] = False
    """As ``check_threads`` returns it: False, True (tuned) or an int >= 2 (fixed)."""
    memory_budget: Union[None, int, float] = None
    """As ``check_memory_budget`` returns it: None (default), bytes or a fraction;
    ``search.memory.resolve_budget`` makes it the budget."""
    native_threads: Union[None, bool, int] = None
    """As ``check_native_threads`` returns it: None (autoloader decides), False (never touched) or an int >= 1
    (fixed): the limit of each worker's native thread pools (NOTE [ Native thread pools ] in loader/native.py)."""
    auto_batch: bool = True
    """False for ``batch_size=None``: no automatic batching, each item the dataset yields is a batch."""

    @property
    def loader_batch_size(self) -> Optional[int]:
        """The ``batch_size`` a DataLoader gets: None without automatic batching."""
        return self.batch_size if self.auto_batch else None

    @property
    def fixed_threads(self) -> int:
        """Threads per process of every candidate when the user fixed them, else 1."""
        return fixed_threads(self.threads)

    def setting(self, name: str) -> Any:
        """The user's value of a DataLoader argument, whether autoloader records it (``fixed``) or not."""
        return self.fixed.get(name, self.loader_kwargs.get(name))

    @property
    def streaming(self) -> bool:
        return isinstance(self.dataset, IterableDataset)

    @classmethod
    def checked(cls, dataset: Any, batch_size: Any = 1, *, shuffle: Any = None, step: Any = None,
                device: Any = None, normalize: Any = None, dtype: Any = None, input_key: Any = None,
                cache: Any = False, budget: Any = None, max_workers: Any = None, key: Any = None,
                distributed: Any = False, threads: Any = False, memory_budget: Any = None,
                native_threads: Any = None, dataloader_kwargs: Optional[Dict[str, Any]] = None) -> "Request":
        """Check every argument (each error names the fix) and split the knobs the user fixed from the rest;
        ``distributed=None`` follows ``torch.distributed.is_initialized()`` and shards the data."""
        dataloader_kwargs = dict(dataloader_kwargs or {})
        for flag in ("pin_memory", "persistent_workers"):  # DataLoader reads any value as a flag
            if flag in dataloader_kwargs:
                dataloader_kwargs[flag] = bool(dataloader_kwargs[flag])
        check_common(batch_size=batch_size, step=step, budget=budget, max_workers=max_workers, key=key, cache=cache)
        check_dataset(dataset)
        threads = check_threads(threads, dataset)
        memory_budget = check_memory_budget(memory_budget)
        native_threads = check_native_threads(native_threads)
        shuffle = check_loader_kwargs(dataset, batch_size=batch_size, shuffle=shuffle, kwargs=dataloader_kwargs)
        kwargs = dict(dataloader_kwargs)
        fixed = {k: BY_NAME[k].recorded_value(kwargs.pop(k)) for k in USER_KNOBS if k in kwargs}
        group = _distributed.Group.current(distributed)
        if group is not None:
            kwargs, shuffle = group.shard(dataset, batch_size=batch_size, shuffle=shuffle,
                                          drop_last=kwargs.get("drop_last", False), loader_kwargs=kwargs)
        if fixed.get("num_workers", 1) > 0 and (max_workers is None or max_workers > 0):
            context = fixed.get("multiprocessing_context", kwargs.get("multiprocessing_context"))
            check_picklable(start_method=start_method(context) or "fork",
                            objects={"dataset": dataset, "collate_fn": kwargs.get("collate_fn"),
                                     "worker_init_fn": kwargs.get("worker_init_fn")})
        unsharded = (distributed is None and group is None and not isinstance(dataset, IterableDataset)
                     and kwargs.get("sampler") is None and kwargs.get("batch_sampler") is None)
        return cls(dataset, 1 if batch_size is None else batch_size, shuffle, step, resolve_device(device),
                   dict(normalize=normalize, dtype=dtype, input_key=input_key), budget, max_workers, key, kwargs,
                   fixed, group, unsharded, threads, memory_budget, native_threads, auto_batch=batch_size is not None)

    def data_loader(self, config: LoaderConfig, *, sampling: Optional[Mapping[str, Any]] = None,
                    measured: bool = False, **forced: Any) -> DataLoader:
        """The user's DataLoader with ``config``'s knobs (theirs where they fixed one) over ``loader_dataset``.

        ``sampling`` replaces the user's ``SAMPLING`` arguments (a trial's endless sampler, an online slice);
        ``forced`` overrides anything (a private generator, ``in_order``, no persistent workers for a trial). The
        knobs that need workers are dropped from a configuration without them (``config.KNOBS``). With workers, the
        ``worker_init_fn`` limits their native thread pools to ``config.native_threads`` before the user's own runs
        (``native.worker_init``); ``measured``: they report the pools they found (``native.worker_pools``)."""
        user = dict(self.loader_kwargs)
        if sampling is None:
            sampling = {"batch_size": self.loader_batch_size, "shuffle": self.shuffle}
        else:
            user = {k: v for k, v in user.items() if k not in SAMPLING}
        kwargs = {**user, **sampling, **config.loader_kwargs(), **self.fixed, **forced}
        if kwargs.get("num_workers", 0) == 0:
            kwargs = without_worker_only(kwargs)
        else:
            kwargs["worker_init_fn"] = worker_init(config.native_threads, kwargs.get("worker_init_fn"),
                                                   report=measured)
        return build(loader_dataset(self.dataset, config), tuned_workers="num_workers" not in self.fixed, **kwargs)

