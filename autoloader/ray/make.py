"""``make_loader(..., engine="ray")``: the arguments checked, the data sharded as for DataLoaders, this process's Ray
session opened (NOTE [ Who owns Ray ] in session.py), the cluster's shape read (waiting for a first CPU node when it
has none: cluster.py), the pool looked up in the cache under that shape or tuned against the step, and the
``PrefetchLoader`` over a ``RaySource`` returned.

Two keywords of ``make_loader``'s ``**dataloader_kwargs`` are the Ray engine's, never a DataLoader's:
``timeout=<seconds>``, the most any batch (a run's first included) and the wait for a first CPU node may take
(waits.py), and ``runtime_env={...}``, Ray's runtime environment for the Ray autoloader starts or joins
(``{"working_dir": "."}`` or ``{"py_modules": [...]}`` ships your code to every worker; NOTE [ Who owns Ray ]).

The Ray engine, in brief (README, Integrations, "Ray Data", in short): every batch is the one a plain DataLoader of
the same arguments yields, in its order, however many tasks run at once (NOTE [ Exact batches through Ray ] in
source.py); the pool is tuned against the step by short trials and cached under the cluster's shape (NOTE [ Sizing the
Ray pool ] in plan.py); an epoch's order goes to Ray as int64 arrays, a run at a time (order.py), and batches come back
as Arrow tables whose arrays are read in place and copied once (transport.py); a batch whose ``__getitem__`` or
``collate_fn`` raised is raised at its ``next()`` and the epoch goes on; a run that fails is named as what it was
(failures.py); every wait on Ray has a limit (waits.py)."""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Mapping, Optional, Tuple

from .._validate import check_ray_arguments
from ..cache import resolve_cache
from ..cache.fingerprint import dataset_fingerprint
from ..config import LoaderConfig
from ..coordination import all_gather
from ..loader.prefetch import PrefetchLoader
from ..consumer import Consumer
from ..request import Request
from . import plan
from .cluster import RayCache, cluster_shape, ray_key
from .records import RayTuning
from .session import import_ray, open_session
from .source import RaySource
from .trials import Bench, measure_costs, tune_pool
from .waits import BATCH, NODES, PER_BATCH_FACTOR, STARTUP, Limit

log = logging.getLogger("autoloader.ray")

BUDGET_S = 30.0


def make_ray_loader(arguments: Mapping[str, Any]) -> PrefetchLoader:
    """``make_loader``'s arguments (its ``locals()``) with ``engine="ray"``: the Ray engine's reference.

    Where: ``address=None`` joins ``$RAY_ADDRESS``, else starts a local Ray with this machine's usable CPUs (shut down
    with its files by ``autoloader.ray.shutdown()``, else at exit); ``address="HOST:PORT"`` joins that cluster as one
    more driver. A Ray you initialised is used as it is and never shut down; it is a ValueError when ``address``
    names another cluster, or with ``runtime_env`` (pass it to your ``ray.init``). ``runtime_env={...}`` goes to the
    ``ray.init`` autoloader makes: ``{"working_dir": "."}`` or ``{"py_modules": ["mypkg"]}`` ships your code to every
    worker, which must import the dataset's module (else ``MissingModule`` names it). Under torchrun every rank is a
    driver of its own on its ``DistributedSampler`` shard, sharing the cluster's CPUs; not Ray Data's
    ``streaming_split``, whose coordinator hands blocks to whichever rank asks next (which rank sees which sample,
    and in what order, is timing's, not the sampler's: no exact batches, no exact resume; and ``equal=True`` drops
    rows to even the shares).

    What it guarantees: every batch is the one a plain DataLoader of the same arguments yields, in its order, over
    reshuffled epochs, samplers and batch samplers, and ``state_dict()`` resumes exactly, however many tasks run at
    once (NOTE [ Exact batches through Ray ]); not random augmentation inside ``__getitem__`` (Ray's workers' RNGs
    are not seeded). A batch whose ``__getitem__`` or ``collate_fn`` raised is raised at its ``next()`` (the dataset's
    own exception, with a note naming the batch and the worker's traceback) and the epoch goes on. A worker or node
    that dies is retried ``failures.TASK_RETRIES`` times, then the epoch ends with an error naming what died.

    How: the pool (tasks, CPUs per task, block, read-ahead) is tuned in ``make_loader`` by short trials against
    ``step`` after a warm-up that starts its workers (kept as ``RayTuning.startup_s``, outside the rates and the
    budget), and cached under the cluster's shape (NOTE [ Sizing the Ray pool ]); Ray Data holds each run to the
    pool's CPUs.
    An epoch's order goes to Ray as int64 arrays a run at a time (the first run's before the first batch, the next
    ones drawn while the loop trains: the first batch of a 10^7-sample epoch in about a second here); batches come
    back as Arrow tables whose tensors and arrays are copied once, into memory of their own (tests/benchmarks/results/
    ray.md). A cluster with no CPU is asked for one and waited for; every wait has a limit (``waits``);
    ``timeout=<seconds>`` bounds each batch (a run's first included) and that wait.

    Not with an ``IterableDataset``, ``tuning="online"``, ``threads``, ``native_threads``, ``memory_budget`` or the
    worker keywords (``num_workers``, ``prefetch_factor``, ``pin_memory``, ``persistent_workers``,
    ``worker_init_fn``, ``multiprocessing_context``): ``max_workers`` caps the tasks.
    """
    started = time.perf_counter()
    check_ray_arguments(arguments)
    kwargs = dict(arguments["dataloader_kwargs"])
    timeout = kwargs.pop("timeout", 0)
    runtime_env = kwargs.pop("runtime_env", None)
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env must be a dict of Ray's runtime environment (e.g. {{'working_dir': '.'}}), got "
                        f"{runtime_env!r}")
    request = _request(arguments, kwargs)
    group = request.group
    address = arguments["address"]
    if group is not None and group.world_size > 1 and address is None and not os.environ.get("RAY_ADDRESS"):
        raise ValueError("engine='ray' under torchrun: every rank joins one Ray cluster as its own driver; start it "
                         "with `ray start --head --port=6379` and pass address='HOST:6379' (or set RAY_ADDRESS)")
    template = request.data_loader(LoaderConfig(0))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    open_session(address, num_cpus=cpus, runtime_env=runtime_env)
    ray = import_ray()
    shape = cluster_shape(ray, nodes=NODES.with_seconds(timeout) if timeout else NODES)
    source = RaySource(template, _placeholder(shape), address=address, num_cpus=cpus, runtime_env=runtime_env,
                       pin=request.device.type == "cuda")
    tuning, key = _decide(request, arguments, source, shape, timeout=float(timeout) if timeout else None)
    source.use(tuning, **limits(float(timeout) if timeout else None, tuning.serial_s_per_batch,
                                tuning.config.batches_per_task))
    loader = PrefetchLoader(source, device=request.device, cache_key=key, single_process=request.unsharded,
                            **request.transform)
    log.info("autoloader (ray): %s, from %s, %.2f s", tuning.config.label(), tuning.source,
             time.perf_counter() - started)
    return loader


