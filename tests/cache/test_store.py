"""The JSON tuning store (autoloader.cache): round trips, bad entries, unwritable places, races, listing and removal.
Fingerprints and keys are in test_fingerprint.py."""
from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import sys
import warnings
from pathlib import Path

import pytest

from autoloader.cache import SCHEMA_VERSION, CacheEntry, TuneCache, resolve_cache
from autoloader.errors import AutoloaderWarning
from autoloader.config import LoaderConfig
from autoloader.probe._pools import NativePool
from autoloader.results import TrialResult, TuneResult

KEY = "0123456789abcdef0123456789abcdef"
OTHER_KEY = "fedcba9876543210fedcba9876543210"


# ---------------------------------------------------------------- helpers


def make_result(num_workers=2, samples_per_s=1234.5, **changes):
    trials = (
        TrialResult(config=LoaderConfig(0), samples_per_s=310.25, batches=12, window_s=0.5, startup_s=0.01,
                    elapsed_s=0.6, stall_fraction=0.9, consumer_s_per_batch=None),
        TrialResult(config=LoaderConfig(2, 2, True, False), samples_per_s=1234.5, batches=40, window_s=0.5,
                    worker_cpu_util=0.93, worker_rss_bytes=123456789, steady=False),
        TrialResult(config=LoaderConfig(8, 4), status="failed", reason="timed out after 5.0 s"),
    )
    config = LoaderConfig(num_workers, 2 if num_workers else None, pin_memory=True, persistent_workers=False)
    values = dict(config=config, samples_per_s=samples_per_s, bottleneck="cpu", source="tuned", trials=trials,
                  consumer_samples_per_s=None, seconds=3.25, reason="fewest workers within 3% of best")
    values.update(changes)
    return TuneResult(**values)


def autoloader_warnings(call, *args, **kwargs):
    """Run ``call`` and return (its value, the AutoloaderWarnings it issued); any exception fails the test."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = call(*args, **kwargs)
    return value, [w for w in caught if issubclass(w.category, AutoloaderWarning)]


NATIVE_TRIALS = (
    TrialResult(config=LoaderConfig(2, 2, True, False, native_threads=1), samples_per_s=1234.5,
                native_pools=(NativePool("libscipy_openblas", "blas", "openblas", 2, 1),
                              NativePool("libgomp", "openmp", "openmp", 1, 1))),
    TrialResult(config=LoaderConfig(2, 2, True, False), samples_per_s=1000.0, native_pools=()),
)
"""A configuration measured with and without the limit of its workers' native pools (issue 35)."""


def test_the_native_limit_and_the_pools_found_round_trip_through_the_store(tmp_path):
    cache = TuneCache(tmp_path)
    result = make_result(config=LoaderConfig(2, 2, True, False, native_threads=1), trials=NATIVE_TRIALS)
    cache.put(KEY, result)
    loaded, caught = autoloader_warnings(cache.get, KEY, max_workers=4)
    assert caught == [] and loaded == result.with_source("cache")
    assert loaded.native_threads == 1 and loaded.native_pools == NATIVE_TRIALS[0].native_pools
    assert loaded.trials[1].native_pools == () and loaded.trials[0].native_pools[0].label() == \
        "libscipy_openblas (blas) 2 -> 1"


@pytest.mark.parametrize("pools", ["blas", [{"library": "x"}], [{"library": "x", "user_api": "blas",
                                   "internal_api": "openblas", "found": -1, "limited_to": None}]])
def test_malformed_native_pools_are_refused(pools):
    data = make_result(trials=NATIVE_TRIALS).to_dict()
    data["trials"][0]["native_pools"] = pools
    with pytest.raises((ValueError, TypeError)):
        TuneResult.from_dict(data)


def entry_payload(key=KEY, **result_changes):
    return {"schema": SCHEMA_VERSION, "key": key, "created": 1700000000.0, "meta": {"batch_size": 32},
            "result": make_result(**result_changes).to_dict()}


# ---------------------------------------------------------------- the store


