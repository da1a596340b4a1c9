"""Walk the tensors of a nested batch (tuples, lists, namedtuples, mappings) without changing its structure."""
from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, Iterator

import torch

Batch = Any
"""A batch as the user's ``collate_fn`` (or iterable) makes it: a tensor, tuples, lists, namedtuples and mappings of
them nested at will, or any other object (passed through untouched)."""


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def rebuild_mapping(original: Mapping, items: dict) -> Mapping:
    """A mapping of ``original``'s type holding ``items``; a plain ``dict`` when that type cannot be rebuilt.

    A mutable mapping is shallow-copied then updated (this keeps e.g. a ``defaultdict``'s factory); any other
    mapping type is called with ``items``.
    """
    if type(original) is dict:
        return items
    if isinstance(original, MutableMapping):
        try:
            clone = copy.copy(original)
            clone.update(items)
            return clone
        except (TypeError, AttributeError, copy.Error):
            return items
    rebuild: Any = type(original)  # a Mapping subclass whose constructor takes the items, or raises
    try:
        return rebuild(items)
    except (TypeError, ValueError):
        return items


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Batch) -> Batch:
    """Apply ``fn`` to every tensor in ``batch``; containers keep their type, other objects pass through."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return rebuild_mapping(batch, {key: map_tensors(fn, value) for key, value in batch.items()})
    if _is_namedtuple(batch):
        return type(batch)(*(map_tensors(fn, value) for value in batch))
    if isinstance(batch, tuple):
        return tuple(map_tensors(fn, value) for value in batch)
    if isinstance(batch, list):
        return [map_tensors(fn, value) for value in batch]
    return batch


def iter_tensors(batch: Batch) -> Iterator[torch.Tensor]:
    """Every tensor in ``batch``, depth first, in container order."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from iter_tensors(value)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            yield from iter_tensors(value)


def batch_nbytes(batch: Batch) -> int:
    """Bytes held by the tensors of ``batch`` (``element_size() * nelement()`` summed)."""
    return sum(t.element_size() * t.nelement() for t in iter_tensors(batch))
