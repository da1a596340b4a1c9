"""``make_loader`` in four steps: look up the cache, tune on a miss, store the result, build the loader."""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from typing import Any, Literal, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import DataLoader, IterableDataset

from . import policy
from ._consumer import Consumer, Step
from ._search import Search
from ._failures import HARD_LIMIT_GRACE_S
from ._fingerprint import cache_key, dataset_fingerprint, dataset_length, machine_fingerprint, step_descriptor
from ._request import Request
from ._signals import SignalGuard
from .cache import TuneCache, resolve_cache
from .errors import TrialTimeout, TuningError, warn_user
from .prefetch import PrefetchLoader
from .probe import MachineProfile, open_files_limit, probe_machine, remembered_gpus, with_saved_disk
from .online import OnlineTuner
from .results import LoaderConfig, TuneResult
from .slices import EpochSlicer
from .threads import loader_dataset
from .tuner import fallback_result, new_search, trial_limit, tune_with

log = logging.getLogger("autoloader")

CacheArg = Union[bool, str, "os.PathLike[str]"]
Tuning = Literal["auto", "online", "trials"]
TUNING_MODES = ("auto", "online", "trials")


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
    tuning: Tuning = "auto",
    retune: bool = True,
    cache: CacheArg = True,
    refresh: bool = False,
    budget: Optional[float] = None,
    max_workers: Optional[int] = None,
    key: Optional[str] = None,
    distributed: Optional[bool] = None,
    threads: Union[bool, int] = False,
    **dataloader_kwargs: Any,
) -> PrefetchLoader:
    """A DataLoader tuned for this machine, dataset and training step, wrapped in a ``PrefetchLoader``.

    On a cache hit no trial runs and no worker starts. On a miss (or with ``refresh=True``), ``tuning`` says how:
    ``"online"`` returns at once and tunes during the first epoch, in the training loop itself (see ``online.py``);
    ``"trials"`` times a few candidates against ``step`` first (``tune()``); ``"auto"`` is online for a map-style
    dataset when ``step`` is None, else trials. With ``retune`` (and a map-style dataset) the loader searches again,
    online, after an epoch whose rate or stall moved away from the decision's (not with ``tuning="trials"``). The
    choice is cached; ``loader.cache_key`` names the entry. Every other keyword goes to
    ``torch.utils.data.DataLoader`` unchanged; ``num_workers``, ``prefetch_factor``, ``pin_memory`` or
    ``persistent_workers`` given explicitly are never overridden. ``distributed``: None follows
    ``torch.distributed.is_initialized()``.

    ``threads`` (map-style datasets only; ``__getitem__`` must be thread-safe): False (default) fetches each sample
    in turn; an int N fetches each batch's samples with N threads in every loading process (the main one with
    ``num_workers=0``, else each worker); True lets the tuner choose threads per process: when the process-only choice
    mostly waits, a few candidates with fewer processes and more threads are measured against it, and kept when
    within the tolerance of its rate (see ``autoloader.threads`` for what ``loader.dataset`` then is).
    """
    started = time.perf_counter()
    for name, value in (("refresh", refresh), ("retune", retune)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if tuning not in TUNING_MODES:
        raise ValueError(f"tuning={tuning!r} must be one of {TUNING_MODES}: 'online' tunes in the training loop, "
                         f"'trials' before it, 'auto' picks")
    request = Request.checked(dataset, batch_size, shuffle=shuffle, step=step, device=device, normalize=normalize,
                              dtype=dtype, input_key=input_key, cache=cache, budget=budget, max_workers=max_workers,
                              key=key, distributed=distributed, threads=threads, dataloader_kwargs=dataloader_kwargs)
    profile = with_saved_disk(dataclasses.replace(probe_machine(disk=False, gpus=False), gpus=remembered_gpus()))
    if request.group is not None:
        profile = request.group.share_profile(profile)
    online_why = _not_online(request)
    if tuning == "online" and online_why:
        raise ValueError(f"tuning='online' cannot serve this loader: {online_why}; use tuning='trials'")
    slot = _Slot.find(request, profile, resolve_cache(cache))
    result = slot.fallback or (None if refresh else slot.look_up())
    in_cache = result is not None and result.source == "cache"
    search_online = result is None and not online_why and (tuning == "online" or request.step is None and
                                                           tuning == "auto")
    if result is None and not search_online:
        result = _tune(request, profile)
        in_cache = slot.store(result)
    if not online_why and slot.fallback is None and (search_online or (retune and tuning != "trials")):
        loader = _online(request, profile, slot, decision=result, retune=retune, in_cache=in_cache)
    else:
        loader = _build(request, result, cache_key=slot.key if in_cache else None)
    result = loader.tuning
    log.info("autoloader: %s, %s samples/s, bottleneck %s, from %s, %.2f s", result.config.label(),
             "unknown" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}",
             result.bottleneck or "unknown", result.source, time.perf_counter() - started)
    return loader


