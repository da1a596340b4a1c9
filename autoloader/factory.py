"""``make_loader`` in four steps: look up the cache, tune on a miss, store the result, build the loader."""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
import traceback
from typing import Any, Literal, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import IterableDataset

from ._validate import check_engine
from .cache import resolve_cache
from .cache.fingerprint import dataset_length
from .cache.slot import Slot
from .config import LoaderConfig, default_pin, make_config
from .errors import TuningError, warn_user
from .loader.lazy import LazySource, Resolved
from .loader.prefetch import PrefetchLoader
from .loader.source import PlainSource, Source
from .consumer import Step
from .probe import MachineProfile, probe_machine, remembered_gpus, with_saved_disk
from .request import Request
from .results import TuneResult
from .search.bounds import usable_cpus
from .search.native_policy import fallback_limit
from .search.candidates import fallback_result
from .supervise.deaths import watch_deaths
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
    shuffle: Optional[bool] = None,
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
    engine: Literal["dataloader", "ray"] = "dataloader",
    address: Optional[str] = None,
    **dataloader_kwargs: Any,
) -> PrefetchLoader:
    """Build a DataLoader tuned for this machine, dataset and training step, wrapped in a ``PrefetchLoader``.

    Like a DataLoader's constructor it reads nothing and starts no process: the cache lookup and any tuning happen at
    the first ``iter()`` (with ``tuning="trials"``, here). On a miss the knobs are found by measuring candidates, each
    a real DataLoader with your arguments, and the choice is cached per dataset and machine; your RNG states are left
    as they were, so the batches equal a plain ``DataLoader``'s. How it tunes: NOTE [ Online convergence ] in
    ``autoloader/search/online_policy.py`` and the NOTE blocks the README lists. A candidate that fails is recorded
    with its reason and the search goes on; your dataset's, ``collate_fn``'s and ``step``'s exceptions reach you
    unchanged. Tuning off: pass ``num_workers`` (and any knob you want fixed; the rest is tuned by short trials), or
    ``max_workers=0`` (no worker process, nothing tuned); a tuning you like is kept by the cache (``cache=True``).

    Args:
        dataset: A map-style ``Dataset`` (tuned online or with trials) or an ``IterableDataset`` (trials only, sharded
            by you across workers; never more workers than the shards it reports, ``autoloader/_shards.py``).
        batch_size (int): Samples per batch, >= 1 (default 1), or None for a dataset of ready batches, as DataLoader's.
        shuffle (bool): Reshuffle every epoch, as DataLoader's (default None: no).
        step: What trials are timed against: None (default: the copy to the device only), seconds per batch >= 0 (a
            simulated step), or your step, a callable run on each batch during the trials; with a ``step``,
            ``tuning="auto"`` tunes with trials.
        device: Where batches go (``"cuda:1"``, a ``torch.device``); default the current CUDA device, else the CPU.
        normalize: ``(mean, std)`` per channel in the input's units, applied on the device after ``dtype``. Default
            None: none.
        dtype (torch.dtype): What the input tensor becomes on the device (e.g. ``torch.float32``). Default unchanged.
        input_key: The key of the input tensor in dict batches, required with ``normalize`` or ``dtype``. Default
            None: the batch itself when it is a tensor, else its first element.
        tuning (str): ``"online"`` (your first epoch, exactly a DataLoader's batches; NOTE [ Online switching ]),
            ``"trials"`` (before training, within ``budget``) or ``"auto"`` (default: online unless a ``step``,
            an ``IterableDataset`` or a fixed ``num_workers``).
        retune (bool): Search again, online, after an epoch that moved away from the decision (the loop now waits
            for data, the rate moved, or fewer workers may do; the rule: ``autoloader/search/retune.py``). Default
            True; False freezes the first decision.
        cache: True (default: the directory ``$AUTOLOADER_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoloader``, else
            ``~/.cache/autoloader``), False (no cache), or a directory. The key is the dataset's class, length and
            root (or ``key``), your arguments and this machine (NOTE [ What the cache key covers ]): a new transform
            keeps the key; a first batch of another structure or size drops the entry, and online the re-tune rule
            sees the rate move, but a costlier transform of the same batches needs ``refresh=True`` or another
            ``key``.
        refresh (bool): Tune again and replace the cached result. Default False.
        budget (float): Seconds the trials may take, > 0 (default 30; NOTE [ Candidate time limit ]).
        max_workers (int): The most worker processes tried, >= 0. Default None: max(64, 8 x the usable CPUs), at most
            ``ulimit -n`` // 32, and never more than an ``IterableDataset``'s shards.
        key (str): The dataset's name in the cache key, instead of its fingerprint. Default None.
        distributed (bool): Default None: follows ``torch.distributed.is_initialized()``; True requires a process
            group; False never shards (NOTE [ One decision across ranks ]). Call it on every rank alike.
        threads: Threads per loading process: False (default), True (tuned) or an int (NOTE [ Threads inside workers ]).
        memory_budget: Bytes, or a fraction in (0, 1] of the available memory (default 0.5; NOTE [ Memory budget ]).
        native_threads: Each worker's native thread pools (BLAS, OpenMP): None (default: limited to the worker's
            share of the CPUs, kept only where it measures faster), an int N (fixed), or False (left alone; NOTE [
            Native thread pools ]).
        engine (str): ``"dataloader"`` (default: DataLoader worker processes on this machine) or ``"ray"``: Ray Data's
            tasks run ``dataset[i]`` and the collation, on this machine or a cluster's CPU nodes (``address``), and
            autoloader keeps the rest: the order, the batches a plain DataLoader yields, ``state_dict()`` and exact
            resume, the side-stream copies. It connects to (or starts) Ray and tunes the pool with trials against
            ``step`` in ``make_loader`` (cached under the cluster's shape). A batch whose ``__getitem__`` raised is
            raised at its ``next()`` and the epoch goes on. The engine's reference (clusters, torchrun, errors, limits,
            what it refuses): ``help(autoloader.ray.make.make_ray_loader)``.
        address (str): With ``engine="ray"``, the cluster to join (``"HEAD:6379"``). Default None: ``$RAY_ADDRESS``,
            else a local Ray that autoloader starts and shuts down.
        **dataloader_kwargs: Every other DataLoader argument, passed unchanged; a knob you set is never overridden.
            With ``engine="ray"``, ``timeout=<seconds>`` bounds each batch from Ray and ``runtime_env={...}`` (not a
            DataLoader argument) goes to the ``ray.init`` autoloader makes (``{"working_dir": "."}`` ships your code).

    Returns:
        PrefetchLoader: Iterate it as a DataLoader, batches on ``device``; ``loader.tuning`` (the ``TuneResult`` in
        force), ``decisions``, ``stats``, ``state_dict()``: ``help(autoloader.PrefetchLoader)``.

    Raises:
        TypeError: An argument of the wrong type, before any work; the message names it, its value and the fix:
            ``step="fast"``, ``threads="8"``, ``cache=1``, ``timeout="5"``, a dataset without ``__getitem__`` and
            ``__len__``, a keyword that is neither make_loader's nor DataLoader's (``num_worker=``).
        ValueError: A bad value or combination, before any work, named with the fix (where DataLoader refuses it,
            the message starts with DataLoader's own words): ``batch_size=0`` or ``8.0``, ``budget<=0``,
            ``max_workers<0``, a negative ``step`` or ``timeout``, ``shuffle=True`` with a ``sampler``, a
            ``batch_sampler`` with ``batch_size``/``shuffle``/``sampler``/``drop_last``, an unknown ``tuning``,
            ``tuning="online"`` for a loader that cannot be tuned online, ``memory_budget`` or ``native_threads`` out
            of range, ``threads`` with an ``IterableDataset``; with ``spawn``/``forkserver`` workers, a dataset,
            ``collate_fn`` or ``worker_init_fn`` that cannot be pickled (named down to the attribute);
            ``distributed=True`` without a process group; ranks that disagree on ``batch_size``, the dataset's
            length, ``shuffle`` or ``drop_last``; a current CUDA device other than ``LOCAL_RANK``'s.
        ImportError: ``engine="ray"`` without Ray Data installed (the ``ray`` extra: ``pip install ".[ray]"`` in a
            checkout).
        ConnectionError: ``engine="ray"`` and no Ray cluster answers at ``address``.
        TimeoutError: ``engine="ray"``: a wait on Ray ran past its limit (named in the message,
            ``autoloader/ray/waits.py``; ``timeout=`` sets the batches').
        RuntimeError: Later, from iterating: made before ``torch.distributed`` was initialised and iterated by several
            processes, or a ``.loader`` sharded again by Accelerate's ``prepare``.

    Example:
        loader = make_loader(train_set, batch_size=64, shuffle=True, drop_last=True)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:       # on the device; the first epoch tunes the loader as it trains
                train_step(images, labels)
        print(loader.tuning)                    # what was chosen, why, and what each candidate measured
    """
    check_engine(engine, address)
    if engine == "ray":  # Ray Data loads (autoloader/ray/, imported only here: importing autoloader never imports ray)
        from .ray.make import make_ray_loader
        return make_ray_loader(dict(locals()))
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
    online_why = _not_online(request)
    if tuning == "online" and online_why:
        raise ValueError(f"tuning='online' cannot serve this loader: {online_why}; use tuning='trials'")
    config = _stand_in(request)
    pending = TuneResult(config, None, None, "pending", reason="make_loader reads nothing before the first iter(), "
                                                              "which looks up the cache and tunes")
    source = LazySource(request.data_loader(config), functools.partial(
        _resolve, request, tuning=tuning, retune=retune, refresh=refresh, cache=cache), pending=pending)
    if tuning == "trials":
        source.prepare()  # as documented: the trials run here, and their errors are raised here
    return PrefetchLoader(source, device=request.device, single_process=request.unsharded, **request.transform)


