"""ThreadedDataset with real DataLoaders: order, speed, errors, forwarding, pickling, pools per process, exit."""
from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from helpers import pool_threads, wait_no_children
from thread_data import Batched, Indexed, SampleError, Stream
from torch.utils.data import DataLoader, Subset, random_split

from autoloader.errors import AutoloaderWarning
from autoloader.loader.threads import ThreadedDataset, has_own_getitems, threads_of, unwrap, with_threads

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(TESTS_DIR)


def wait_no_pool_threads(timeout: float = 5.0) -> list:
    deadline = time.monotonic() + timeout
    while pool_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pool_threads()


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    """Every test drops its loaders: their pools' threads must be gone once they are collected."""
    yield
    gc.collect()
    assert not wait_no_pool_threads(), "pool threads left behind"


def batches(dataset, **kwargs) -> list:
    if kwargs.get("num_workers"):
        kwargs.setdefault("timeout", 20)  # a worker stuck on a pool it did not make fails rather than hangs
    loader = DataLoader(dataset, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(7), **kwargs)
    return list(loader)


def indices(batch_list) -> list:
    return [b["index"].tolist() for b in batch_list]


@pytest.mark.parametrize("kwargs", [
    {"num_workers": 0},
    {"num_workers": 2},
], ids=["main", "fork"])  # spawn: test_order_matches_plain_loader_under_spawn
def test_order_matches_plain_loader(kwargs):
    plain = indices(batches(Indexed()))
    threaded = batches(ThreadedDataset(Indexed(sleep_s=0.001), threads=4), **kwargs)
    assert indices(threaded) == plain
    assert len(plain[-1]) == 40 % 6  # the last, short batch too
    if kwargs["num_workers"]:
        assert all(len(set(b["pid"].tolist())) == 1 and b["pid"][0] != os.getpid() for b in threaded)


def test_threads_overlap_waiting():
    serial, threaded = Indexed(16, sleep_s=0.02), ThreadedDataset(Indexed(16, sleep_s=0.02), threads=8)
    times = {}
    for name, dataset in [("serial", serial), ("threaded", threaded)] * 2:
        start = time.perf_counter()
        batch = next(iter(DataLoader(dataset, batch_size=16)))
        times[name] = min(times.get(name, float("inf")), time.perf_counter() - start)
        assert batch["index"].tolist() == list(range(16))
    assert times["serial"] >= 3 * times["threaded"], times


def test_first_failure_in_batch_order_propagates_and_the_rest_is_cancelled():
    # 9 fails at once, 3 after 50 ms: 3 comes first in the batch, so its exception is the one raised
    dataset = Indexed(16, sleep_s=0.05, fail={3: 0.05, 9: 0.0})
    with pytest.raises(SampleError, match=r"^sample 3 failed$"):
        next(iter(DataLoader(ThreadedDataset(dataset, threads=4), batch_size=16)))
    # the first failure, at index 0, cancels what had not started: threads 1-3 were already busy, at most
    time.sleep(0.15)
    dataset = Indexed(16, sleep_s=0.05, fail={0: 0.0})
    with pytest.raises(SampleError, match=r"^sample 0 failed$"):
        ThreadedDataset(dataset, threads=2).__getitems__(list(range(16)))
    time.sleep(0.15)
    assert len(dataset.started) <= 4, dataset.started


def raised_by(loader) -> BaseException:
    """What iterating ``loader`` raises, its traceback dropped: the frames hold the DataLoader iterator in a cycle
    that only the gc frees, and torch's worker shutdown run by the gc waits 5 s for workers (threads or not)."""
    try:
        list(loader)
    except BaseException as exc:
        exc.__traceback__ = None
        return exc
    raise AssertionError("iterating the loader raised nothing")


def test_worker_exception_keeps_type_and_message():
    exc = raised_by(DataLoader(ThreadedDataset(Indexed(8, fail={5: 0.0}), threads=4), batch_size=8, num_workers=1))
    assert type(exc) is SampleError and "sample 5 failed" in str(exc)  # torch adds the worker's traceback