class _Slot:
    """Where this request's tuning lives in the cache (rank 0's store only), and whether it is there and still fits
    this machine today."""

    def __init__(self, request: Request, profile: MachineProfile, store: Optional[TuneCache], key: Optional[str],
                 fallback: Optional[TuneResult] = None) -> None:
        self.request, self.profile, self.key, self.fallback = request, profile, key, fallback
        group = request.group
        self.cache = store if group is None or group.is_leader else None

    @classmethod
    def find(cls, request: Request, profile: MachineProfile, store: Optional[TuneCache]) -> "_Slot":
        if store is None:
            return cls(request, profile, None, None)
        try:
            fingerprint = _fingerprint_in_time(request.dataset, key=request.key, budget=request.budget)
        except TrialTimeout as err:
            warn_user(f"autoloader could not tune: {err}; using a safe default configuration (pass num_workers=... "
                      f"to choose one)")
            return cls(request, profile, None, None,
                       fallback=fallback_result(request.fixed, device=request.device, reason=str(err),
                                                threads=request.fixed_threads))
        kwargs, transform = request.loader_kwargs, request.transform
        key = cache_key(
            dataset_fp=fingerprint, batch_size=request.batch_size, collate_fn=kwargs.get("collate_fn"),
            sampler=kwargs.get("sampler"), batch_sampler=kwargs.get("batch_sampler"),
            drop_last=bool(kwargs.get("drop_last", False)), step=request.step, device_type=request.device.type,
            machine_fp=machine_fingerprint(profile),
            extra={"fixed": _jsonable(request.fixed), "normalize": _jsonable(transform["normalize"]),
                   "dtype": _jsonable(transform["dtype"]), "input_key": _jsonable(transform["input_key"]),
                   "shuffle": request.shuffle, "max_workers": request.max_workers,
                   "world": None if request.group is None else request.group.local_world_size,
                   **({"threads": request.threads} if request.threads is not False else {})})
        return cls(request, profile, store, key)

    def look_up(self) -> Optional[TuneResult]:
        """The cached result when there is one and its workers fit in today's memory and /dev/shm; on every rank."""
        result = None
        if self.cache is not None and self.key is not None:
            bound = self.request.max_workers
            if bound is None:
                bound = policy.default_max_workers(usable_cpus=self.profile.cpu.usable or self.profile.cpu.logical,
                                                   nofile=open_files_limit()[0])
            result = self.cache.get(self.key, max_workers=bound)
        if result is not None:
            reason = policy.no_longer_fits(result, budget_bytes=self.profile.memory.budget_bytes,
                                           shm_free_bytes=self.profile.shm.free_bytes)
            if reason is not None:
                log.info("cached config %s no longer fits (%s); tuning again", result.config.label(), reason)
                result = None
        group = self.request.group
        return result if group is None else group.broadcast(result)

    def store(self, result: TuneResult) -> bool:
        """Cache ``result`` when it is worth keeping; True when the entry under ``key`` now holds it (on ranks other
        than 0, which write nothing: when rank 0 was asked to write it)."""
        if self.key is None or not _worth_keeping(result):
            return False
        if self.cache is None:
            return True
        request = self.request
        return self.cache.put(self.key, result, meta={
            "dataset": type(request.dataset).__qualname__, "len": dataset_length(request.dataset),
            "key": request.key, "batch_size": request.batch_size, "step": step_descriptor(request.step),
            "device": request.device.type, "shuffle": request.shuffle}) is not None


