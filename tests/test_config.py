"""The knob table (autoloader.config): one row per DataLoader setting autoloader decides or records, and the
``LoaderConfig`` every loader, cache entry and report is built from."""
import dataclasses
import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from autoloader.config import BY_NAME, KNOBS, NOT_A_CANDIDATE, RECORDED, USER_KNOBS, LoaderConfig, make_config, \
    without_worker_only, DEFAULT_PREFETCH, check_knobs, in_flight
from autoloader.request import Request


def test_every_recorded_knob_is_a_field_and_every_field_a_knob():
    assert {f.name for f in dataclasses.fields(LoaderConfig)} == set(RECORDED)
    for name in RECORDED:
        default = BY_NAME[name].default
        if name != "num_workers" and not BY_NAME[name].worker_only:
            assert getattr(LoaderConfig(0), name) == default


def test_the_knobs_a_dataloader_takes_are_dataloader_arguments():
    import inspect
    arguments = set(inspect.signature(DataLoader.__init__).parameters)
    assert {k.name for k in KNOBS if k.loader_arg} <= arguments
    assert set(USER_KNOBS) <= arguments and "threads" not in USER_KNOBS


def test_loader_kwargs_pass_worker_only_knobs_only_with_workers():
    serial, parallel = make_config(0, fixed={}), make_config(3, fixed={})
    assert not any(BY_NAME[k].worker_only for k in serial.loader_kwargs())
    assert {"prefetch_factor", "persistent_workers"} <= set(parallel.loader_kwargs())
    data = TensorDataset(torch.arange(8.0))
    assert len(DataLoader(data, batch_size=2, **serial.loader_kwargs())) == 4
    assert without_worker_only({"prefetch_factor": 2, "persistent_workers": True, "multiprocessing_context": "fork",
                                "drop_last": True}) == {"drop_last": True}


def test_make_config_takes_the_choice_then_the_users_value_then_the_default():
    fixed = {"prefetch_factor": 6, "pin_memory": True}
    config = make_config(4, fixed=fixed, threads=8)
    assert (config.num_workers, config.prefetch_factor, config.pin_memory, config.threads) == (4, 6, True, 8)
    assert make_config(4, fixed=fixed, prefetch_factor=3).prefetch_factor == 3
    assert make_config(0, fixed=fixed).prefetch_factor is None  # worker-only: off without workers
    assert make_config(2, fixed={}).prefetch_factor == BY_NAME["prefetch_factor"].default


def test_same_candidate_ignores_only_the_knobs_set_after_the_search():
    a = make_config(2, fixed={}, persistent_workers=False)
    assert a.same_candidate(dataclasses.replace(a, persistent_workers=True))
    for name, other in (("num_workers", 3), ("prefetch_factor", 4), ("pin_memory", True), ("threads", 2)):
        assert name not in NOT_A_CANDIDATE
        assert not a.same_candidate(dataclasses.replace(a, **{name: other}))


def test_label_and_json_round_trip():
    config = make_config(4, fixed={}, threads=8, pin_memory=True)
    assert config.label() == "workers=4 prefetch=2 threads=8 pin"
    assert make_config(0, fixed={}).label() == "workers=0"
    assert LoaderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="unknown LoaderConfig fields"):
        LoaderConfig.from_dict({**config.to_dict(), "bogus": 1})


def test_invalid_configurations_are_refused():
    with pytest.raises(ValueError, match="need num_workers > 0"):
        LoaderConfig(0, prefetch_factor=2)
    with pytest.raises(ValueError, match="threads=0 must be an int >= 1"):
        LoaderConfig(1, 2, threads=0)
    with pytest.raises(ValueError, match="native_threads need num_workers > 0"):
        LoaderConfig(0, native_threads=1)       # the main process's pools are never limited
    for bad, kind in ((0, ValueError), (True, TypeError), (1.5, TypeError)):  # out of range, or of another type
        with pytest.raises(kind, match="native_threads=.* must be an int >= 1 or None"):
            LoaderConfig(2, 2, native_threads=bad)