def test_round_trip_through_the_store(tmp_path):
    cache = TuneCache(tmp_path / "c")
    result = make_result()
    path = cache.put(KEY, result, meta={"dataset": "CountingDataset", "batch_size": 32})
    assert path == tmp_path / "c" / f"{KEY}.json" and path.is_file()
    loaded, caught = autoloader_warnings(cache.get, KEY, max_workers=16)
    assert caught == []
    assert loaded == result.with_source("cache") and loaded.source == "cache"
    assert loaded.trials == result.trials and isinstance(loaded.trials, tuple)
    assert loaded.created is not None
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA_VERSION and data["key"] == KEY and data["meta"]["batch_size"] == 32
    assert isinstance(data["created"], float) and data["result"]["source"] == "tuned"
    assert cache.get(KEY, max_workers=2) is not None  # the bound is inclusive


def test_miss_is_silent(tmp_path):
    assert autoloader_warnings(TuneCache(tmp_path / "absent").get, KEY, max_workers=4) == (None, [])
    assert autoloader_warnings(TuneCache(tmp_path).get, KEY, max_workers=4) == (None, [])


def _set(path, text=None, payload=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if payload is not None:
        text = json.dumps(payload)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _with_result(**raw):
    """A valid entry whose stored result dict has ``raw`` fields overwritten (bypassing TuneResult's checks)."""
    return dict(entry_payload(), result=dict(make_result().to_dict(), **raw))


def _with_config(**raw):
    """A valid entry whose stored result's nested ``config`` has ``raw`` fields overwritten (bypassing its checks)."""
    stored = make_result().to_dict()
    return dict(entry_payload(), result=dict(stored, config=dict(stored["config"], **raw)))


BAD_ENTRIES = {
    "corrupt": lambda p: _set(p, "{this is not json"),
    "truncated": lambda p: _set(p, json.dumps(entry_payload())[:150]),
    "empty": lambda p: _set(p, ""),
    "binary": lambda p: _set(p, b"\x80\x81\xfe\xff" * 10),
    "wrong_schema": lambda p: _set(p, payload=dict(entry_payload(), schema=SCHEMA_VERSION + 1)),
    "bool_schema": lambda p: _set(p, payload=dict(entry_payload(), schema=True)),
    "text_schema": lambda p: _set(p, payload=dict(entry_payload(), schema="2")),
    "foreign_list": lambda p: _set(p, payload=[1, 2, 3]),
    "foreign_dict": lambda p: _set(p, payload={"hello": "world"}),
    "key_mismatch": lambda p: _set(p, payload=entry_payload(key=OTHER_KEY)),
    "too_many_workers": lambda p: _set(p, payload=entry_payload(num_workers=8)),
    "negative_workers": lambda p: _set(p, payload=_with_config(num_workers=-1)),
    "prefetch_without_workers": lambda p: _set(p, payload=_with_config(num_workers=0)),
    "bad_type": lambda p: _set(p, payload=_with_config(pin_memory="yes")),
    "unknown_config_field": lambda p: _set(p, payload=_with_config(timeout=3)),
    "config_not_object": lambda p: _set(p, payload=_with_result(config=[2, 2, True, False, 1])),
    "flat_knobs_in_this_schema": lambda p: _set(p, payload=_with_result(num_workers=2)),
    "old_layout_as_this_schema": lambda p: _set(p, payload=dict(schema_2_payload(), schema=SCHEMA_VERSION)),
    "bad_source": lambda p: _set(p, payload=_with_result(source="guessed")),
    "unknown_field": lambda p: _set(p, payload=_with_result(pickle=1)),
    "bad_trial": lambda p: _set(p, payload=_with_result(trials=[5])),
    "result_not_object": lambda p: _set(p, payload=dict(entry_payload(), result="2 workers")),
    "deeply_nested": lambda p: _set(p, "[" * 100000 + "]" * 100000),
    "directory": lambda p: p.mkdir(parents=True),
    "fifo": lambda p: (p.parent.mkdir(parents=True), os.mkfifo(p)),
}


@pytest.mark.parametrize("name", sorted(BAD_ENTRIES))
def test_bad_entry_is_a_miss_with_one_warning(tmp_path, name):
    cache = TuneCache(tmp_path / "c")
    path = cache.path_for(KEY)
    BAD_ENTRIES[name](path)
    result, caught = autoloader_warnings(cache.get, KEY, max_workers=4)
    assert result is None
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert str(path) in message and "ignoring" in message and "autotune clear" in message
    assert caught[0].filename == __file__  # stacklevel points at the caller, not into autoloader
    entry, = cache.entries()
    assert entry.key == KEY and entry.path == path
    if name == "too_many_workers":  # valid in itself; only this machine's bound rejects it
        assert entry.error is None and entry.result.num_workers == 8
    else:
        assert entry.result is None and entry.error


def test_unreadable_entry_is_a_miss_with_one_warning(tmp_path, monkeypatch):
    cache = TuneCache(tmp_path)
    path = cache.put(KEY, make_result())
    real_open = os.open

    def deny(target, *args, **kwargs):
        if Path(target) == path:
            raise PermissionError(13, "Permission denied", str(target))
        return real_open(target, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    result, caught = autoloader_warnings(cache.get, KEY, max_workers=4)
    assert result is None and len(caught) == 1 and "Permission denied" in str(caught[0].message)


def test_put_replaces_a_bad_entry(tmp_path):
    cache = TuneCache(tmp_path)
    BAD_ENTRIES["corrupt"](cache.path_for(KEY))
    assert cache.put(KEY, make_result()) is not None
    assert autoloader_warnings(cache.get, KEY, max_workers=4)[0] == make_result().with_source("cache")


def schema_2_payload(key=KEY):
    """An entry as autoloader wrote it in schema 2: the chosen knobs flat at the top of ``result`` (no ``config``);
    its trials already held a nested ``config``."""
    result = make_result().to_dict()
    config = result.pop("config")
    flat = {k: config[k] for k in ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "threads")}
    return {"schema": 2, "key": key, "created": 1700000000.0, "meta": {"batch_size": 32}, "result": {**flat, **result}}


def test_an_entry_in_the_old_schema_is_a_miss_logged_once_then_replaced(tmp_path, caplog):
    cache = TuneCache(tmp_path)
    path = cache.path_for(KEY)
    _set(path, payload=schema_2_payload())
    with caplog.at_level(logging.DEBUG, logger="autoloader"):
        result, caught = autoloader_warnings(cache.get, KEY, max_workers=4)
    assert result is None and caught == []                     # outdated, not broken: no warning
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and infos[0].name.startswith("autoloader"), caplog.records
    message = infos[0].getMessage()
    assert str(path) in message and "schema is 2" in message and str(SCHEMA_VERSION) in message
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    entry, = cache.entries()                                  # the listing says why it is not used
    assert entry.result is None and "schema is 2" in entry.error

    assert cache.put(KEY, make_result()) == path
    assert json.loads(path.read_text())["schema"] == SCHEMA_VERSION == 5
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="autoloader"):
        loaded, caught = autoloader_warnings(cache.get, KEY, max_workers=4)
    assert caught == [] and loaded == make_result().with_source("cache")
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_tune_result_round_trips_through_a_dict_with_a_nested_config():
    for result in (make_result(), make_result(num_workers=0, trials=()),
                   make_result(config=LoaderConfig(4, 3, True, True, threads=8), disk_ceiling_samples_per_s=900.0,
                               read_bytes_per_sample=4096.0, bottleneck="io", source="online"),
                   make_result(config=LoaderConfig(2, 2, True, False, native_threads=1), trials=NATIVE_TRIALS)):
        data = result.to_dict()
        assert data["config"] == dataclasses.asdict(result.config)
        assert "num_workers" not in data and "threads" not in data   # the knobs live in config only
        assert json.loads(json.dumps(data)) == data                  # plain JSON
        again = TuneResult.from_dict(json.loads(json.dumps(data)))
        assert again == result and isinstance(again.config, LoaderConfig) and isinstance(again.trials, tuple)
        assert again.num_workers == result.config.num_workers and again.threads == result.config.threads