def _stand_in(request: Request) -> LoaderConfig:
    """What the DataLoader answering before the first ``iter()`` is built with: the knobs the user fixed, else
    defaults (NOTE [ Nothing before iter() ] in loader/lazy.py)."""
    return make_config(int(request.fixed.get("num_workers", 0)), fixed=request.fixed,
                       pin_memory=default_pin(request.fixed, request.device.type), threads=request.fixed_threads)


def _resolve(request: Request, *, tuning: Tuning, retune: bool, refresh: bool, cache: CacheArg) -> Resolved:
    """The loader's source, at its first ``iter()`` (``tuning="trials"``: in ``make_loader``): look up the cache,
    tune on a miss (trials; online, the source searches as it serves), store the result. A worker's death in the
    epochs no signal guard watches is raised at a safe line from here on (``watch_deaths``)."""
    watch_deaths()
    started = time.perf_counter()
    profile = with_saved_disk(dataclasses.replace(probe_machine(disk=False, gpus=False), gpus=remembered_gpus()))
    if request.group is not None:
        profile = request.group.share_profile(profile)
    if dataset_length(request.dataset) == 0:
        empty = fallback_result(request.fixed, device=request.device, reason="the dataset is empty: nothing to tune",
                                threads=request.fixed_threads)
        return Resolved(PlainSource(request.data_loader(empty.config)), empty)
    online_why = _not_online(request)
    slot = Slot.find(request, profile, resolve_cache(cache))
    result = None if refresh else slot.look_up()
    in_cache = result is not None and result.source == "cache"
    search_online = result is None and not online_why and (tuning == "online" or request.step is None and
                                                           tuning == "auto")
    if result is None and not search_online:
        result = _tune(request, profile, lazy=tuning != "trials")
        in_cache = slot.store(result)
    if not online_why and (search_online or (retune and tuning != "trials")):
        search = OnlineSearch.create(request, profile, slot=slot, decision=result)
        source: Source = OnlineLoader(request, search, retune=retune)
        resolved = Resolved(source, None, slot.key, first_batch=slot.observe)
    else:
        assert result is not None  # a miss was tuned above unless it is searched online (the branch before)
        resolved = Resolved(PlainSource(request.data_loader(result.config)), result, slot.key if in_cache else None,
                            first_batch=slot.observe)
    _log(request, resolved.source.tuning if result is None else result, started)
    return resolved


