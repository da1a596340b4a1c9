"""The cluster's shape, the cache key under it and the store of Ray decisions (autoloader/ray/cluster.py); a cluster
with no CPU asks the autoscaler for one and waits within ``waits.NODES`` (then names the limit and the fix), each
question to it within ``waits.QUERY``. ``ray`` is a stand-in; a real head with no CPU is in
tests/integrations/ray_cluster_script.py."""
import json
import threading
import time

import pytest

from autoloader import AutoloaderWarning
from autoloader.ray import cluster as cluster_module
from autoloader.ray import waits
from autoloader.ray.cluster import RayCache, cluster_shape, ray_key, shape_of
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


class Nodes:
    """``ray.nodes()`` answering ``answers`` in turn (the last one from then on); ``block``: an event it waits for."""

    def __init__(self, *answers, block=None):
        self.answers, self.block, self.asked = list(answers), block, 0

    def nodes(self):
        self.asked += 1
        if self.block is not None:
            self.block.wait(10)
        return self.answers[min(self.asked, len(self.answers)) - 1]


@pytest.fixture
def requests(monkeypatch):
    made = []
    monkeypatch.setattr(cluster_module, "_request_cpus", lambda ray, cpus: made.append(cpus))
    monkeypatch.setattr(cluster_module, "POLL_S", 0.05)
    return made


HEAD_ONLY = [dict(HEAD, Resources={"CPU": 0.0, "node:10.0.0.1": 1.0})]


def test_a_cluster_with_cpus_is_read_at_once_and_asks_nothing(requests):
    assert cluster_shape(Nodes([HEAD, WORKER])) == shape_of([HEAD, WORKER]) and requests == []


def test_a_cluster_with_no_cpu_asks_the_autoscaler_and_waits_for_its_first_node(requests):
    ray = Nodes(HEAD_ONLY, HEAD_ONLY, [*HEAD_ONLY, WORKER])
    assert cluster_shape(ray, nodes=waits.NODES.with_seconds(5)) == shape_of([*HEAD_ONLY, WORKER])
    assert requests == [1, 0], "one CPU asked for, the request withdrawn once it came"


def test_a_cluster_that_gets_no_cpu_is_a_timeout_within_nodes_naming_the_fix(requests):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"a Ray cluster with no CPU getting its first CPU node did not finish "
                                           r"within "
                                           r"0.3 s \(1 node\(s\) alive, 0 CPUs\) \(autoloader.ray.waits.NODES\): "
                                           r".*ray start --address=HEAD:PORT --num-cpus=N.*min_workers >= 1"):
        cluster_shape(Nodes(HEAD_ONLY), nodes=waits.NODES.with_seconds(0.3))
    assert time.monotonic() - started < 2 and requests == [1, 0]


def test_a_cluster_that_does_not_answer_is_a_timeout_within_query(monkeypatch, requests):
    monkeypatch.setattr(cluster_module, "QUERY", waits.QUERY.with_seconds(0.2))
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"a question to the Ray cluster .* within 0.2 s \(ray.nodes\(\)\) "
                                           r"\(autoloader.ray.waits.QUERY\)"):
        cluster_shape(Nodes([HEAD], block=release))
    release.set()
    assert time.monotonic() - started < 2
