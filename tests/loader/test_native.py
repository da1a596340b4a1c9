"""Native thread pools inside workers (issue 35; NOTE [ Native thread pools ] in loader/native.py): a worker's own
``threadpool_info()`` shows the limit, the user's ``worker_init_fn`` runs after ours and its limit wins, the main
process is never touched, and without threadpoolctl only what can be limited is, said once.

The parent raises its BLAS pool to 4 threads first (``threadpool_limits``, undone after), so that a forked worker
starts above any limit on every machine."""
import dataclasses
import gc
import json
import logging
import os
import subprocess
import sys

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from autoloader import make_loader, tune
from autoloader.config import LoaderConfig
from autoloader.loader import native
from autoloader.loader.epochs import epoch_iter
from autoloader.request import Request
from autoloader.search.native_policy import share
from autoloader.search.bounds import usable_cpus
from autoloader.probe import probe_machine
from native_data import USER_LIMIT, FakeCv2, PoolsInWorker, mark_init, user_init

PARENT_BLAS = 4


@pytest.fixture
def wide_parent():
    """The parent's BLAS pool at 4 threads for the test (what a forked worker starts with), as it was after."""
    with threadpool_limits(limits=PARENT_BLAS, user_api="blas"):
        yield parent_pools()


def parent_pools():
    """This process's pools, in an order that does not depend on threadpoolctl's."""
    return sorted((p["prefix"], p["num_threads"]) for p in threadpool_info())


def samples(loader):
    return [s for batch in loader for s in batch]


def loader_for(config, **kwargs):
    request = Request.checked(PoolsInWorker(8), 2, dataloader_kwargs={"collate_fn": list, **kwargs})
    return request.data_loader(config, measured=True)


def test_a_workers_threadpool_info_shows_the_limit_and_the_parent_keeps_its_pools(wide_parent):
    environ = dict(os.environ)
    loader = loader_for(LoaderConfig(2, 2, native_threads=1))
    got = samples(loader)
    assert {s["pid"] for s in got} - {os.getpid()}, "loaded in workers"
    assert all(s["pools"]["blas"] == 1 and s["omp"] == "1" for s in got), got
    pools = native.worker_pools(loader.worker_init_fn)
    blas = next(p for p in pools if p.user_api == "blas")
    assert (blas.found, blas.limited_to) == (PARENT_BLAS, 1) and blas.label().endswith(f"{PARENT_BLAS} -> 1")
    assert parent_pools() == wide_parent and dict(os.environ) == environ, "the main process is never touched"
    report = loader.worker_init_fn.report
    del loader
    gc.collect()
    assert not os.path.exists(report), "the report file goes with its loader"


