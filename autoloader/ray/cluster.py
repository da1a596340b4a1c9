"""The Ray cluster's shape (what a decision is cached under) and the store of Ray decisions: one JSON file per key in
the ``ray/`` folder of autoloader's cache directory, written atomically, a bad entry a miss with a warning.

``cluster_shape`` asks the cluster (within ``waits.QUERY``); a cluster with no CPU (an autoscaling cluster at its
minimum size, or a head started with ``--num-cpus=0`` and no worker yet) is asked for one CPU through the autoscaler
(``ray.autoscaler.sdk.request_resources``) and waited for within ``waits.NODES``, then named with the fix.

The shape is the cluster's, not one machine's: its alive nodes, their CPUs and GPUs, and the names of custom
resources; never a node's address or id, so two clusters of the same shape share decisions (NOTE [ What the cache
key covers ] in cache/fingerprint.py says what else the key holds)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional

import torch

from .._fs import atomic_write_json
from ..cache.fingerprint import cache_key
from ..errors import warn_user
from .records import RayTuning
from .waits import NODES, QUERY, Limit, bounded

log = logging.getLogger("autoloader.ray")

SCHEMA = 2
"""Version of the entries: 2 since the pool may hold every CPU and batches travel as arrays (older entries miss)."""
_PLAIN = {"CPU", "GPU", "memory", "object_store_memory"}
POLL_S = 1.0
"""Seconds between two looks at a cluster waiting for its first CPU node."""


def shape_of(nodes: Iterable[Mapping[str, Any]]) -> Dict[str, Any]:
    """The shape of a cluster from ``ray.nodes()``: alive nodes, total CPUs and GPUs, each node's CPUs (sorted), and
    the custom resource names (a node's own ``node:<ip>`` resource and accelerator labels left out)."""
    alive = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    resources = [dict(n.get("Resources") or {}) for n in alive]
    custom = sorted({name for r in resources for name in r
                     if name not in _PLAIN and not name.startswith(("node:", "accelerator_type:"))})
    per_node = sorted((float(r.get("CPU", 0.0)) for r in resources), reverse=True)
    return {"nodes": len(alive), "cpus": sum(per_node), "gpus": sum(float(r.get("GPU", 0.0)) for r in resources),
            "node_cpus": per_node, "resources": custom}


def cluster_shape(ray: Any, *, nodes: Limit = NODES) -> Dict[str, Any]:
    """The cluster's shape once it has a CPU (see the module docstring): at once when it has one; else after asking
    the autoscaler for one and waiting at most ``nodes`` (a ``Limit``); a TimeoutError naming the limit and the fix."""
    shape = shape_of(bounded(QUERY, ray.nodes, detail="ray.nodes()"))
    if shape["cpus"] > 0:
        return shape
    started = time.monotonic()
    log.info("the Ray cluster has no CPU: asking the autoscaler for one and waiting up to %g s", nodes.seconds)
    _request_cpus(ray, 1)
    try:
        while shape["cpus"] <= 0:
            if time.monotonic() - started >= nodes.seconds:
                raise nodes.error(f"{shape['nodes']} node(s) alive, 0 CPUs")
            time.sleep(min(POLL_S, max(0.0, nodes.seconds - (time.monotonic() - started))))
            shape = shape_of(bounded(QUERY, ray.nodes, detail="ray.nodes()"))
    finally:
        _request_cpus(ray, 0)
    log.info("the Ray cluster got %g CPUs after %.1f s", shape["cpus"], time.monotonic() - started)
    return shape


def _request_cpus(ray: Any, cpus: int) -> None:
    """Ask Ray's autoscaler for ``cpus`` CPUs (0: withdraw the request); nothing where there is no autoscaler SDK."""
    try:
        from ray.autoscaler.sdk import request_resources
    except ImportError:
        return
    bounded(QUERY, lambda: request_resources(num_cpus=cpus), detail="asking the autoscaler for CPUs")


def ray_key(*, dataset_fp: dict, batch_size: int, loader_kwargs: Mapping[str, Any], step: Any, device_type: str,
            shape: Mapping[str, Any], extra: Mapping[str, Any]) -> str:
    """The cache key of a Ray decision: the DataLoader key's parts with the cluster's shape as the machine."""
    machine = {"ray_cluster": dict(shape), "torch": torch.__version__}
    return cache_key(dataset_fp=dataset_fp, batch_size=batch_size, loader_kwargs=loader_kwargs, step=step,
                     device_type=device_type, machine_fp=machine, extra={"engine": "ray", **extra})


class RayCache:
    """Ray decisions stored as ``<cache directory>/ray/<key>.json`` (``directory`` is the cache directory)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory) / "ray"

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> Optional[RayTuning]:
        """The cached decision (``source="cache"``), or None: absent, or bad (then with an ``AutoloaderWarning``)."""
        path = self.path_for(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("key") != key:
                raise ValueError(f"it is not a schema-{SCHEMA} Ray entry for key {key}")
            return RayTuning.from_dict(data["result"]).with_source("cache")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as err:
            warn_user(f"ignoring the autoloader Ray cache entry {path} ({type(err).__name__}: {err}); tuning again "
                      f"and replacing it")
            return None

    def put(self, key: str, tuning: RayTuning) -> bool:
        """Store ``tuning`` under ``key``; False (with a warning) when the directory cannot be written."""
        try:
            atomic_write_json(self.path_for(key), {"schema": SCHEMA, "key": key, "result": tuning.to_dict()})
        except OSError as err:
            warn_user(f"could not write the autoloader Ray cache entry {self.path_for(key)} ({err}); the next run "
                      f"tunes again. Set AUTOLOADER_CACHE_DIR to a writable directory, or pass cache=False")
            return False
        log.debug("ray cache write: %s", self.path_for(key))
        return True