def _tune(request: Request, profile: MachineProfile) -> TuneResult:
    """Run the trials (on every rank together); a failure of autoloader's own falls back with a warning."""
    group = request.group
    try:
        result = tune_with(request.dataset, request.batch_size, step=request.step, device=request.device,
                           shuffle=request.shuffle, budget=request.budget, max_workers=request.max_workers,
                           loader_kwargs=request.loader_kwargs, fixed=request.fixed, profile=profile,
                           agreement=group.agreement() if group is not None else None, threads=request.threads,
                           **request.transform)
    except TuningError as err:
        warn_user(f"autoloader could not tune ({err}); using a safe default configuration")
        result = fallback_result(request.fixed, device=request.device, reason=str(err),
                                 threads=request.fixed_threads)
    return result if group is None else group.broadcast(result)


def _build(request: Request, result: TuneResult, *, cache_key: Optional[str]) -> PrefetchLoader:
    """The tuned DataLoader in the prefetcher."""
    return PrefetchLoader(request.data_loader(result.config), device=request.device, tuning=result,
                          cache_key=cache_key, single_process=request.unsharded, **request.transform)


def _not_online(request: Request) -> str:
    """Why this loader cannot be tuned online (empty when it can)."""
    if isinstance(request.dataset, IterableDataset):
        return "an IterableDataset's stream cannot be split exactly between candidate loaders"
    if "num_workers" in request.fixed:
        return f"num_workers={request.fixed['num_workers']} is fixed"
    if request.max_workers == 0:
        return "max_workers=0 leaves nothing to tune"
    return ""


def _online(request: Request, profile: MachineProfile, slot: "_Slot", *, decision: Optional[TuneResult],
            retune: bool, in_cache: bool) -> PrefetchLoader:
    """A loader that tunes in its own training loop: from scratch when ``decision`` is None, else re-tuning from it
    (see NOTE [ Online switching ] in online.py)."""
    group = request.group
    agreement = group.agreement() if group is not None else None

    def search(start: Optional[LoaderConfig]) -> Search:
        return new_search(request.dataset, request.batch_size, device=request.device, fixed=request.fixed,
                          budget=math.inf, max_workers=request.max_workers, profile=profile, agreement=agreement,
                          start=start, threads=request.threads)

    def build(config: LoaderConfig) -> DataLoader:
        return request.data_loader(config)

    first = build(decision.config if decision is not None else LoaderConfig(0, threads=request.fixed_threads))
    sampling = {"batch_sampler": first.batch_sampler, "generator": first.generator}
    slicer = EpochSlicer(request.dataset, **sampling, **{k: v for k, v in request.loader_kwargs.items()
                                                          if k not in ("sampler", "batch_sampler", "shuffle",
                                                                       "drop_last", "generator")})
    tuner = OnlineTuner(slicer=slicer, batch_size=request.batch_size, consumer=Consumer(None, request.device),
                        build=build, new_search=search, store=slot.store, decision=decision, retune=retune,
                        dataset_for=lambda config: loader_dataset(request.dataset, config), agreement=agreement,
                        threads=request.fixed_threads,
                        share=group.broadcast if group is not None else lambda result: result)
    return PrefetchLoader(first, device=request.device, cache_key=slot.key, single_process=request.unsharded,
                          online=tuner, **request.transform)


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
    if result.source not in ("tuned", "online"):
        return False
    worker_trials = [t for t in result.trials if t.config.num_workers > 0 and t.status != "skipped"]
    return not worker_trials or any(t.ok for t in worker_trials)


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