def _log(request: Request, result: TuneResult, started: float) -> None:
    node = request.group.node if request.group is not None else None
    log.info("autoloader%s: %s, %s samples/s, bottleneck %s, from %s, %.2f s",
             f" ({node.label})" if node is not None and node.count > 1 else "", result.config.label(),
             "unknown" if result.samples_per_s is None else f"{result.samples_per_s:,.0f}",
             result.bottleneck or "unknown", result.source, time.perf_counter() - started)


def _tune(request: Request, profile: MachineProfile, *, lazy: bool) -> TuneResult:
    """Run the trials (on every rank of the node together); a failure of autoloader's own falls back with a warning,
    and so does, at the first ``iter()`` (``lazy``), the user's own error: the epoch then raises it where it reaches
    that sample, as a DataLoader would (NOTE [ Nothing before iter() ] in loader/lazy.py)."""
    group = request.group
    try:
        result = tune_with(request, profile)
    except Exception as err:  # noqa: B036 - autoloader's own (TuningError), or the user's when tuning lazily
        if not (lazy or isinstance(err, TuningError)):
            raise
        why = str(err) if isinstance(err, TuningError) else \
            f"a trial raised {_said(err)} (your dataset, collate_fn or step); the epoch " \
            f"raises the dataset's errors where it reaches them, as a DataLoader"
        warn_user(f"autoloader could not tune ({why}); using a safe default configuration, not cached")
        traceback.clear_frames(err.__traceback__)  # not raised: its frames would hold the trial's workers in a cycle
        result = fallback_result(request.fixed, device=request.device, reason=why, threads=request.fixed_threads,
                                 native_threads=fallback_limit(request, usable_cpus=usable_cpus(profile)))
    return result if group is None else group.broadcast(result, point="tuned decision")


def _said(error: BaseException) -> str:
    """``Type: message``; a worker's error re-raised by a DataLoader ends with that line."""
    message = str(error).strip()
    lines = message.splitlines()
    return lines[-1] if message.startswith("Caught ") and lines else f"{type(error).__name__}: {message}"


def _not_online(request: Request) -> str:
    """Why this loader cannot be tuned online (empty when it can)."""
    if isinstance(request.dataset, IterableDataset):
        return "an IterableDataset's stream cannot be split exactly between candidate loaders"
    if "num_workers" in request.fixed:
        return f"num_workers={request.fixed['num_workers']} is fixed"
    if request.max_workers == 0:
        return "max_workers=0 leaves nothing to tune"
    return ""
