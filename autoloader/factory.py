"""``make_loader``: cache -> tune -> DataLoader -> PrefetchLoader."""
from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import DataLoader

from . import distributed as _distributed
from . import policy
from .cache import resolve_cache
from .consumer import Step
from .errors import AutoloaderWarning
from .fingerprint import cache_key, dataset_fingerprint, dataset_length, machine_fingerprint, step_descriptor
from .prefetch import PrefetchLoader, quiet_worker_count_warning, resolve_device
from .probe import probe_machine
from .results import TuneResult
from ._signals import SignalGuard
from .failures import HARD_LIMIT_GRACE_S, TrialTimeout, TuningError
from .tuner import TUNED_KNOBS, fallback_result, open_files_limit, trial_limit, tune
from .validate import (check_common, check_dataset, check_loader_kwargs, check_picklable,
                       worker_start_method)

log = logging.getLogger("autoloader")

CacheArg = Union[bool, str, "os.PathLike[str]"]


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def make_loader(
    dataset: Any,
    batch_size: int = 1,
    *,
    shuffle: bool = False,
    step: Step = None,
    device: Union[str, torch.device, None] = None,
    normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
    dtype: Optional[torch.dtype] = None,
    input_key: Any = None,
    cache: CacheArg = True,
    budget: Optional[float] = None,
    max_workers: Optional[int] = None,
    key: Optional[str] = None,
    distributed: Optional[bool] = None,
    **dataloader_kwargs: Any,
) -> PrefetchLoader:
    """A DataLoader tuned for this machine, dataset and training step, wrapped in a ``PrefetchLoader``.

    On a cache hit no trial runs and no worker starts. On a miss, ``tune()`` times a few candidates against ``step``
    (see ``autoloader.tuner``) and the choice is cached. Every other keyword goes to ``torch.utils.data.DataLoader``
    unchanged; ``num_workers``, ``prefetch_factor``, ``pin_memory`` or ``persistent_workers`` given explicitly are
    never overridden. ``distributed``: None follows ``torch.distributed.is_initialized()``.
    """
    started = time.perf_counter()
    check_common(batch_size=batch_size, step=step, budget=budget, max_workers=max_workers, key=key, cache=cache)
    check_dataset(dataset)
    check_loader_kwargs(dataset, batch_size=batch_size, shuffle=shuffle, kwargs=dataloader_kwargs)
    device = resolve_device(device)
    kwargs = dict(dataloader_kwargs)
    fixed = {k: kwargs.pop(k) for k in TUNED_KNOBS if k in kwargs}
    group = _distributed.Group.current(distributed)
    if group is not None:
        kwargs, shuffle = group.shard(dataset, shuffle=shuffle, drop_last=kwargs.get("drop_last", False),
                                      loader_kwargs=kwargs)
    if fixed.get("num_workers", 1) > 0 and (max_workers is None or max_workers > 0):
        check_picklable(start_method=worker_start_method(kwargs.get("multiprocessing_context")),
                        objects={"dataset": dataset, "collate_fn": kwargs.get("collate_fn"),
                                 "worker_init_fn": kwargs.get("worker_init_fn")})

    profile = probe_machine(disk=False, gpus=False)
    if group is not None:
        profile = group.share_profile(profile)
    store = resolve_cache(cache)
    store_for_me = store if group is None or group.is_leader else None
    entry_key = None
    result: Optional[TuneResult] = None
    if store is not None:
        try:
            dataset_fp = _fingerprint_in_time(dataset, key=key, budget=budget)
        except TrialTimeout as err:
            warnings.warn(f"autoloader could not tune: {err}; using a safe default configuration (pass "
                          f"num_workers=... to choose one)", AutoloaderWarning, stacklevel=2)
            result = fallback_result(fixed, device=device, reason=str(err))
            store = store_for_me = None
    if store is not None:
        entry_key = cache_key(
            dataset_fp=dataset_fp, batch_size=batch_size,
            collate_fn=kwargs.get("collate_fn"), sampler=kwargs.get("sampler"),
            batch_sampler=kwargs.get("batch_sampler"), drop_last=bool(kwargs.get("drop_last", False)),
            step=step, device_type=device.type, machine_fp=machine_fingerprint(profile),
            extra={"fixed": _jsonable(fixed), "normalize": _jsonable(normalize), "dtype": _jsonable(dtype),
                   "shuffle": shuffle, "max_workers": max_workers,
                   "world": None if group is None else group.local_world_size},
        )
    bound = max_workers if max_workers is not None else policy.default_max_workers(
        usable_cpus=profile.cpu.usable or profile.cpu.logical, nofile=open_files_limit())
    if store_for_me is not None and entry_key is not None:
        result = store_for_me.get(entry_key, max_workers=bound)
    if result is not None and not _fits_today(result, profile):
        result = None
    if group is not None:
        result = group.broadcast(result)
    if result is None:
        try:
            result = tune(dataset, batch_size, step=step, device=device, shuffle=shuffle, budget=budget,
                          max_workers=max_workers, profile=profile, loader_kwargs=kwargs, fixed=fixed,
                          normalize=normalize, dtype=dtype,
                          agreement=group.agreement() if group is not None else None)
        except TuningError as err:
            warnings.warn(f"autoloader could not tune ({err}); using a safe default configuration",
                          AutoloaderWarning, stacklevel=2)
            result = fallback_result(fixed, device=device, reason=str(err))
        if group is not None:
            result = group.broadcast(result)
        if store_for_me is not None and entry_key is not None and _worth_keeping(result):
            store_for_me.put(entry_key, result, meta={
                "dataset": type(dataset).__qualname__, "len": dataset_length(dataset), "key": key,
                "batch_size": batch_size, "step": step_descriptor(step), "device": device.type,
                "shuffle": shuffle})
    config = result.config.loader_kwargs()
    config.update(fixed)
    if config.get("num_workers", 0) == 0:
        config.pop("prefetch_factor", None)
        config.pop("persistent_workers", None)
    with quiet_worker_count_warning("num_workers" not in fixed):
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, **kwargs, **config)
    wrapped = PrefetchLoader(loader, device=device, normalize=normalize, dtype=dtype, input_key=input_key,
                             tuning=result)
    log.info("autoloader: %s, %s samples/s, bottleneck %s, from %s, %.2f s",
             result.config.label(),
             "unknown" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}",
             result.bottleneck or "unknown", result.source, time.perf_counter() - started)
    return wrapped


