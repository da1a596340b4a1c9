"""The one place autoloader constructs a ``torch.utils.data.DataLoader``: ``build`` for every configuration it tunes
or serves (``Request.data_loader`` decides the arguments), ``rebuilt`` for the rest of an epoch of a DataLoader the
user built (``source.PlainSource.resume``)."""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from torch.utils.data import DataLoader

from ..errors import quiet_worker_count_warning

__all__ = ["build", "rebuilt"]

_SETTINGS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
             "pin_memory_device")
"""What ``rebuilt`` takes from the user's DataLoader, besides the sampling."""


def build(dataset: Any, *, tuned_workers: bool, **kwargs: Any) -> DataLoader:
    """``DataLoader(dataset, **kwargs)``; ``tuned_workers``: ``num_workers`` is autoloader's measured choice, so
    torch's warning that it exceeds the CPU count is not shown (``errors.quiet_worker_count_warning``)."""
    with quiet_worker_count_warning(tuned_workers):
        return DataLoader(dataset, **kwargs)


def rebuilt(loader: DataLoader, *, sampling: Mapping[str, Any], generator: Optional[torch.Generator]) -> DataLoader:
    """A DataLoader with ``loader``'s settings over ``sampling`` (a resumed epoch's rest: ``BatchSlice.sampling()``)
    with its ``generator``, in order, not persistent."""
    kwargs = {name: getattr(loader, name) for name in _SETTINGS}
    if loader.num_workers:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return build(loader.dataset, tuned_workers=False, **sampling, generator=generator, in_order=True, **kwargs)
