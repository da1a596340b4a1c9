"""The Ray engine's modules on a real local Ray (one per module, 2 CPUs, as test_ray.py starts it), what their tests
in tests/ray_engine cannot check without one: ``pipeline.dataset_for`` sets ``preserve_order`` on its own dataset
only, ``Feed`` reads a real Ray Data run in order and stops it when closed early, ``work._payload`` keeps and evicts
real object references, ``source.Payload`` names the fix for what Ray cannot serialise, ``trials.run_trial`` and
``tune_pool`` measure real runs, and ``session.open_session`` starts a new Ray (the old one's files removed) when
someone else shut the last one down. Runs only when tests/integrations is named (its conftest.py)."""
from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("ray", reason="Ray Data is not installed: pip install '.[integrations]'")

import ray  # noqa: E402

import autoloader.ray  # noqa: E402
from autoloader.consumer import Consumer  # noqa: E402
from autoloader.ray import session as session_module  # noqa: E402
from autoloader.ray import work  # noqa: E402
from autoloader.ray.pipeline import Feed, dataset_for  # noqa: E402
from autoloader.ray.records import RayConfig  # noqa: E402
from autoloader.ray.source import Payload  # noqa: E402
from autoloader.ray.trials import Bench, Costs, run_trial, tune_pool  # noqa: E402
from helpers import wait_no_children  # noqa: E402
from ray_data import Indexed  # noqa: E402
from _helpers import strays  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.ray]


@pytest.fixture(scope="module")
def ray_session():
    """The local Ray autoloader starts (2 CPUs), shared by the module; after it, shut down with nothing left.
    Yields ``[session, roots]``: a test that starts another Ray puts its session and processes there."""
    session = session_module.open_session(None, num_cpus=2)
    assert session.local and session.owned
    state = [session, {child.pid for child in psutil.Process().children()}]
    yield state
    temp_dir = state[0].temp_dir
    autoloader.ray.shutdown()
    left = wait_no_children(30.0)
    assert not left, f"Ray processes left after shutdown(): {[(p.pid, p.name()) for p in left]}"
    assert temp_dir is None or not os.path.exists(temp_dir)


@pytest.fixture(autouse=True)
def no_process_left_behind(ray_session):
    """conftest's check, but Ray's own processes (and their workers) live for the module (``ray_session``)."""
    yield
    left = strays(ray_session[1])
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"


def _ids(batch) -> list:
    return batch[1].tolist() if isinstance(batch[1], torch.Tensor) else batch[1]


def _index_batches(plain: DataLoader) -> list:
    return list(plain.batch_sampler if plain.batch_sampler is not None else plain.sampler)


def test_preserve_order_is_set_on_the_runs_dataset_only(ray_session):
    before = ray.data.DataContext.get_current().execution_options.preserve_order
    ds = dataset_for(ray, ray.put((Indexed(8), None)), [[0, 1], [2, 3]], RayConfig(1), batched=True)
    assert ds.context.execution_options.preserve_order is True
    assert ds.context.enable_progress_bars is False
    assert ray.data.DataContext.get_current().execution_options.preserve_order is before, \
        "the user's DataContext was changed"


@pytest.mark.parametrize("batch_size, config", [(3, RayConfig(1, batches_per_task=2, prefetch=2)),
                                                (None, RayConfig(1, batches_per_task=4))])
def test_a_feed_reads_a_real_run_in_order(ray_session, batch_size, config):
    dataset = Indexed(20)
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(9))
    indices = _index_batches(plain)
    feed = Feed(ray, ray.put((dataset, plain.collate_fn)), indices, config, batched=batch_size is not None,
                wait_s=60.0)
    got = []
    try:
        while True:
            got.append(feed.next())
    except StopIteration:
        pass
    finally:
        feed.close()
    assert [pos for pos, _ in got] == list(range(len(indices)))
    assert [_ids(batch) for _, batch in got] == indices  # each batch holds the samples of its own indices