def blas_threads():
    return next(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


def test_forked_workers_inherit_the_limit_held_while_they_fork_and_report_the_parents_size(wide_parent):
    """NOTE [ Native thread pools ], At fork: autoloader starts every epoch of its loaders with
    ``epoch_iter(forking=limited_at_fork)``, which holds the parent's pools at the limit while the workers fork, and restores them; the
    first worker alone reports, the parent's size as what it found."""
    loader = loader_for(LoaderConfig(2, 2, native_threads=1))
    with native.limited_at_fork(loader):
        assert blas_threads() == 1 and loader.worker_init_fn.at_fork, "held at the limit while forking"
    assert parent_pools() == wide_parent and loader.worker_init_fn.at_fork == {}, "restored"
    got = [s for batch in epoch_iter(loader, forking=native.limited_at_fork) for s in batch]
    assert parent_pools() == wide_parent, "the main process keeps its pools"
    assert {s["pid"] for s in got} - {os.getpid()} and all(s["pools"]["blas"] == 1 for s in got), got
    blas = next(p for p in native.worker_pools(loader.worker_init_fn) if p.user_api == "blas")
    assert (blas.found, blas.limited_to) == (PARENT_BLAS, 1), "found: the size the parent had"
    with open(loader.worker_init_fn.report, encoding="utf-8") as f:
        assert [json.loads(line)["worker"] for line in f] == [0], "only the first worker reports"


@pytest.mark.parametrize("kind", ["spawn", "no limit", "no workers"])
def test_nothing_is_held_for_a_loader_that_spawns_limits_nothing_or_has_no_workers(wide_parent, kind):
    config = LoaderConfig(0) if kind == "no workers" else \
        LoaderConfig(2, 2, native_threads=None if kind == "no limit" else 1)
    loader = loader_for(config, **({"multiprocessing_context": "spawn"} if kind == "spawn" else {}))
    with native.limited_at_fork(loader):
        assert parent_pools() == wide_parent


def test_the_users_worker_init_fn_runs_after_ours_and_its_own_limit_wins(wide_parent):
    got = samples(loader_for(LoaderConfig(2, 2, native_threads=1), worker_init_fn=user_init))
    assert all(s["seen"]["blas"] == 1 for s in got), "ours ran first: theirs found the pool limited"
    assert all(s["pools"]["blas"] == USER_LIMIT for s in got), "theirs ran last: its limit is what the worker keeps"
    assert {s["seen"]["worker"] for s in got} == {0, 1}


def test_make_loader_limits_each_worker_to_its_share_and_leaves_the_main_process_alone(wide_parent):
    loader = make_loader(PoolsInWorker(64), 4, num_workers=2, collate_fn=list, cache=False, tuning="trials",
                         budget=3, persistent_workers=False)  # new workers each epoch: a later worker_init_fn runs
    limit = share(usable_cpus(probe_machine(disk=False, gpus=False)), 2)
    assert loader.tuning.native_threads == limit and f"native={limit}" in loader.tuning.config.label()
    assert all(s["pools"]["blas"] == limit for s in samples(loader))
    blas = next(p for p in loader.tuning.native_pools if p.user_api == "blas")
    assert (blas.found, blas.limited_to) == (PARENT_BLAS, limit)
    assert loader.worker_init_fn is None, "the user gave none (Lightning's seed_everything then sets its own)"
    loader.worker_init_fn = mark_init
    assert loader.worker_init_fn is mark_init and isinstance(loader.loader.worker_init_fn, native.NativeLimit)
    assert loader.loader.worker_init_fn.threads == limit, "a worker_init_fn set later keeps the limit"
    assert all(s["seen"]["ran"] and s["pools"]["blas"] == limit for s in samples(loader))
    del loader
    tune(PoolsInWorker(64), 4, num_workers=2, collate_fn=list, budget=2)
    assert parent_pools() == wide_parent, "neither make_loader nor tune touched the main process's pools"


def test_native_threads_false_leaves_the_workers_pools_alone(wide_parent):
    loader = make_loader(PoolsInWorker(64), 4, num_workers=2, collate_fn=list, cache=False, tuning="trials",
                         budget=3, native_threads=False)
    assert loader.tuning.native_threads is None and "native=" not in loader.tuning.config.label()
    assert all(s["pools"]["blas"] == PARENT_BLAS for s in samples(loader))
    assert loader.loader.worker_init_fn is None, "nothing wrapped"
    del loader


def test_a_fixed_native_threads_is_every_workers_limit(wide_parent):
    loader = make_loader(PoolsInWorker(64), 4, num_workers=2, collate_fn=list, cache=False, tuning="trials",
                         budget=3, native_threads=3)
    assert loader.tuning.native_threads == 3 and all(t.config.native_threads == 3 for t in loader.tuning.trials)
    assert all(s["pools"]["blas"] == 3 for s in samples(loader))
    del loader


def test_opencv_when_imported_is_limited_too(wide_parent, monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", FakeCv2(8))
    loader = loader_for(LoaderConfig(2, 2, native_threads=1))
    assert all(s["cv2"] == 1 for s in samples(loader)), "cv2.setNumThreads(0): sequential"
    assert any(p.label() == "cv2 (opencv) 8 -> 1" for p in native.worker_pools(loader.worker_init_fn))
    assert sys.modules["cv2"].getNumThreads() == 8, "the main process's OpenCV untouched"


def test_without_threadpoolctl_opencv_and_the_variables_are_limited_not_blas_and_it_is_said_once(
        wide_parent, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import threadpoolctl now raises ImportError
    monkeypatch.setitem(sys.modules, "cv2", FakeCv2(8))
    monkeypatch.setattr(native, "_told_without_threadpoolctl", False)
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        first = loader_for(LoaderConfig(2, 2, native_threads=1))
        second = loader_for(LoaderConfig(2, 2, native_threads=1))
    told = [r for r in caplog.records if "threadpoolctl is not installed" in r.getMessage()]
    assert len(told) == 1 and "numpy's OpenBLAS" in told[0].getMessage(), caplog.records
    got = samples(first) + samples(second)
    assert all(s["cv2"] == 1 and s["omp"] == "1" for s in got), "OpenCV and the variables: limited"
    assert all(s["pools"]["blas"] == PARENT_BLAS for s in got), "the BLAS pool already loaded: not limited"
    assert native.worker_pools(first.worker_init_fn) is None, "the pools are unknown then"


def test_a_limit_that_fails_never_stops_the_worker_nor_the_users_init(monkeypatch):
    def broken(limit):
        raise RuntimeError("a pool refused")

    monkeypatch.setattr(native, "limit_here", broken)  # forked workers inherit the patched module
    got = samples(loader_for(LoaderConfig(2, 2, native_threads=1), worker_init_fn=mark_init))
    assert len(got) == 8 and all(s["seen"]["ran"] for s in got)


def test_users_init_and_rewrap():
    limit = native.NativeLimit(2, mark_init)
    assert native.users_init(limit) is mark_init and native.users_init(mark_init) is mark_init
    again = native.rewrap(limit, user_init)
    assert isinstance(again, native.NativeLimit) and again.threads == 2 and again.then is user_init
    assert native.rewrap(None, user_init) is user_init and native.rewrap(native.NativeLimit(None), None) is None
    assert native.worker_init(None, limit) is mark_init, "never wrapped twice; nothing to limit: the user's alone"
    assert native.worker_init(3, limit).then is mark_init


SPAWNED = """
import json, os
from autoloader.config import LoaderConfig
from autoloader.loader import native
from autoloader.loader.epochs import epoch_iter
from autoloader.request import Request
from native_data import PoolsInWorker

if __name__ == "__main__":
    request = Request.checked(PoolsInWorker(8), 2, dataloader_kwargs={"collate_fn": list,
                                                                      "multiprocessing_context": "spawn"})
    loader = request.data_loader(LoaderConfig(2, 2, native_threads=1, multiprocessing_context="spawn"), measured=True)
    got = [s for batch in loader for s in batch]
    pools = native.worker_pools(loader.worker_init_fn)
    print(json.dumps({"blas": sorted({s["pools"]["blas"] for s in got}), "omp": sorted({s["omp"] for s in got}),
                      "pids": len({s["pid"] for s in got} - {os.getpid()}), "reported": pools is not None}))
"""


@pytest.mark.slow
def test_spawned_workers_are_limited_too(tmp_path):
    """In a fresh interpreter: spawn's resource tracker outlives the test, as it belongs to the process."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(tests), tests]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"blas": [1], "omp": ["1"], "pids": 2, "reported": True}, out


def test_online_candidates_are_limited_and_record_the_pools_their_workers_found(wide_parent):
    # Waiting-bound samples: the search tries workers on any machine (CPU-bound ones on a CI runner whose serial
    # candidate already reached its CPU ceiling were decided with no worker at all).
    loader = make_loader(PoolsInWorker(600, wait_s=0.002), 8, collate_fn=list, cache=False, tuning="online",
                         max_workers=4)
    seen = []
    for _ in range(6):
        seen += [s for batch in loader for s in batch if s["pid"] != os.getpid()]
        if loader.decisions:
            break
    with_workers = [t for t in loader.tuning.trials if t.config.num_workers > 0]
    assert with_workers and seen, "the search measured candidates with workers"
    assert all(t.native_pools for t in with_workers), with_workers
    limited = [t.config for t in with_workers if t.config.native_threads is not None]
    assert limited and all(dataclasses.replace(t.config, native_threads=share(usable_cpus(
        probe_machine(disk=False, gpus=False)), t.config.num_workers)) in limited for t in with_workers), \
        "a candidate without the limit only beside the same one with it (the comparison)"
    assert parent_pools() == wide_parent
    del loader
