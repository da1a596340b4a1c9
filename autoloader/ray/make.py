"""``make_loader(..., engine="ray")``: the arguments checked, the data sharded as for DataLoaders, this process's Ray
session opened (NOTE [ Who owns Ray ] in session.py), the pool looked up in the cache under the cluster's shape or
tuned against the step, and the ``PrefetchLoader`` over a ``RaySource`` returned."""
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
from .cluster import RayCache, ray_key, shape_of
from .records import RayTuning
from .session import import_ray, open_session
from .source import RaySource
from .trials import Bench, measure_costs, tune_pool

log = logging.getLogger("autoloader.ray")

WAIT_S = 120.0
"""The most seconds the loop waits for one batch from Ray, unless ``timeout=`` says otherwise; with the block's own
time on top."""
BUDGET_S = 30.0


def make_ray_loader(arguments: Mapping[str, Any]) -> PrefetchLoader:
    """``make_loader``'s arguments (its ``locals()``) with ``engine="ray"``: see its docstring."""
    started = time.perf_counter()
    check_ray_arguments(arguments)
    kwargs = dict(arguments["dataloader_kwargs"])
    timeout = kwargs.pop("timeout", 0)
    request = _request(arguments, kwargs)
    group = request.group
    address = arguments["address"]
    if group is not None and group.world_size > 1 and address is None and not os.environ.get("RAY_ADDRESS"):
        raise ValueError("engine='ray' under torchrun: every rank joins one Ray cluster as its own driver; start it "
                         "with `ray start --head --port=6379` and pass address='HOST:6379' (or set RAY_ADDRESS)")
    template = request.data_loader(LoaderConfig(0))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    open_session(address, num_cpus=cpus)
    ray = import_ray()
    shape = shape_of(ray.nodes())
    source = RaySource(template, _placeholder(shape), address=address, num_cpus=cpus, wait_s=WAIT_S,
                       pin=request.device.type == "cuda")
    tuning, key = _decide(request, arguments, source, shape, wait_s=float(timeout) if timeout else None)
    source.use(tuning, wait_s=float(timeout) if timeout else WAIT_S + 20 * (tuning.serial_s_per_batch or 0.0)
               * tuning.config.batches_per_task)
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


def _placeholder(shape: Dict[str, Any]) -> RayTuning:
    from .records import RayConfig

    return RayTuning(RayConfig(1), None, "fixed", cluster=shape, reason="not tuned yet")


def _decide(request: Request, arguments: Mapping[str, Any], source: RaySource, shape: Dict[str, Any], *,
            wait_s: Optional[float]) -> Tuple[RayTuning, Optional[str]]:
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
    tuning = _tune(request, source, shape, drivers=world, wait_s=wait_s)
    if group is not None and world > 1:
        tuning = RayTuning.from_dict(all_gather(tuning.to_dict(), size=world)[0])
    if cache is not None and key is not None and leader and tuning.source == "tuned":
        cache.put(key, tuning)
    return tuning, key


def _tune(request: Request, source: RaySource, shape: Dict[str, Any], *, drivers: int,
          wait_s: Optional[float]) -> RayTuning:
    ray = import_ray()
    session = open_session(source.address, num_cpus=source.num_cpus)
    consumer = Consumer(request.step, request.device)
    costs, _ = measure_costs(source.template, consumer, request.device)
    bench = Bench(ray, source.payload.ref(ray, session), source.template, consumer,
                  wait_s if wait_s is not None else WAIT_S + 20 * costs.serial_s)
    return tune_pool(bench, costs=costs, cluster=shape, drivers=drivers, budget=request.budget or BUDGET_S,
                     max_tasks=request.max_workers)
