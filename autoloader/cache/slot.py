"""Where one request's tuning lives in the cache (each node leader's store only, under the node's hardware key: see
NOTE [ One decision across ranks ] in distributed.py), and whether it is there and still fits this machine today.
Decisions flow into it (``store``); it calls nothing back."""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from ..probe import MachineProfile
from ..request import Request
from ..results import TuneResult
from ..search.memory import no_longer_fits, resolve_budget
from ..search.bounds import worker_bounds
from .fingerprint import (batch_signature, cache_key, dataset_fingerprint, dataset_length, machine_fingerprint,
                          same_batches, step_descriptor)
from .store import TuneCache

log = logging.getLogger("autoloader")


class Slot:
    """The cache entry of ``request`` on the machine ``profile`` describes: ``key`` (None without a cache). Its
    batches are checked against the entry's at the first batch served (``observe``: NOTE [ What the cache key
    covers ] in fingerprint.py)."""

    def __init__(self, request: Request, profile: MachineProfile, store: Optional[TuneCache],
                 key: Optional[str]) -> None:
        self.request, self.profile, self.key = request, profile, key
        group = request.group
        self.cache = store if group is None or group.is_leader else None
        self.signature: Optional[dict] = None
        """The first served batch's ``batch_signature``, once seen (kept with every entry stored after it)."""
        self._entry = False  # the entry under ``key`` holds this run's result (looked up or stored)
        self._expected: Any = None  # the signature the looked-up entry holds, None when it holds none

    @classmethod
    def find(cls, request: Request, profile: MachineProfile, store: Optional[TuneCache]) -> "Slot":
        """The slot of ``request``: its key reads no sample (NOTE [ Nothing before iter() ] in loader/lazy.py)."""
        if store is None:
            return cls(request, profile, None, None)
        kwargs, transform = request.loader_kwargs, request.transform
        key = cache_key(
            dataset_fp=dataset_fingerprint(request.dataset, key=request.key), batch_size=request.loader_batch_size,
            loader_kwargs=kwargs, step=request.step, device_type=request.device.type,
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
            found = self.cache.lookup(self.key, max_workers=bounds.cap)
            if found is not None:
                result, meta = found
                self._entry, self._expected = True, meta.get("batch")
        if result is not None:
            budget = resolve_budget(self.request.memory_budget, self.profile.memory).bytes
            reason = no_longer_fits(result, budget_bytes=budget, shm_free_bytes=self.profile.shm.free_bytes)
            if reason is not None:
                log.info("cached config %s no longer fits (%s); tuning again", result.config.label(), reason)
                result, self._entry = None, False
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
        meta: dict = {"dataset": type(request.dataset).__qualname__, "len": dataset_length(request.dataset),
                "key": request.key, "batch_size": request.loader_batch_size, "step": step_descriptor(request.step),
                "device": request.device.type, "shuffle": request.shuffle}
        if self.signature is not None:
            meta["batch"] = self.signature
        stored = self.cache.put(self.key, result, meta=meta) is not None
        self._entry, self._expected = stored, self.signature
        return stored

    def observe(self, batch: Any) -> None:
        """The first batch served: kept as the entry's signature, or, on a hit whose entry was tuned on batches that
        look otherwise, the entry removed (it serves this run; the next one tunes again)."""
        self.signature = batch_signature(batch)
        if self.cache is None or self.key is None or not self._entry:
            return
        if self._expected is None:
            self.cache.annotate(self.key, batch=self.signature)
        elif not same_batches(self._expected, self.signature):
            log.info("autoloader: the cached tuning %s was made for batches unlike these (%s, not %s); it serves this "
                     "run, and the next run tunes again (name the dataset with key= to keep one entry per dataset)",
                     self.key, _bytes(self._expected), _bytes(self.signature))
            self.cache.remove(self.key)
            self._entry = False
        self._expected = self.signature


def _node_facts(group: Any) -> dict:
    """What a node adds to the key: the ranks sharing it (``world``) and, with several ranks, its usable CPUs before
    they were split (two nodes whose ranks each get one CPU, out of 2 or of 1, are not alike). Identical nodes get
    identical facts (never the hostname or node index), so they share an entry."""
    if group is None:
        return {"world": None}
    if group.local_world_size <= 1:
        return {"world": group.local_world_size}
    return {"world": group.local_world_size, "node_cpus": group.node_cpus}


def _bytes(signature: Any) -> str:
    size = signature.get("bytes") if isinstance(signature, dict) else None
    return f"{size:,} bytes a batch" if isinstance(size, int) else "another structure"


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
