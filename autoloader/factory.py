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

    Like a DataLoader's constructor it reads nothing of the dataset and starts no process: the cache lookup and any
    tuning happen at the first ``iter()`` (with ``tuning="trials"``, here). On a miss (or ``refresh=True``) the
    configuration (``num_workers``, ``prefetch_factor``, ``pin_memory``, ``persistent_workers``, threads, native
    thread pools) is found by measuring candidates, each a real DataLoader with your arguments: online, in your own
    loop during the first epoch, or by short trials (``tuning``). The choice is the fewest workers (then threads,
    worker memory, ``prefetch_factor``) within 5 % of the best measured rate, within the memory budget, and it is
    cached per dataset and machine. Tuning leaves your RNG states (torch's, Python's and numpy's global ones, your
    ``generator``) exactly as they were: the batches equal a plain ``DataLoader``'s with the same arguments and seed.

    How: the machine is probed (usable CPUs under affinity and cgroup quota, cgroup-aware memory, free ``/dev/shm``,
    GPUs without initialising CUDA, ``ulimit -n``). Online, the first samples' cost starts the prior's workers inside
    the first batch (the cores rule for CPU-bound loading, more when it waits, no more than meet the step once it is
    timed), each candidate's window closes when its rate is known or at a few per cent of the epoch, and the search
    jumps by Little's law, at most three times (NOTE [ Online convergence ] in ``autoloader/search/online_policy.py``);
    trials start from the ``num_workers=0`` candidate, double while that pays and bisect down. ``prefetch_factor`` is
    tried only when the step waits on a loader that keeps up on average, ``pin_memory`` only for CUDA;
    ``persistent_workers`` is on unless the workers would hold more than half the memory budget (or outgrow it in
    time). Only a candidate's steady state is timed (NOTE [ Trial timing ] in ``autoloader/measure/run.py``). No
    candidate starts whose measured memory exceeds the budget or whose batches overflow ``/dev/shm``: forked workers
    are measured at their first batch and stop there when over it. Under ``torch.distributed`` the ranks of a node
    tune together and agree on one configuration (NOTE [ One decision across ranks ] in distributed.py).

    A candidate that fails (a worker killed by the out-of-memory killer, a bus error from a full ``/dev/shm``, a
    trial past its time limit, too many open files) is recorded in ``loader.tuning.trials`` with ``status="failed"``
    and the reason, and the search goes on; if none works you get ``num_workers=0`` and an ``AutoloaderWarning``.
    Your dataset's and ``collate_fn``'s exceptions reach you unchanged from ``next()``, and the next ``next()`` goes on
    with the following batch, as a DataLoader's; trials that meet one fall back (not cached) with a warning, except
    ``tuning="trials"``, which raises it here, as it does your ``step``'s and Ctrl-C.

    Args:
        dataset: What to load: a map-style ``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``; tuned
            online or with trials, not when empty) or an ``IterableDataset`` (tuned with trials, never re-tuned, never
            sharded by autoloader: split its stream by ``torch.utils.data.get_worker_info()`` in ``__iter__``; one
            that says how many shards it reads, such as WebDataset or a streaming ``datasets`` dataset, is never
            given more workers than shards).
        batch_size (int): Samples per batch, an int >= 1 (default 1), or None when the dataset yields ready batches,
            as ``DataLoader``'s. Leave it 1 with ``batch_sampler=``.
        shuffle (bool): Reshuffle the samples every epoch (default None: no), as ``DataLoader``'s: not with
            ``sampler=`` nor an ``IterableDataset``; an ``IterDataPipe``'s shufflers follow it.
        step: What trials are timed against (online tuning needs none: your own loop is the step). None (default):
            the copy to the device only. A number of seconds >= 0: a simulated step of that long per batch (a
            GPU-side sleep on CUDA, ``time.sleep`` on the CPU: both leave the host CPU free, as a real GPU step
            does). A callable: called with each batch already on the device, e.g. your real forward and backward; it
            runs a few dozen times during tuning. With a ``step``, ``tuning="auto"`` tunes with trials.
        device: Where batches go: a ``torch.device`` or a name such as ``"cuda"``, ``"cuda:1"`` or ``"cpu"``.
            Default None: the current CUDA device when CUDA is available, else ``"cpu"``. Resolved once to
            ``cuda:{index}``; under a process group the current CUDA device must be the one ``LOCAL_RANK`` names
            (``torch.cuda.set_device(local_rank)`` first).
        normalize: ``(mean, std)``, one number per channel in the input's own units (0-255 for uint8 images),
            applied on the device to the input tensor after ``dtype``: ``(x - mean) / std``. Default None: none. An
            integer input needs a floating ``dtype``.
        dtype (torch.dtype): The input tensor is converted to it on the device, e.g. ``torch.float32`` for uint8
            images (which then cross the bus at a quarter of the float32 size). Default None: unchanged.
        input_key: For mapping (dict) batches, the key of the input tensor that ``normalize`` and ``dtype`` apply
            to, required with them (e.g. ``"pixel_values"``). Otherwise the input is the batch itself when it is a
            tensor, else its first element. Every other tensor is moved to the device unchanged.
        tuning (str): How a configuration is found when the cache holds none: ``"online"``: the first epoch is
            served by a sequence of candidate DataLoaders, each measured on your own loop, yielding exactly the
            batches a plain ``DataLoader`` would (same samples, order and boundaries, your RNG untouched); map-style
            datasets only, not with ``num_workers`` fixed or ``max_workers=0``. ``"trials"``: short trials timed
            against ``step`` (typically 3-12 s, within ``budget``) before this returns. ``"auto"`` (default):
            ``"online"`` for a map-style dataset without ``step``, else trials at the first ``iter()``.
        retune (bool): True (default): after an epoch run with the decision whose rate or stall moved away from the
            decision's (the loop waited for data 10 % of the epoch or more, or the epoch ran more than 15 % slower
            or faster), or that hardly waited for data with more than one worker, the next epoch searches again,
            online, from the configuration in force (``loader.decisions`` says which rule fired). Not with
            ``tuning="trials"`` nor for an ``IterableDataset``. False freezes the first decision.
        cache: Where the choice is kept: True (default: ``$AUTOLOADER_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/autoloader``, else ``~/.cache/autoloader``), False (no cache), or a directory (a str
            or ``os.PathLike``). One JSON file per key (NOTE [ What the cache key covers ] in
            ``autoloader/cache/fingerprint.py``: the dataset's fingerprint or ``key``, ``batch_size``, the
            ``collate_fn``/``sampler``/``batch_sampler`` classes, ``drop_last``, the step, the device type, the knobs
            you fixed, the transform, and the machine, not its hostname), written atomically, validated on every
            read, no pickle: a corrupt entry is a miss with an ``AutoloaderWarning``, an unwritable directory costs
            only the caching. A hit costs a probe; a hit whose first batch looks unlike the entry's (another
            structure, twice the bytes) is tuned again next run, as is one whose workers no longer fit today's
            memory or ``/dev/shm``. Each online decision replaces the entry; one where every worker count failed is
            not cached.
        refresh (bool): True tunes again and replaces the cached result. Default False.
        budget (float): Seconds the trials may take, > 0. Default None: 30 s (typically 3-12 s are used). When it
            runs out the best found so far is chosen, at most one trial's time limit later. Each trial has a
            wall-clock limit and its stuck workers are terminated (the limit uses ``SIGALRM``: called from another
            thread than the main one, or under a ``SIGALRM`` handler of yours, a blocking ``num_workers=0`` trial
            cannot be cut). Online tuning has no limit of its own: a dataset that blocks, blocks your loop.
        max_workers (int): The most worker processes ever tried, an int >= 0 (0: load in the main process only).
            Default None: as many as the usable CPUs and the open-files limit (``ulimit -n // 32``) allow.
        key (str): A name for the dataset in the cache key, instead of its fingerprint (its class, ``len()``, its
            ``root``). Give two datasets that fingerprint alike (e.g. two Arrow datasets of the same length) their
            own names. Default None.
        distributed (bool): None (default) follows ``torch.distributed.is_initialized()``; True requires an
            initialised process group; False never shards. When distributed, a ``DistributedSampler`` shards the
            data across every rank (unless you pass a ``sampler``, ``batch_sampler`` or an ``IterableDataset``),
            seeded from your ``generator`` (else 0); each rank gets its share of its node's CPUs, memory and
            ``/dev/shm``; the node's ranks tune together and agree on one configuration; the node leader alone
            reads and writes the cache. Call it on every rank with the same arguments, after
            ``init_process_group``.
        threads: Threads fetching each batch's samples inside every loading process (the main one with
            ``num_workers=0``, else each worker): for data that waits (network, object storage), far less memory
            than processes. False (default): none. True: the tuner decides; when the serial candidate mostly waits,
            processes x threads candidates are measured first and kept when they win within 5 %. An int N >= 1: N
            threads per process (1: none). Map-style datasets only, and ``__getitem__`` must be thread-safe (open a
            file handle per thread, e.g. in a ``threading.local()``). ``loader.dataset`` is then an
            ``autoloader.ThreadedDataset``; ``autoloader.unwrap(loader.dataset)`` gives yours back.
        memory_budget: What the loader may add to memory (its workers' private memory and their growth, batches in
            flight, pinned copies, thread buffers): bytes as an int >= 1 (e.g. ``8 * 2**30``), or a float fraction
            in (0, 1] of the memory available to this process (the machine's available memory or the cgroup's
            headroom, whichever is smaller, divided among the ranks of a node). Default None: 0.5. A candidate that
            would exceed it is not tried, and the choice stays within it, also as forecast for the end of an epoch
            when workers grow by copy-on-read (an ``AutoloaderWarning`` then names the fix). NOTE [ Memory budget ]
            in ``autoloader/search/budget.py``.
        native_threads: The BLAS, OpenMP, OpenCV and numexpr thread pools inside each worker, never the main
            process's. None (default): limited to each worker's share of the usable CPUs, one left to the main
            process (``max(1, (CPUs - 1) // num_workers)``); when the serial candidate shows native threads in use,
            the choice is also measured without the limit, which is kept only when at least as fast. An int N >= 1:
            every worker's pools limited to N threads, never measured without. False: the pools are left alone.
            Your ``worker_init_fn`` runs after the limit, so its own limits win. The BLAS and OpenMP pools are seen and
            limited with ``threadpoolctl`` (a dependency). NOTE [ Native thread pools ] in
            ``autoloader/loader/native.py``.
        engine (str): Who loads the batches: ``"dataloader"`` (default: DataLoader worker processes on this
            machine) or ``"ray"``: Ray Data tasks, on this machine or a Ray cluster (``pip install
            "autoloader[ray]"``), the order still autoloader's (the same batches as a plain DataLoader, exact
            resume), the pool tuned against ``step`` with trials and cached under the cluster's shape (NOTE [ Exact
            batches through Ray ] in ``autoloader/ray/source.py``; README "Ray Data"). Not with ``tuning="online"``,
            ``threads``, ``native_threads``, ``memory_budget``, an ``IterableDataset`` or worker-process keywords;
            ``max_workers`` caps the tasks, ``timeout`` the seconds to wait for one batch. ``loader.tuning`` is then
            an ``autoloader.ray.records.RayTuning``.
        address (str): With ``engine="ray"``: the Ray cluster to join (``"HOST:6379"``, ``"auto"``). Default None:
            ``RAY_ADDRESS``, else a Ray already initialised in this process, else a local Ray that autoloader starts
            and shuts down (``autoloader.ray.shutdown()``, or at exit). Required under torchrun (one cluster, one
            driver per rank).
        **dataloader_kwargs: Every other ``torch.utils.data.DataLoader`` argument (``collate_fn``, ``sampler``,
            ``batch_sampler``, ``drop_last``, ``worker_init_fn``, ``generator``, ``multiprocessing_context``,
            ``timeout``, ...), passed unchanged to every DataLoader built. ``num_workers``, ``prefetch_factor``,
            ``pin_memory`` or ``persistent_workers`` given here are never overridden; the other knobs are still
            tuned.

    Returns:
        PrefetchLoader: The loader. Iterate it as a DataLoader: batches come already on ``device``, converted and
        normalised. ``loader.tuning`` is the ``TuneResult`` in force (``source="pending"`` before the first ``iter()``;
        ``print`` it for what was chosen, why, each candidate's measurements); ``loader.decisions`` every online
        decision; ``loader.stats`` and ``loader.history`` how long the loop waited for data; ``loader.loader`` the
        DataLoader in force; ``loader.cache_key`` the cache entry; ``state_dict()`` and ``load_state_dict()``
        checkpoint and resume it exactly. ``help(autoloader.PrefetchLoader)`` describes each.

    Raises:
        TypeError: An argument of the wrong type, before any work: e.g. ``step="fast"``, ``threads="8"``,
            ``cache=1``, ``timeout="5"``, a ``dataset`` without ``__getitem__`` and ``__len__``, or a keyword that is
            neither make_loader's nor a DataLoader argument (``num_worker=``). The message names the argument, its
            value and the fix. DataLoader's own rules raise the type DataLoader raises.
        ValueError: A bad value, before any work: ``batch_size=0`` or ``8.0``, ``budget<=0``, ``max_workers<0``, a
            negative ``step`` or ``timeout``, ``shuffle=True`` with a ``sampler``, a ``batch_sampler`` with
            ``batch_size``/``shuffle``/``sampler``/``drop_last``, a ``tuning`` not in ``("auto", "online",
            "trials")``, ``tuning="online"`` for a loader that cannot be tuned online, ``memory_budget`` or
            ``native_threads`` out of range, ``threads`` with an ``IterableDataset``; with ``spawn``/``forkserver``
            workers, a dataset, ``collate_fn`` or ``worker_init_fn`` that cannot be pickled (named down to the
            attribute); ``distributed=True`` without a process group; ranks that disagree on ``batch_size``, the
            dataset's length, ``shuffle`` or ``drop_last``; a current CUDA device other than ``LOCAL_RANK``'s.
        ImportError: ``engine="ray"`` without Ray Data installed (``pip install "autoloader[ray]"``).
        ConnectionError: ``engine="ray"`` and no Ray cluster answers at ``address`` (the message names the fix).
        RuntimeError: Later, from iterating the loader: it was made before ``torch.distributed`` was initialised
            (so it is not sharded) and is iterated by several processes (call ``make_loader`` after
            ``init_process_group``, or pass ``distributed=False``); or Accelerate's ``prepare`` shards its
            ``.loader`` a second time (prepare the ``PrefetchLoader`` itself).

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
    tune on a miss (trials; online, the source searches as it serves), store the result."""
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
