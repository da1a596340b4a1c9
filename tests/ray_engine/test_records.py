"""The Ray engine's records round-trip through JSON and refuse what they cannot hold (autoloader/ray/records.py)."""
import json

import pytest

from autoloader.ray.records import RayConfig, RayTrial, RayTuning


def _tuning():
    trials = (RayTrial(RayConfig(2, batches_per_task=4, prefetch=2), 950.0, 0.4, 0.02, 24),
              RayTrial(RayConfig(1, batches_per_task=4), None, None, None, 0, "TimeoutError: ..."))
    return RayTuning(trials[0].config, 950.0, "tuned", {"nodes": 2, "cpus": 3.0, "gpus": 0.0, "node_cpus": [2.0, 1.0],
                                                        "resources": []},
                     trials, "fewest CPUs", 4.2, 1000.0, 0.01)


def test_a_tuning_round_trips_through_json_and_prints_its_table():
    tuning = _tuning()
    assert RayTuning.from_dict(json.loads(json.dumps(tuning.to_dict()))) == tuning
    text = str(tuning)
    assert "Chosen: ray tasks=2 cpus=1 block=4 prefetch=2 (tuned)" in text and "2 node(s), 3.0 CPUs" in text
    assert "*  ray tasks=2" in text and "TimeoutError" in text
    assert tuning.bottleneck == "consumer" and tuning.with_source("cache").source == "cache"


@pytest.mark.parametrize("change, error", [
    ({"source": "online"}, ValueError), ({"samples_per_s": float("nan")}, ValueError), ({"extra": 1}, ValueError),
    ({"cluster": None}, ValueError), ({"config": {"tasks": 0}}, ValueError), ({"config": {"tasks": 2, "x": 1}},
                                                                               ValueError)])
def test_a_damaged_entry_is_refused(change, error):
    with pytest.raises(error):
        RayTuning.from_dict({**_tuning().to_dict(), **change})


@pytest.mark.parametrize("kwargs", [{"tasks": 0}, {"tasks": 1, "cpus": 0}, {"tasks": 1, "prefetch": True},
                                    {"tasks": 1, "batches_per_task": 1.5}, {"tasks": 1, "cpus": 100}])
def test_a_config_out_of_range_is_a_value_error(kwargs):
    with pytest.raises(ValueError):
        RayConfig(**kwargs)