def _fingerprint_in_time(dataset: Any, *, key: Optional[str], budget: Optional[float]) -> dict:
    """``dataset_fingerprint`` reads ``dataset[0]`` in this process; one that blocks is cut at a trial's hard limit
    (a sample that slow leaves no trial anything to measure), raising ``TrialTimeout``."""
    limit = trial_limit(budget) + HARD_LIMIT_GRACE_S
    message = f"reading one sample of {type(dataset).__name__} for the cache key took more than {limit:.1f} s"
    with SignalGuard(limit_s=limit, make_timeout=lambda: TrialTimeout(message)):
        return dataset_fingerprint(dataset, key=key)


def _worth_keeping(result: TuneResult) -> bool:
    """Cache tuned results, but not one where every worker count failed: the cause (a transient OOM, a full
    /dev/shm) may be gone next run, and a cached num_workers=0 would hide that for good."""
    if result.source != "tuned":
        return False
    worker_trials = [t for t in result.trials if t.config.num_workers > 0 and t.status != "skipped"]
    return not worker_trials or any(t.ok for t in worker_trials)


def _fits_today(result: TuneResult, profile: Any) -> bool:
    """A cached config is reused only if its workers still fit in the memory and /dev/shm free now."""
    per_worker = max((t.worker_uss_bytes + max(0, t.worker_uss_growth_bytes or 0)
                      for t in result.trials if t.worker_uss_bytes is not None), default=None)
    batch_bytes = next((t.batch_bytes for t in result.trials if t.batch_bytes is not None), None)
    reason = policy.memory_guard(result.num_workers, per_worker_bytes=per_worker,
                                 budget_bytes=profile.memory.budget_bytes) or \
        policy.shm_guard(result.num_workers, result.prefetch_factor, batch_bytes=batch_bytes,
                         shm_free_bytes=profile.shm.free_bytes)
    if reason is not None:
        log.info("cached config %s no longer fits (%s); tuning again", result.config.label(), reason)
    return reason is None
