"""Identities for the tuning cache: what the dataset, the loader arguments and the machine look like.

Everything here is pure and cheap: a dataset is fingerprinted from its class, its length, a path-like attribute and
the datasets it wraps, reading no sample (NOTE [ Nothing before iter() ] in loader/lazy.py); what its batches look
like is a ``batch_signature`` of the first batch served, kept in the entry and compared on a hit (``same_batches``).
``cache_key`` hashes exactly these (see NOTE [ What the cache key covers ]).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

SCHEMA_VERSION = 5
"""The format of a cache entry (3: ``TuneResult`` holds a ``LoaderConfig``; 4: with ``native_threads``, and trials
with the native pools their workers found; 5: trials with the step's CPU and the machine's other load, without the
workers' CPU per batch). An entry in an older one is tuned again and replaced, with one log line
(``store.TuneCache.get``): it was decided without the step's CPU counted (4), or the workers' native pools limited
(3)."""
KEY_FORMAT = 2
"""The format of the cache key's payload: unchanged by a new entry schema, so an old entry is found (and replaced)
rather than left behind under a key nothing asks for. Bump it when the key's inputs change."""

_ROOT_ATTRIBUTES = ("root", "path", "data_dir", "data_path", "filename")
_MAX_DEPTH = 8
_MAX_ITEMS = 32
_SIMPLE = (type(None), bool, int, float, str, bytes)


def _qualified(tp: type) -> str:
    return f"{getattr(tp, '__module__', None) or '?'}.{getattr(tp, '__qualname__', None) or tp.__name__}"


def dataset_length(dataset: Any) -> Optional[int]:
    """``len(dataset)``, or None when it has none (or refuses, as some IterableDatasets do)."""
    try:
        return len(dataset)
    except (TypeError, NotImplementedError):  # no __len__, or one that refuses (some IterableDatasets)
        return None


def _root(dataset: Any) -> Optional[str]:
    for name in _ROOT_ATTRIBUTES:
        value = getattr(dataset, name, None)
        if isinstance(value, (str, os.PathLike)) and os.fspath(value) not in ("", b""):
            return str(Path(os.fsdecode(value)).expanduser().resolve())
    return None


def _wrapped(dataset: Any, depth: int) -> Optional[list]:
    """Class, length and root of datasets this one wraps (``Subset.dataset``, ``ConcatDataset.datasets``)."""
    if depth >= 3:
        return None
    inner = getattr(dataset, "dataset", None)
    inners = [inner] if isinstance(inner, Dataset) else []
    many = getattr(dataset, "datasets", None)
    if isinstance(many, (list, tuple)):
        inners += [d for d in many[:_MAX_ITEMS] if isinstance(d, Dataset)]
    if not inners:
        return None
    return [
        {"class": _qualified(type(d)), "len": dataset_length(d), "root": _root(d), "wraps": _wrapped(d, depth + 1)}
        for d in inners
    ]


def _structure(obj: Any, depth: int = 0) -> Any:
    """Types, dtypes and ranks of a batch, never its values nor its sizes (which padding and the last batch vary):
    a list (variable length) by its first item, a tuple, namedtuple or mapping by every item."""
    name = _qualified(type(obj))
    if depth >= _MAX_DEPTH:
        return {"type": name, "truncated": True}
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return {"type": name, "ndim": int(obj.ndim), "dtype": str(obj.dtype)}
    if isinstance(obj, (np.generic,) + _SIMPLE):
        return {"type": name}
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        fields = {str(f): _structure(v, depth + 1) for f, v in zip(getattr(type(obj), "_fields"), obj)}
        return {"type": name, "fields": fields}
    if isinstance(obj, tuple):
        return {"type": name, "items": [_structure(v, depth + 1) for v in obj[:_MAX_ITEMS]]}
    if isinstance(obj, list):
        return {"type": name, "first": _structure(obj[0], depth + 1) if obj else None}
    if isinstance(obj, Mapping):
        keys = list(obj.keys())[: _MAX_ITEMS * 4]
        return {"type": name, "items": {_argument_identity(k): _structure(obj[k], depth + 1) for k in keys}}
    mode = getattr(obj, "mode", None)
    return {"type": name, "mode": mode} if isinstance(mode, str) else {"type": name}


def _nbytes(obj: Any, depth: int = 0) -> int:
    """The bytes of the tensors and arrays in a batch."""
    if isinstance(obj, torch.Tensor):
        return int(obj.element_size() * obj.nelement())
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if depth >= _MAX_DEPTH or isinstance(obj, (str, bytes)):
        return 0
    if isinstance(obj, Mapping):
        return sum(_nbytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v, depth + 1) for v in obj)
    return 0


