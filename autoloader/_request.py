"""``make_loader``'s arguments, checked once (``Request.checked``), and the DataLoader they make for a
configuration (``Request.data_loader``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Union

import torch
from torch.utils.data import DataLoader, IterableDataset

from . import distributed as _distributed
from ._consumer import Step
from ._device import resolve_device
from ._validate import check_common, check_dataset, check_loader_kwargs, check_picklable, check_threads
from .errors import quiet_worker_count_warning
from .probe import start_method
from .results import LoaderConfig, without_worker_only
from .threads import fixed_threads, loader_dataset
from .tuner import TUNED_KNOBS


@dataclass(frozen=True)
class Request:
    """``make_loader``'s arguments, checked: the knobs the user fixed apart from the other DataLoader keywords, and
    the data sharded across ranks when training is distributed."""

    dataset: Any
    batch_size: int
    shuffle: bool
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

    @property
    def fixed_threads(self) -> int:
        """Threads per process of every candidate when the user fixed them, else 1."""
        return fixed_threads(self.threads)

    @classmethod
    def checked(cls, dataset: Any, batch_size: Any, *, shuffle: Any, step: Any, device: Any, normalize: Any,
                dtype: Any, input_key: Any, cache: Any, budget: Any, max_workers: Any, key: Any, distributed: Any,
                threads: Any, dataloader_kwargs: Dict[str, Any]) -> "Request":
        check_common(batch_size=batch_size, step=step, budget=budget, max_workers=max_workers, key=key, cache=cache)
        check_dataset(dataset)
        threads = check_threads(threads, dataset)
        check_loader_kwargs(dataset, batch_size=batch_size, shuffle=shuffle, kwargs=dataloader_kwargs)
        kwargs = dict(dataloader_kwargs)
        fixed = {k: kwargs.pop(k) for k in TUNED_KNOBS if k in kwargs}
        group = _distributed.Group.current(distributed)
        if group is not None:
            kwargs, shuffle = group.shard(dataset, shuffle=shuffle, drop_last=kwargs.get("drop_last", False),
                                          loader_kwargs=kwargs)
        if fixed.get("num_workers", 1) > 0 and (max_workers is None or max_workers > 0):
            check_picklable(start_method=start_method(kwargs.get("multiprocessing_context")) or "fork",
                            objects={"dataset": dataset, "collate_fn": kwargs.get("collate_fn"),
                                     "worker_init_fn": kwargs.get("worker_init_fn")})
        unsharded = (distributed is None and group is None and not isinstance(dataset, IterableDataset)
                     and kwargs.get("sampler") is None and kwargs.get("batch_sampler") is None)
        return cls(dataset, batch_size, shuffle, step, resolve_device(device),
                   dict(normalize=normalize, dtype=dtype, input_key=input_key), budget, max_workers, key, kwargs,
                   fixed, group, unsharded, threads)

    def data_loader(self, config: LoaderConfig) -> DataLoader:
        """The user's DataLoader with ``config``'s knobs (theirs where they fixed one), over ``loader_dataset``:
        the one autoloader returns (or serves between online searches)."""
        kwargs = config.loader_kwargs()
        kwargs.update(self.fixed)
        user = self.loader_kwargs
        if kwargs.get("num_workers", 0) == 0:
            kwargs, user = without_worker_only(kwargs), without_worker_only(user)
        with quiet_worker_count_warning("num_workers" not in self.fixed):
            return DataLoader(loader_dataset(self.dataset, config), batch_size=self.batch_size,
                              shuffle=self.shuffle, **user, **kwargs)
