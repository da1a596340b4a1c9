"""``make_loader`` in four steps: look up the cache, tune on a miss, store the result, build the loader."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Literal, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import IterableDataset

from .cache import resolve_cache
from .cache.slot import Slot
from .errors import TuningError, warn_user
from .loader.prefetch import PrefetchLoader
from .measure.consumer import Step
from .probe import MachineProfile, probe_machine, remembered_gpus, with_saved_disk
from .request import Request
from .results import TuneResult
from .search.bounds import usable_cpus
from .search.native_policy import fallback_limit
from .search.candidates import fallback_result
from .tuning.online import OnlineLoader
from .tuning.online_search import OnlineSearch
from .tuning.trials import tune_with

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
    memory_budget: Union[None, int, float] = None,
    native_threads: Optional[Union[bool, int]] = None,
    **dataloader_kwargs: Any,
) -> PrefetchLoader:
    """A DataLoader tuned for this machine, dataset and training step, wrapped in a ``PrefetchLoader``.

    On a cache hit no trial runs and no worker starts. On a miss (or with ``refresh=True``), ``tuning`` says how:
    ``"online"`` returns at once and tunes during the first epoch, in the training loop itself (see ``tuning/online.py``);
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
    within the tolerance of its rate (see ``autoloader.loader.threads`` for what ``loader.dataset`` then is).

    ``memory_budget``: what the loader's workers, batches in flight, pinned copies and thread buffers may take: bytes
    (an int), or a fraction in (0, 1] of the memory available to this process (the cgroup's headroom when tighter,
    divided among the ranks of a node); default half of it. A candidate that would exceed it is not tried, and the
    choice stays under it, also as forecast for the end of an epoch when workers grow by copy-on-read (a warning then
    names the fix). See NOTE [ Memory budget ] in ``search/budget.py``.

    ``native_threads``: the native thread pools (numpy's OpenBLAS/MKL, OpenMP, OpenCV, numexpr) inside each worker,
    never the main process's. None (default): limited to the worker's share of the usable CPUs, one left to the main
    process (``max(1, (CPUs - 1) // num_workers)``), and when the serial trial shows native threads in use, the choice
    is measured without the limit too and the limit kept only when at least as fast; ``loader.tuning.native_threads``
    is the limit (None: none).
    An int N limits every worker's pools to N threads; False leaves them alone. Your ``worker_init_fn`` runs after
    the limit, so its own limits win. Needs ``threadpoolctl`` for the BLAS/OpenMP pools (``autoloader[native]``);
    without it only OpenCV, numexpr and libraries loaded later are limited. See NOTE [ Native thread pools ] in
    ``loader/native.py``.
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
                              key=key, distributed=distributed, threads=threads, memory_budget=memory_budget,
                              native_threads=native_threads, dataloader_kwargs=dataloader_kwargs)
    profile = with_saved_disk(dataclasses.replace(probe_machine(disk=False, gpus=False), gpus=remembered_gpus()))
    if request.group is not None:
        profile = request.group.share_profile(profile)
    online_why = _not_online(request)
    if tuning == "online" and online_why:
        raise ValueError(f"tuning='online' cannot serve this loader: {online_why}; use tuning='trials'")
    slot = Slot.find(request, profile, resolve_cache(cache))
    result = slot.fallback or (None if refresh else slot.look_up())
    in_cache = result is not None and result.source == "cache"
    search_online = result is None and not online_why and (tuning == "online" or request.step is None and
                                                           tuning == "auto")
    if result is None and not search_online:
        result = _tune(request, profile)
        in_cache = slot.store(result)
    if not online_why and slot.fallback is None and (search_online or (retune and tuning != "trials")):
        search = OnlineSearch.create(request, profile, slot=slot, decision=result)
        source: Any = OnlineLoader(request, search, retune=retune)
        result, cache_key = None, slot.key
    else:
        assert result is not None  # a miss was tuned above unless it is searched online (the branch before)
        source, cache_key = request.data_loader(result.config), slot.key if in_cache else None
    loader = PrefetchLoader(source, device=request.device, tuning=result, cache_key=cache_key,
                            single_process=request.unsharded, **request.transform)
    result = loader.tuning
    assert result is not None  # a result, or the online source's decision in force
    node = request.group.node if request.group is not None else None
    log.info("autoloader%s: %s, %s samples/s, bottleneck %s, from %s, %.2f s",
             f" ({node.label})" if node is not None and node.count > 1 else "", result.config.label(),
             "unknown" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}",
             result.bottleneck or "unknown", result.source, time.perf_counter() - started)
    return loader


def _tune(request: Request, profile: MachineProfile) -> TuneResult:
    """Run the trials (on every rank of the node together); a failure of autoloader's own falls back with a warning."""
    group = request.group
    try:
        result = tune_with(request, profile)
    except TuningError as err:
        warn_user(f"autoloader could not tune ({err}); using a safe default configuration")
        result = fallback_result(request.fixed, device=request.device, reason=str(err),
                                 threads=request.fixed_threads, native_threads=fallback_limit(request, usable_cpus=usable_cpus(profile)))
    return result if group is None else group.broadcast(result, point="tuned decision")


def _not_online(request: Request) -> str:
    """Why this loader cannot be tuned online (empty when it can)."""
    if isinstance(request.dataset, IterableDataset):
        return "an IterableDataset's stream cannot be split exactly between candidate loaders"
    if "num_workers" in request.fixed:
        return f"num_workers={request.fixed['num_workers']} is fixed"
    if request.max_workers == 0:
        return "max_workers=0 leaves nothing to tune"
    return ""
