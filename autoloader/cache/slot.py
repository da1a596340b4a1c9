"""Where one request's tuning lives in the cache (each node leader's store only, under the node's hardware key: see
NOTE [ One decision across ranks ] in distributed.py), and whether it is there and still fits this machine today.
Decisions flow into it (``store``); it calls nothing back."""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from ..errors import TrialTimeout, warn_user
from ..measure.failures import HARD_LIMIT_GRACE_S
from ..measure.signals import SignalGuard
from ..probe import MachineProfile
from ..request import Request
from ..results import TuneResult
from ..search import policy
from ..search.budget import resolve_budget
from ..search.bounds import usable_cpus, worker_bounds
from ..search.native_policy import fallback_limit
from ..search.candidates import fallback_result, trial_limit
from .fingerprint import cache_key, dataset_fingerprint, dataset_length, machine_fingerprint, step_descriptor
from .store import TuneCache

log = logging.getLogger("autoloader")


class Slot:
    """The cache entry of ``request`` on the machine ``profile`` describes: ``key`` (None without a cache), and
    ``fallback`` when even the cache key could not be made (a dataset whose first sample never comes)."""

    def __init__(self, request: Request, profile: MachineProfile, store: Optional[TuneCache], key: Optional[str],
                 fallback: Optional[TuneResult] = None) -> None:
        self.request, self.profile, self.key, self.fallback = request, profile, key, fallback
        group = request.group
        self.cache = store if group is None or group.is_leader else None

    @classmethod
    def find(cls, request: Request, profile: MachineProfile, store: Optional[TuneCache]) -> "Slot":
        if store is None:
            return cls(request, profile, None, None)
        timeout: Optional[TrialTimeout] = None
        try:
            fingerprint = _fingerprint_in_time(request.dataset, key=request.key, budget=request.budget)
        except TrialTimeout as err:
            timeout = err
        group = request.group
        if group is not None and group.coordinator().lookup(timeout is not None):
            timeout = timeout or TrialTimeout("reading one sample for the cache key timed out on another rank")
        if timeout is not None:  # on every rank of the node, or they would take different paths
            warn_user(f"autoloader could not tune: {timeout}; using a safe default configuration (pass "
                      f"num_workers=... to choose one)")
            return cls(request, profile, None, None,
                       fallback=fallback_result(request.fixed, device=request.device, reason=str(timeout),
                                                threads=request.fixed_threads,
                                                native_threads=fallback_limit(request,
                                                                              usable_cpus=usable_cpus(profile))))
        kwargs, transform = request.loader_kwargs, request.transform
        key = cache_key(
            dataset_fp=fingerprint, batch_size=request.batch_size, loader_kwargs=kwargs, step=request.step,
            device_type=request.device.type,
            machine_fp=machine_fingerprint(profile),
            extra={"fixed": _jsonable(request.fixed), "normalize": _jsonable(transform["normalize"]),
                   "dtype": _jsonable(transform["dtype"]), "input_key": _jsonable(transform["input_key"]),
                   "shuffle": request.shuffle, "max_workers": request.max_workers,
                   **_node_facts(request.group),
                   **({"threads": request.threads} if request.threads is not False else {}),
                   **({"native_threads": request.native_threads} if request.native_threads is not None else {})})
        return cls(request, profile, store, key)

    def look_up(self) -> Optional[TuneResult]:
        """The cached result when there is one and its workers fit in today's memory and /dev/shm; on every rank of
        the node (the node leader's lookup)."""
        result = None
        if self.cache is not None and self.key is not None:
            bounds = worker_bounds(self.profile, max_workers=self.request.max_workers, dataset=None)
            result = self.cache.get(self.key, max_workers=bounds.cap)
        if result is not None:
            budget = resolve_budget(self.request.memory_budget, self.profile.memory).bytes
            reason = policy.no_longer_fits(result, budget_bytes=budget,
                                           shm_free_bytes=self.profile.shm.free_bytes)
            if reason is not None:
                log.info("cached config %s no longer fits (%s); tuning again", result.config.label(), reason)
                result = None
        group = self.request.group
        return result if group is None else group.broadcast(result, point="cached decision")

    def store(self, result: TuneResult) -> bool:
        """Cache ``result`` when it is worth keeping; True when the entry under ``key`` now holds it (on ranks other
        than the node leader, which write nothing: when the leader was asked to write it)."""
        if self.key is None or not _worth_keeping(result):
            return False
        if self.cache is None:
            return True
        request = self.request
        return self.cache.put(self.key, result, meta={
            "dataset": type(request.dataset).__qualname__, "len": dataset_length(request.dataset),
            "key": request.key, "batch_size": request.batch_size, "step": step_descriptor(request.step),
            "device": request.device.type, "shuffle": request.shuffle}) is not None


def _node_facts(group: Any) -> dict:
    """What a node adds to the key: the ranks sharing it (``world``) and, with several ranks, its usable CPUs before
    they were split (two nodes whose ranks each get one CPU, out of 2 or of 1, are not alike). Identical nodes get
    identical facts (never the hostname or node index), so they share an entry."""
    if group is None:
        return {"world": None}
    if group.local_world_size <= 1:
        return {"world": group.local_world_size}
    return {"world": group.local_world_size, "node_cpus": group.node_cpus}


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