@pytest.mark.parametrize("config, error", [
    (dict(num_workers=-1), ValueError),
    (dict(num_workers=0, prefetch_factor=2), ValueError),
    (dict(num_workers=0, prefetch_factor=None, persistent_workers=True), ValueError),
    (dict(prefetch_factor=0), ValueError),
    (dict(num_workers=2.0), TypeError),  # another type: a TypeError, as DataLoader raises
    (dict(pin_memory="yes"), TypeError),
    (dict(pin_memory=1), TypeError),
    (dict(persistent_workers=None), TypeError),
    (dict(threads=0), ValueError),
    (dict(threads=True), TypeError),
    (dict(timeout=3), ValueError),
], ids=lambda v: v.__name__ if isinstance(v, type) else "-".join(f"{k}={v[k]}" for k in v))
def test_tune_result_from_dict_rejects_a_malformed_config(config, error):
    data = make_result().to_dict()
    data["config"] = dict(data["config"], **config)
    with pytest.raises(error):
        TuneResult.from_dict(data)


@pytest.mark.parametrize("config", [None, [2, 2, True, False, 1], "workers=2"])
def test_tune_result_from_dict_needs_a_config_object(config):
    data = dict(make_result().to_dict(), config=config)
    with pytest.raises((ValueError, TypeError)):
        TuneResult.from_dict(data)
    flat = make_result().to_dict()
    flat.update(flat.pop("config"))                            # schema 2's flat layout is not this schema's
    with pytest.raises((ValueError, TypeError)):
        TuneResult.from_dict(flat)