def test_what_is_in_flight_is_one_formula():
    """The burst a window skips, the batches in /dev/shm and a worker's batches all follow from ``in_flight``."""
    for workers, prefetch in ((0, None), (1, 1), (3, 2), (4, 4)):
        config = LoaderConfig(workers, prefetch)
        assert config.in_flight() == in_flight(workers, prefetch) == workers * (prefetch or 0)
        assert config.burst_batches() == (config.in_flight() + workers if workers else 1)
        assert config.shm_batches() == (config.in_flight() + 2 if workers else 0)
        assert config.worker_batches() == 2 * (prefetch or DEFAULT_PREFETCH)
    assert in_flight(2, None) == 2 * DEFAULT_PREFETCH == 4, "torch's default prefetch_factor"


def test_one_validation_for_arguments_configurations_and_cache_entries():
    with pytest.raises(TypeError, match="pin_memory=1 must be True or False; fix it"):
        check_knobs({"pin_memory": 1}, hint="; fix it")
    with pytest.raises(ValueError, match="prefetch_factor and persistent_workers need num_workers > 0"):
        check_knobs({"num_workers": 0, "prefetch_factor": 2, "persistent_workers": True})
    check_knobs({"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "unknown": object()})
    with pytest.raises(ValueError, match="num_workers=-1 must be an int >= 0"):
        LoaderConfig.from_dict({"num_workers": -1})


def test_native_threads_is_a_worker_only_knob_shown_when_limited():
    limited = make_config(2, fixed={}, native_threads=1)
    assert limited.label() == "workers=2 prefetch=2 native=1" and "native_threads" not in limited.loader_kwargs()
    assert make_config(2, fixed={}).native_threads is None and make_config(0, fixed={}, native_threads=3).label() == \
        "workers=0", "off without workers"
    assert not limited.same_candidate(dataclasses.replace(limited, native_threads=None))
    assert LoaderConfig.from_dict(json.loads(json.dumps(limited.to_dict()))) == limited


def test_a_start_method_is_recorded_by_name():
    knob = BY_NAME["multiprocessing_context"]
    assert knob.recorded_value(torch.multiprocessing.get_context("spawn")) == "spawn"
    assert knob.recorded_value("forkserver") == "forkserver"
    with pytest.raises(TypeError, match="start method name"):
        knob.recorded_value(42)


def test_one_builder_makes_every_loader_from_request_and_config():
    data = TensorDataset(torch.arange(10.0))
    request = Request.checked(data, 4, dataloader_kwargs={"drop_last": True, "prefetch_factor": 3})
    serial = request.data_loader(make_config(0, fixed=request.fixed))
    assert serial.num_workers == 0 and serial.prefetch_factor is None and len(serial) == 2
    parallel = request.data_loader(make_config(2, fixed=request.fixed))
    assert parallel.num_workers == 2 and parallel.prefetch_factor == 3  # the user's fixed value
    forced = request.data_loader(make_config(0, fixed={}), sampling={"batch_size": 5}, in_order=True)
    assert forced.batch_size == 5 and forced.drop_last is False  # sampling replaces the user's sampling arguments


def test_the_start_method_is_a_knob_passed_through_recorded_and_cached(tmp_path):
    """The knob added as one row of the table (issue 20): the user's start method, as a name or a context object,
    reaches every DataLoader, is recorded in the decision and its label, and keys the cache."""
    from autoloader import make_loader
    data = TensorDataset(torch.arange(64.0))
    kwargs = dict(tuning="trials", budget=2, num_workers=1, cache=str(tmp_path))  # workers: the knob applies
    by_object = make_loader(data, 8, multiprocessing_context=torch.multiprocessing.get_context("fork"), **kwargs)
    by_name = make_loader(data, 8, multiprocessing_context="fork", **kwargs)
    unset = make_loader(data, 8, **kwargs)
    assert by_name.tuning.source == "cache" and by_object.cache_key == by_name.cache_key != unset.cache_key
    stored = json.loads((tmp_path / f"{by_object.cache_key}.json").read_text())["result"]["config"]
    assert by_name.tuning.config.multiprocessing_context == stored["multiprocessing_context"] == "fork"
    assert "start=fork" in by_name.tuning.config.label()
    assert by_name.loader.multiprocessing_context.get_start_method() == "fork"
    assert unset.tuning.config.multiprocessing_context is None and "start=" not in unset.tuning.config.label()