def _request(arguments: Mapping[str, Any], kwargs: Dict[str, Any]) -> Request:
    max_workers = arguments["max_workers"]
    return Request.checked(arguments["dataset"], arguments["batch_size"], shuffle=arguments["shuffle"],
                           step=arguments["step"], device=arguments["device"], normalize=arguments["normalize"],
                           dtype=arguments["dtype"], input_key=arguments["input_key"], cache=arguments["cache"],
                           budget=arguments["budget"], max_workers=max_workers, key=arguments["key"],
                           distributed=arguments["distributed"], dataloader_kwargs=kwargs)


def limits(timeout: Optional[float], serial_s: Optional[float], block: int) -> Dict[str, Limit]:
    """The limits on a run's first batch (``startup``) and on each batch after it (``wait``): ``timeout`` for both
    when given, else ``waits.STARTUP`` and ``waits.BATCH``, each longer by ``PER_BATCH_FACTOR`` times a block's load
    time (``serial_s`` per batch, measured in the driver)."""
    if timeout:
        return {"startup": STARTUP.with_seconds(timeout), "wait": BATCH.with_seconds(timeout)}
    extra = PER_BATCH_FACTOR * (serial_s or 0.0) * block
    return {"startup": STARTUP.with_seconds(STARTUP.seconds + extra), "wait": BATCH.with_seconds(BATCH.seconds + extra)}


def _placeholder(shape: Dict[str, Any]) -> RayTuning:
    from .records import RayConfig

    return RayTuning(RayConfig(1), None, "fixed", cluster=shape, reason="not tuned yet")


def _decide(request: Request, arguments: Mapping[str, Any], source: RaySource, shape: Dict[str, Any], *,
            timeout: Optional[float]) -> Tuple[RayTuning, Optional[str]]:
    """The cached decision for this cluster shape, else trials on every rank (each as one of the cluster's drivers);
    under torchrun rank 0's, on every rank."""
    group = request.group
    world = group.world_size if group is not None else 1
    leader = group is None or group.rank == 0
    store = resolve_cache(arguments["cache"])
    cache = RayCache(store.directory) if store is not None else None
    key = None
    if cache is not None:
        key = ray_key(dataset_fp=dataset_fingerprint(request.dataset, key=request.key),
                      batch_size=request.batch_size, loader_kwargs=request.loader_kwargs, step=request.step,
                      device_type=request.device.type, shape=shape,
                      extra={"world": world, "shuffle": request.shuffle, "max_workers": request.max_workers,
                             "budget": request.budget})
    cached = cache.get(key) if cache is not None and key is not None and leader and not arguments["refresh"] \
        else None
    if group is not None and world > 1:
        found = all_gather(None if cached is None else cached.to_dict(), size=world)[0]
        cached = None if found is None else RayTuning.from_dict(found)
    if cached is not None:
        return cached, key
    tuning = _tune(request, source, shape, drivers=world, timeout=timeout)
    if group is not None and world > 1:
        tuning = RayTuning.from_dict(all_gather(tuning.to_dict(), size=world)[0])
    if cache is not None and key is not None and leader and tuning.source == "tuned":
        cache.put(key, tuning)
    return tuning, key


def _tune(request: Request, source: RaySource, shape: Dict[str, Any], *, drivers: int,
          timeout: Optional[float]) -> RayTuning:
    ray = import_ray()
    session = open_session(source.address, num_cpus=source.num_cpus, runtime_env=source.runtime_env)
    consumer = Consumer(request.step, request.device)
    costs, _ = measure_costs(source.template, consumer, request.device)
    bench = Bench(ray, source.payload.ref(ray, session), source.template, consumer,
                  **limits(timeout, costs.serial_s, plan.batches_per_task(serial_s=costs.serial_s,
                                                                          epoch_batches=len(source.template),
                                                                          tasks=1)))
    tuning = tune_pool(bench, costs=costs, cluster=shape, drivers=drivers, budget=request.budget or BUDGET_S,
                       max_tasks=request.max_workers)
    bench.ended()
    return tuning