def _assert_put_fails_with_one_warning(cache):
    path, caught = autoloader_warnings(cache.put, KEY, make_result())
    assert path is None and len(caught) == 1
    message = str(caught[0].message)
    for words in (str(cache.directory), "tuning still happened", "cache=False", "AUTOLOADER_CACHE_DIR"):
        assert words in message
    assert caught[0].filename == __file__


def test_unwritable_directory_by_permissions(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("running as root: chmod does not make the directory unwritable")
        _assert_put_fails_with_one_warning(TuneCache(directory))
    finally:
        directory.chmod(0o700)


def test_unwritable_when_the_cache_dir_is_a_file(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("user data")
    for directory in (blocker, blocker / "sub"):
        cache = TuneCache(directory)
        _assert_put_fails_with_one_warning(cache)
        assert autoloader_warnings(cache.get, KEY, max_workers=4) == (None, [])
        assert cache.entries() == [] and cache.clear() == 0
    assert blocker.read_text() == "user data"


def test_put_onto_a_directory_fails_with_one_warning_and_leaves_no_temp(tmp_path):
    cache = TuneCache(tmp_path)
    cache.path_for(KEY).mkdir()
    _assert_put_fails_with_one_warning(cache)
    assert sorted(os.listdir(tmp_path)) == [f"{KEY}.json"]


def test_put_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    cache = TuneCache(tmp_path / "c")
    cache.directory.mkdir()
    cache.path_for(KEY).symlink_to(outside)
    path = cache.put(KEY, make_result())
    assert outside.read_text() == "precious"
    assert not path.is_symlink() and path.is_file()
    assert cache.get(KEY, max_workers=4) == make_result().with_source("cache")


def _put_many(directory, index, barrier):
    warnings.simplefilter("error", AutoloaderWarning)  # a torn read or a failed write fails the child
    cache = TuneCache(Path(directory))
    barrier.wait(timeout=60)
    for i in range(20):
        if cache.put(KEY, make_result(samples_per_s=float(index * 100 + i))) is None:
            sys.exit(3)
        if cache.get(KEY, max_workers=4) is None:
            sys.exit(4)


def test_concurrent_puts_leave_one_valid_entry(tmp_path):
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_put_many, args=(str(tmp_path), i, barrier)) for i in range(4)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert os.listdir(tmp_path) == [f"{KEY}.json"]
    result = TuneCache(tmp_path).get(KEY, max_workers=4)
    assert result.samples_per_s in {float(i * 100 + j) for i in range(4) for j in range(20)}


def test_put_and_get_check_their_arguments(tmp_path):
    cache = TuneCache(tmp_path)
    for bad in ("../../etc/passwd", "short", KEY.upper(), KEY + ".json"):
        with pytest.raises(ValueError, match="key"):
            cache.get(bad, max_workers=4)
        with pytest.raises(ValueError, match="key"):
            cache.remove(bad)
    with pytest.raises(TypeError, match="key"):
        cache.put(123, make_result())
    with pytest.raises(ValueError, match="max_workers"):
        cache.get(KEY, max_workers=-1)
    with pytest.raises(TypeError, match="result"):
        cache.put(KEY, make_result().to_dict())
    with pytest.raises(TypeError, match="meta"):
        cache.put(KEY, make_result(), meta=["not", "a", "dict"])
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- listing, removal, location


def test_entries_remove_and_clear(tmp_path):
    cache = TuneCache(tmp_path)
    cache.put(KEY, make_result(), meta={"batch_size": 32})
    _set(cache.path_for(OTHER_KEY), "{broken")
    keep = ["machine.json", "notes.txt", "settings.json", ".machine.json.abc123.tmp"]
    for name in keep:
        (tmp_path / name).write_text("{}")
    (tmp_path / f".{KEY}.json.x1y2z3.tmp").write_text("{half")

    listed, caught = autoloader_warnings(cache.entries)
    assert caught == []
    assert [e.key for e in listed] == [KEY, OTHER_KEY]
    good, bad = listed
    assert isinstance(good, CacheEntry) and good.error is None and good.meta == {"batch_size": 32}
    assert good.result == make_result() and good.created is not None and good.path == cache.path_for(KEY)
    assert bad.result is None and "JSON" in bad.error

    assert cache.remove(OTHER_KEY) is True and cache.remove(OTHER_KEY) is False
    assert cache.clear() == 2  # the entry and its stray temp file
    assert sorted(os.listdir(tmp_path)) == sorted(keep)
    assert cache.clear(include_profile=True) == 2
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "settings.json"]
    assert TuneCache(tmp_path / "absent").entries() == [] and TuneCache(tmp_path / "absent").clear() == 0