def test_a_feed_closed_early_stops_its_thread(ray_session):
    dataset = Indexed(64)
    feed = Feed(ray, ray.put((dataset, DataLoader(dataset).collate_fn)), [[i] for i in range(64)],
                RayConfig(1, batches_per_task=2), batched=True, wait_s=60.0)
    assert feed.next()[0] == 0
    feed.close()
    feed._thread.join(20)
    assert not feed._thread.is_alive(), "the reading thread (and Ray Data's execution) went on after close()"
    assert not [t for t in threading.enumerate() if t.name == "autoloader-ray-feed" and t.is_alive()]


def test_a_worker_process_keeps_real_payloads_by_reference(ray_session, monkeypatch):
    monkeypatch.setattr(work, "_PAYLOADS", type(work._PAYLOADS)())
    refs = [ray.put((Indexed(n), None)) for n in (1, 2, 3)]
    first = work._payload(refs[0])
    assert first[0].n == 1 and work._payload(refs[0]) is first, "a kept payload is not fetched again"
    work._payload(refs[1])
    work._payload(refs[2])  # KEEP = 2: the first goes
    assert list(work._PAYLOADS) == [refs[1].hex(), refs[2].hex()]
    again = work._payload(refs[0])
    assert again[0].n == 1 and again is not first, "an evicted payload is fetched from Ray again"


def test_a_dataset_ray_cannot_serialise_is_a_type_error_naming_the_fix(ray_session):
    payload = Payload(threading.Lock(), None)
    with pytest.raises(TypeError, match=r"(?s)cannot be pickled .* define them at module level"):
        payload.ref(ray, ray_session[0])
    fine = Payload(Indexed(4), None)
    assert fine.ref(ray, ray_session[0]) is fine.ref(ray, ray_session[0])
    assert ray.get(fine.ref(ray, ray_session[0]))[0].n == 4


def _bench(steps: list, n: int = 96) -> Bench:
    dataset = Indexed(n)
    template = DataLoader(dataset, batch_size=4)
    consumer = Consumer(lambda batch: steps.append(_ids(batch)), torch.device("cpu"))
    return Bench(ray, ray.put((dataset, template.collate_fn)), template, consumer, wait_s=60.0)


def test_a_trial_runs_the_step_on_every_batch_and_measures_the_window_after_the_burst(ray_session):
    steps: list = []
    config = RayConfig(1, batches_per_task=2)
    trial = run_trial(_bench(steps), config, deadline=time.perf_counter() + 120)
    burst = config.batches_per_task * (config.tasks + config.prefetch)  # 4
    total = burst + max(8, 3 * config.tasks * config.batches_per_task)  # 12
    assert trial.reason == "" or trial.reason is None, trial.reason
    assert len(steps) == total and trial.batches == total - burst - 1
    assert trial.samples_per_s > 0 and trial.first_batch_s > 0 and 0 <= trial.stall_fraction <= 1
    assert trial.config == config


def test_a_tuned_pool_fits_the_cluster_and_names_its_choice(ray_session):
    steps: list = []
    cluster = {"nodes": 1, "cpus": 2.0, "gpus": 0.0, "node_cpus": [2.0], "resources": []}
    tuning = tune_pool(_bench(steps), costs=Costs(0.005, 1.0, 0.001), cluster=cluster, drivers=1, budget=3.0,
                       max_tasks=None)
    assert tuning.source == "tuned" and tuning.samples_per_s and len(tuning.trials) >= 1
    assert tuning.config.tasks * tuning.config.cpus <= 2.0 - 1.0, "one CPU stays with Ray Data's own stages"
    assert "within 5% of the best measured rate" in tuning.reason and steps


def test_a_ray_shut_down_by_someone_else_is_started_again_and_its_files_removed(ray_session):
    old = ray_session[0]
    assert session_module.open_session(None, num_cpus=2) is old, "one session per process"
    temp_dir, session_dir = old.temp_dir, old.session_dir
    ray.shutdown()  # not autoloader's shutdown(): the user's code, say
    new = session_module.open_session(None, num_cpus=2)
    ray_session[0] = new
    ray_session[1].update(child.pid for child in psutil.Process().children())
    assert new is not old and new.local and new.owned and ray.is_initialized()
    assert not os.path.exists(temp_dir) and not (session_dir and os.path.exists(session_dir))
    assert new.temp_dir != temp_dir and os.path.isdir(new.temp_dir)
