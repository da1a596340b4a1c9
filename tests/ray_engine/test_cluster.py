"""The cluster's shape, the cache key under it and the store of Ray decisions (autoloader/ray/cluster.py)."""
import json

import pytest

from autoloader import AutoloaderWarning
from autoloader.ray.cluster import RayCache, ray_key, shape_of
from autoloader.ray.records import RayConfig, RayTuning

HEAD = {"Alive": True, "NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1",
        "Resources": {"CPU": 1.0, "memory": 1e9, "object_store_memory": 1e8, "node:10.0.0.1": 1.0,
                      "node:__internal_head__": 1.0}}
WORKER = {"Alive": True, "NodeID": "b" * 56, "NodeManagerAddress": "10.0.0.2",
          "Resources": {"CPU": 2.0, "GPU": 1.0, "memory": 2e9, "node:10.0.0.2": 1.0, "accelerator_type:T4": 1.0,
                        "decoder": 4.0}}
DEAD = {"Alive": False, "Resources": {"CPU": 64.0}}


def test_the_shape_is_alive_nodes_cpus_gpus_and_resource_names_never_addresses():
    shape = shape_of([HEAD, WORKER, DEAD])
    assert shape == {"nodes": 2, "cpus": 3.0, "gpus": 1.0, "node_cpus": [2.0, 1.0], "resources": ["decoder"]}
    moved = [dict(HEAD, NodeManagerAddress="10.9.9.9"), dict(WORKER, NodeID="c" * 56)]
    assert shape_of(moved) == shape  # another cluster of the same shape shares decisions


def _key(**shape_change):
    shape = {**shape_of([HEAD, WORKER]), **shape_change}
    return ray_key(dataset_fp={"key": "d"}, batch_size=8, loader_kwargs={}, step=0.01, device_type="cpu",
                   shape=shape, extra={"world": 1})


def test_the_key_changes_with_the_shape():
    assert _key() == _key() and len(_key()) == 32
    assert len({_key(), _key(nodes=3), _key(cpus=4.0), _key(resources=[])}) == 4


def _tuning():
    return RayTuning(RayConfig(2), 100.0, "tuned", shape_of([HEAD]))


def test_the_store_round_trips_and_a_bad_entry_is_a_miss_with_a_warning(tmp_path):
    cache = RayCache(tmp_path)
    key = _key()
    assert cache.get(key) is None
    assert cache.put(key, _tuning()) and cache.path_for(key).parent == tmp_path / "ray"
    assert cache.get(key) == _tuning().with_source("cache")
    cache.path_for(key).write_text(json.dumps({"schema": 1, "key": key, "result": {"config": {"tasks": 0}}}))
    with pytest.warns(AutoloaderWarning, match="Ray cache entry"):
        assert cache.get(key) is None
    cache.path_for(key).write_text("{")
    with pytest.warns(AutoloaderWarning):
        assert cache.get(key) is None