BYTES_RATIO = 2.0
"""Two batches whose sizes differ by more than this factor are not alike (``same_batches``): another resolution or
crop, not padding."""


def batch_signature(batch: Any) -> dict:
    """What a batch looks like, for its cache entry: its structure (types, dtypes, ranks) and its bytes."""
    return {"structure": _structure(batch), "bytes": _nbytes(batch)}


def same_batches(stored: Any, seen: dict) -> bool:
    """Whether the batch ``seen`` looks like the one an entry was tuned on (``stored``, from the entry: anything
    malformed differs): the same structure, and bytes within ``BYTES_RATIO`` of each other."""
    if not isinstance(stored, dict) or stored.get("structure") != seen["structure"]:
        return False
    before, now = stored.get("bytes"), seen["bytes"]
    if not isinstance(before, int) or isinstance(before, bool) or before < 0:
        return False
    if min(before, now) == 0:
        return before == now
    return max(before, now) / min(before, now) <= BYTES_RATIO


def dataset_fingerprint(dataset: Any, *, key: Optional[str] = None) -> dict:
    """What identifies ``dataset`` for the cache, reading none of its samples: its class, ``len()``, kind, root
    directory and the datasets it wraps; ``{"key": key}`` when the user names it."""
    if key is not None:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str naming the dataset for the cache (or None), got {key!r}")
        if not key:
            raise ValueError("key must be a non-empty str naming the dataset for the cache (or None), got ''")
        return {"key": key}
    return {
        "class": _qualified(type(dataset)),
        "len": dataset_length(dataset),
        "iterable": isinstance(dataset, IterableDataset),
        "root": _root(dataset),
        "wraps": _wrapped(dataset, 0),
    }