def test_clear_removes_an_empty_directory_entry_only(tmp_path):
    cache = TuneCache(tmp_path)
    cache.path_for(KEY).mkdir()
    (cache.path_for(OTHER_KEY)).mkdir()
    (cache.path_for(OTHER_KEY) / "user-file").write_text("x")
    assert cache.clear() == 1
    assert os.listdir(tmp_path) == [f"{OTHER_KEY}.json"]


def test_resolve_cache(tmp_path, cache_dir, monkeypatch):
    assert resolve_cache(False) is None
    default = resolve_cache(True)
    assert default == TuneCache(cache_dir) and not cache_dir.exists()  # nothing created at resolve time
    assert resolve_cache(str(tmp_path / "x")).directory == tmp_path / "x"
    assert resolve_cache(tmp_path / "y") == TuneCache(tmp_path / "y")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_cache("~/c").directory == tmp_path / "home" / "c"
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(tmp_path / "later"))
    assert resolve_cache(True).directory == tmp_path / "later"  # read at call time
    for bad in (None, 1, b"/tmp/x", ["dir"]):
        with pytest.raises(TypeError, match="cache must be True"):
            resolve_cache(bad)
    with pytest.raises(ValueError, match="cache"):
        resolve_cache("")


def test_default_cache_honours_the_environment(cache_dir):
    path = resolve_cache(True).put(KEY, make_result())
    assert path == cache_dir / f"{KEY}.json" and path.is_file()
    assert resolve_cache(True).get(KEY, max_workers=4).source == "cache"