def test_worker_exits_promptly_with_samples_still_waiting():
    # 0 fails while 1-3 wait 30 s: told to stop, the worker must exit at once, not join its busy threads (torch
    # would wait 5 s for it, then kill it)
    start = time.monotonic()
    exc = raised_by(DataLoader(ThreadedDataset(Indexed(4, sleep_s=30.0, fail={0: 0.0}), threads=4), batch_size=4,
                               num_workers=1))
    assert type(exc) is SampleError and wait_no_children(timeout=10.0) == []
    assert time.monotonic() - start < 4.0


_SUBPROCESS_SCRIPT = """
import json, time, torch
from torch.utils.data import DataLoader
from autoloader.loader.threads import ThreadedDataset
from thread_data import Indexed, SampleError

def indices(dataset, **kwargs):
    loader = DataLoader(dataset, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(7), **kwargs)
    return [b["index"].tolist() for b in loader]

if __name__ == "__main__":
    out = {"plain": indices(Indexed()),
           "spawn": indices(ThreadedDataset(Indexed(sleep_s=0.001), threads=4), num_workers=2,
                            multiprocessing_context="spawn")}
    stuck = ThreadedDataset(Indexed(4, sleep_s=60.0, fail={0: 0.0}), threads=4)
    try:
        next(iter(DataLoader(stuck, batch_size=4)))  # samples 1-3 are still waiting when 0 raises
    except SampleError as exc:
        out["raised"] = str(exc)
    out["at"] = time.monotonic()
    print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def in_subprocess(tmp_path_factory):
    """One fresh interpreter: spawned workers (and the resource tracker they start) and its exit stay out of ours."""
    script = tmp_path_factory.mktemp("threads") / "script.py"
    script.write_text(_SUBPROCESS_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_DIR, TESTS_DIR, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    exited_at = time.monotonic()
    assert out.returncode == 0, out.stderr
    return {**json.loads(out.stdout), "exited_at": exited_at}


def test_order_matches_plain_loader_under_spawn(in_subprocess):
    assert in_subprocess["spawn"] == in_subprocess["plain"] and len(in_subprocess["plain"]) == 7


def test_main_process_exits_promptly_with_samples_still_waiting(in_subprocess):
    assert in_subprocess["raised"] == "sample 0 failed"
    assert in_subprocess["exited_at"] - in_subprocess["at"] < 5.0  # the exit did not wait for the 60 s samples


def test_pool_is_per_process_and_made_after_fork():
    dataset = ThreadedDataset(Indexed(24), threads=3)
    in_main = batches(dataset)                       # the main process makes its pool before the fork
    main_tids = {t for b in in_main for t in b["tid"].tolist()}
    assert os.getpid() not in main_tids and len(main_tids) <= 3
    in_workers = batches(dataset, num_workers=2)
    by_pid = {}
    for b in in_workers:
        for pid, tid in zip(b["pid"].tolist(), b["tid"].tolist()):
            by_pid.setdefault(pid, set()).add(tid)
    assert len(by_pid) == 2 and os.getpid() not in by_pid
    for pid, tids in by_pid.items():
        assert pid not in tids and not tids & main_tids and len(tids) <= 3


def test_one_thread_makes_no_pool():
    dataset = ThreadedDataset(Indexed(12), threads=1)
    assert {t for b in batches(dataset) for t in b["tid"].tolist()} == {threading.get_native_id()}
    assert dataset._autoloader_pool is None and not pool_threads()
    plain = Indexed()
    assert with_threads(plain, 1) is plain and with_threads(dataset, 1) is unwrap(dataset)
    assert isinstance(with_threads(plain, 2), ThreadedDataset)


def test_attributes_are_the_users_dataset():
    inner = Indexed(10)
    dataset = ThreadedDataset(inner, threads=2)
    assert (len(dataset), dataset[3]["index"], dataset.describe()) == (10, 3, inner.describe())
    assert dataset.root == inner.root
    dataset.transform = "flip"
    assert inner.transform == "flip" and "transform" not in vars(dataset)
    del dataset.transform
    assert not hasattr(inner, "transform")
    with pytest.raises(AttributeError, match="Indexed"):
        dataset.missing
    assert not isinstance(dataset, Indexed) and unwrap(dataset) is inner and unwrap(inner) is inner
    assert (threads_of(dataset), threads_of(inner)) == (2, 1)
    assert "describe" in dir(dataset) and repr(dataset).endswith(", threads=2)")
    assert [d["index"] for d in dataset][:3] == [0, 1, 2]
    assert unwrap(ThreadedDataset(dataset, threads=3)) is inner           # no wrapper inside a wrapper
    subset = ThreadedDataset(Subset(inner, [4, 5]), threads=2)
    assert subset.dataset is inner and subset.indices == [4, 5]           # the Subset's .dataset, not the wrapper's


def test_pickle_and_copy_drop_the_pool():
    dataset = ThreadedDataset(Indexed(10), threads=3)
    dataset.__getitems__([0, 1, 2])                                       # has a pool now
    empty = ThreadedDataset.__new__(ThreadedDataset)                      # as unpickling sees it: no recursion
    with pytest.raises(AttributeError):
        empty.anything
    for clone in (pickle.loads(pickle.dumps(dataset)), copy.deepcopy(dataset), copy.copy(dataset)):
        assert type(clone) is ThreadedDataset and clone._autoloader_pool is None
        assert (threads_of(clone), clone.root, len(clone)) == (3, dataset.root, 10)
        assert [s["index"] for s in clone.__getitems__([5, 1, 7])] == [5, 1, 7]
    del clone


def test_own_getitems_is_called_as_is():
    inner = Batched(12)
    with pytest.warns(AutoloaderWarning, match="threads=4 has no effect: Batched defines __getitems__"):
        dataset = ThreadedDataset(inner, threads=4)
    got = indices(batches(dataset))
    assert inner.calls == got == indices(batches(Batched(12)))
    assert {t for b in batches(dataset) for t in b["tid"].tolist()} == {threading.get_native_id()}
    assert has_own_getitems(inner) and has_own_getitems(Subset(inner, [1, 2]))


def test_subset_is_threaded_per_sample():
    train, _ = random_split(Indexed(20), [12, 8], generator=torch.Generator().manual_seed(0))
    assert not has_own_getitems(train) and not has_own_getitems(Subset(train, [0, 1]))
    threaded = batches(ThreadedDataset(train, threads=3))
    assert indices(threaded) == indices(batches(train))
    assert threading.get_native_id() not in {t for b in threaded for t in b["tid"].tolist()}


def test_iterable_dataset_is_refused():
    with pytest.raises(ValueError, match=r"map-style.*Stream is an IterableDataset.*__iter__.*threads=False"):
        ThreadedDataset(Stream(), threads=4)
    with pytest.raises(TypeError, match="map-style dataset"):
        ThreadedDataset(object(), threads=4)


@pytest.mark.parametrize("threads, error", [
    (True, TypeError), (2.0, TypeError), ("4", TypeError), (None, TypeError), (0, ValueError), (-3, ValueError),
])
def test_threads_is_validated(threads, error):
    with pytest.raises(error, match=rf"threads must be .*got {threads!r}.*threads="):
        ThreadedDataset(Indexed(), threads=threads)
    with pytest.raises(error):
        with_threads(Indexed(), threads)


def test_numpy_int_threads():
    assert threads_of(ThreadedDataset(Indexed(), threads=np.int64(4))) == 4


def test_loader_dataset_is_the_one_rule_and_never_wraps_twice():
    from autoloader.config import LoaderConfig
    from autoloader.loader.threads import loader_dataset

    data = Indexed()
    assert loader_dataset(data, LoaderConfig(2, 2)) is data
    wrapped = loader_dataset(data, LoaderConfig(2, 2, threads=4))
    assert isinstance(wrapped, ThreadedDataset) and threads_of(wrapped) == 4 and unwrap(wrapped) is data
    again = loader_dataset(wrapped, LoaderConfig(0, threads=8))
    assert threads_of(again) == 8 and unwrap(again) is data, "rewrapped, not wrapped twice"
    assert loader_dataset(wrapped, LoaderConfig(0)) is wrapped, "one thread: the dataset as given"


@pytest.mark.parametrize("threads, expected", [(False, False), (True, True), (1, False), (np.int64(4), 4), (8, 8)])
def test_check_threads_normalises(threads, expected):
    from autoloader._validate import check_threads

    result = check_threads(threads, Indexed())
    assert result == expected and type(result) is type(expected)


def test_check_threads_turns_threads_off_for_an_own_getitems():
    from autoloader._validate import check_threads

    with pytest.warns(AutoloaderWarning, match="defines __getitems__"):
        assert check_threads(True, Batched()) is False
    assert check_threads(False, Stream()) is False