def _is_simple(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return len(value) <= _MAX_ITEMS and all(_is_simple(v) for v in value)
    return isinstance(value, _SIMPLE)


def _argument_identity(value: Any) -> str:
    return repr(value) if _is_simple(value) else str(callable_identity(value))


def callable_identity(obj: Any) -> Optional[str]:
    """A stable name for a collate_fn, sampler or step: ``module.qualname``, never ``id()``.

    Functions and classes give their own name, ``functools.partial`` its function plus its arguments (repr when
    simple, else their identity), any other object the name of its class. Two lambdas defined in the same scope share
    a name (accepted: they only change how fast loading is, and the worst case is a stale tuning that ``cache=False``
    or ``autotune clear`` resets).
    """
    if obj is None:
        return None
    if isinstance(obj, functools.partial):
        args = [_argument_identity(a) for a in obj.args]
        args += [f"{k}={_argument_identity(v)}" for k, v in sorted(obj.keywords.items())]
        return f"partial({', '.join([str(callable_identity(obj.func))] + args)})"
    if isinstance(obj, type):
        return _qualified(obj)
    if inspect.isroutine(obj):
        qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        if isinstance(qualname, str):
            return f"{getattr(obj, '__module__', None) or 'builtins'}.{qualname}"
    return _qualified(type(obj))


def step_descriptor(step: Any) -> str:
    """``"none"``, ``"sleep:<seconds>"`` for a simulated consumer, or ``"callable:<identity>"``."""
    if step is None:
        return "none"
    if isinstance(step, numbers.Real) and not isinstance(step, bool):
        return f"sleep:{float(step)!r}"
    if callable(step):
        return f"callable:{callable_identity(step)}"
    raise TypeError(f"step must be None, a number of seconds per batch or a callable, got {step!r}")


# NOTE [ Memory in the machine fingerprint ]
# The key must name the machine, not its mood: the memory *budget* (what is free now) moves from run to run with the
# page cache and other jobs, so hashing it, even bucketed, flips keys whenever it straddles a bucket edge. The
# machine's memory *size* is what identifies it: the cgroup limit when there is one (a container's size), else the
# physical total, in whole GiB. The live budget still guards every trial (budget_guard in search/memory.py) and is
# checked again when a cached result is used, so a shared key never lets a config outgrow the memory free today.
def _memory_size_gib(profile: Any) -> Optional[int]:
    size = profile.memory.limit_bytes or profile.memory.total_bytes
    return None if size is None else int(round(size / 2**30))


def machine_fingerprint(profile: Any) -> dict:
    """The machine facts that change the right tuning; never the hostname, so identical nodes share results.

    Memory is the machine's size, not what is free (see NOTE [ Memory in the machine fingerprint ]).
    """
    gpus = profile.gpus
    return {
        "cpu_model": profile.cpu.model,
        "cpu_usable": profile.cpu.usable,
        "memory_gib": _memory_size_gib(profile),
        "gpus": None if gpus is None else tuple(sorted(str(g.name) for g in gpus)),
        "torch": profile.torch_version,
    }


# NOTE [ What the cache key covers ]
# A cached tuning is reused only when everything that changes the right answer is the same: the dataset
# (fingerprint or the user's key), batch size, collate/sampler/batch_sampler identities (class names, never id()),
# drop_last, the consumer step, the device type, the machine fingerprint, ``extra`` (knobs the user fixed, normalize,
# world size, ...) and KEY_FORMAT. Hashing canonical JSON (sorted keys, no whitespace) makes the key stable
# across processes and Python versions. The key reads no sample (NOTE [ Nothing before iter() ] in loader/lazy.py):
# what the samples look like (two datasets of one class, length and root, with another transform) is checked from
# the first batch served instead. The entry keeps that batch's ``batch_signature``; a hit whose first batch differs
# (``same_batches``: another structure, or more than twice or half the bytes) serves this run with the entry, which
# is removed so the next run tunes again (``cache.slot.Slot.observe``; online, the re-tune rule also sees the epoch
# run at another rate). Two such datasets used in turn each tune every run: name them (``key=``).
def cache_key(
    *,
    dataset_fp: dict,
    batch_size: Optional[int],
    loader_kwargs: Mapping[str, Any],
    step: Any,
    device_type: str,
    machine_fp: dict,
    extra: Optional[dict] = None,
) -> str:
    """A 32-hex-digit key for a tuning (see NOTE [ What the cache key covers ]); of the DataLoader's other arguments
    (``loader_kwargs``) it reads ``collate_fn``, ``sampler``, ``batch_sampler`` and ``drop_last``."""
    collate_fn, sampler = loader_kwargs.get("collate_fn"), loader_kwargs.get("sampler")
    batch_sampler, drop_last = loader_kwargs.get("batch_sampler"), loader_kwargs.get("drop_last", False)
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)):
        raise TypeError(f"batch_size must be an int or None, got {batch_size!r}")
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a str such as 'cuda' or 'cpu', got {device_type!r}")
    payload = {
        "schema": KEY_FORMAT,
        "dataset": dataset_fp,
        "batch_size": batch_size,
        "collate_fn": callable_identity(collate_fn),
        "sampler": callable_identity(sampler),
        "batch_sampler": callable_identity(batch_sampler),
        "drop_last": bool(drop_last),
        "step": step_descriptor(step),
        "device_type": device_type,
        "machine": machine_fp,
        "extra": extra or {},
    }
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"dataset_fp, machine_fp and extra must hold only JSON values (str, int, float, bool, None, lists, "
            f"dicts with str keys): {err}"
        ) from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
