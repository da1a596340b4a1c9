"""The Ray engine's modules on a real local Ray (one per module, 6 logical CPUs on this 2-core machine, so that six
tasks run at once), what their tests in tests/ray_engine cannot check without one: ``pipeline.dataset_for`` sets
``preserve_order`` and the run's CPU limit on its own dataset only; ``Feed`` reads a real run in order with six tasks
in flight in six worker processes, finishing out of order (the low indices take longest), whatever the user's
``DataContext`` says, and stops it when closed early; a batch that raises leaves the rest of its block; a worker that
dies is retried, and named when Ray gives up; ``work.kept`` keeps real object references; ``source.Payload`` names the
fix for what Ray cannot serialise; ``trials.run_trial`` and ``tune_pool`` measure real runs and choose between real
candidates, a cold start counted as start-up, not as the pool's rate; and ``session.open_session`` starts a new Ray
(the old one's files removed) when someone else shut the last one down. Runs only when tests/integrations is named
(its conftest.py)."""
from __future__ import annotations

import os
import threading
import uuid

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("ray", reason="Ray Data is not installed: pip install '.[integrations]'")

import ray  # noqa: E402

import autoloader.ray  # noqa: E402
from autoloader.consumer import Consumer  # noqa: E402
from autoloader.ray import failures  # noqa: E402
from autoloader.ray import session as session_module  # noqa: E402
from autoloader.ray import work  # noqa: E402
from autoloader.ray.order import chunk_of  # noqa: E402
from autoloader.ray.pipeline import Feed, dataset_for  # noqa: E402
from autoloader.ray.records import RayConfig  # noqa: E402
from autoloader.ray.source import Payload  # noqa: E402
from autoloader.ray.transport import Failure  # noqa: E402
from autoloader.ray.trials import Bench, Costs, run_trial, tune_pool  # noqa: E402
from autoloader.ray.waits import BATCH, STARTUP  # noqa: E402
from helpers import wait_no_children  # noqa: E402
from ray_data import Cold, Dies, Gathered, Indexed, KeyFailing, SlowLow  # noqa: E402
from _helpers import strays  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.ray]
CPUS = 6
"""Logical CPUs of the module's Ray: more than the tasks of any run here, on 2 real cores (the tasks mostly sleep)."""
LIMITS = dict(first=STARTUP.with_seconds(120), wait=BATCH.with_seconds(60))


@pytest.fixture(scope="module")
def ray_session():
    """The local Ray autoloader starts (6 CPUs), shared by the module; after it, shut down with nothing left.
    Yields ``[session, roots]``: a test that starts another Ray puts its session and processes there."""
    session = session_module.open_session(None, num_cpus=CPUS)
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


def _payload(dataset, collate_fn=None):
    return ray.put((dataset, collate_fn if collate_fn is not None else DataLoader(dataset).collate_fn))


def _drain(feed) -> list:
    got = []
    try:
        while True:
            got.append(feed.next())
    except StopIteration:
        return got
    finally:
        feed.close()


def test_preserve_order_and_the_cpu_limit_are_set_on_the_runs_dataset_only(ray_session):
    before = ray.data.DataContext.get_current()
    order, limits = before.execution_options.preserve_order, before.execution_options.resource_limits
    chunk = chunk_of([[0, 1], [2, 3]], start=0, batched=True)
    ds = dataset_for(ray, _payload(Indexed(8)), ray.put(chunk), chunk, RayConfig(3, cpus=0.5), name="probe")
    assert ds.context.execution_options.preserve_order is True
    assert ds.context.execution_options.resource_limits.cpu == 1.5 and ds.context.enable_progress_bars is False
    after = ray.data.DataContext.get_current()
    assert after.execution_options.preserve_order is order and after.execution_options.resource_limits == limits, \
        "the user's DataContext was changed"


@pytest.mark.parametrize("batch_size, config", [(3, RayConfig(2, batches_per_task=2, prefetch=2)),
                                                (None, RayConfig(1, batches_per_task=4))])
def test_a_feed_reads_a_real_run_in_order(ray_session, batch_size, config):
    dataset = Indexed(20)
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(9))
    indices = _index_batches(plain)
    chunk = chunk_of(indices, start=7, batched=batch_size is not None)
    got = _drain(Feed(ray, _payload(dataset, plain.collate_fn), chunk, config, **LIMITS))
    assert [pos for pos, _ in got] == list(range(7, 7 + len(indices)))
    assert [_ids(batch) for _, batch in got] == indices  # each batch holds the samples of its own indices


def test_six_tasks_in_flight_finish_out_of_order_and_the_batches_come_in_order(ray_session, tmp_path):
    """Every sample waits until four worker processes are loading at once (so at least four tasks are in flight, in
    four processes), then sleeps, 1 s below index 8 and 0.05 s above, so the first blocks finish last; the user's own
    DataContext says preserve_order=False, which the run's dataset does not read."""
    dataset = Gathered(48, folder=str(tmp_path), parties=4, slow=8, seconds=1.0, fast=0.05, timed=True)
    plain = DataLoader(dataset, batch_size=2, shuffle=False)
    indices = _index_batches(plain)
    config = RayConfig(6, batches_per_task=2, prefetch=6)
    current = ray.data.DataContext.get_current()
    saved = current.execution_options.preserve_order
    current.execution_options.preserve_order = False
    try:
        got = _drain(Feed(ray, _payload(dataset), chunk_of(indices, start=0, batched=True), config, **LIMITS))
    finally:
        current.execution_options.preserve_order = saved
    assert [pos for pos, _ in got] == list(range(len(indices)))
    assert [_ids(batch) for _, batch in got] == [b[1].tolist() for b in plain], "not a plain DataLoader's"
    blocks = [got[k:k + 2] for k in range(0, len(got), 2)]
    spans = [(min(float(b[3].min()) for _, b in block), max(float(b[4].max()) for _, b in block)) for block in blocks]
    pids = {int(pid) for _, batch in got for pid in batch[2]}
    assert len(pids) >= 4 and len(os.listdir(tmp_path)) >= 4, f"blocks loaded by {len(pids)} processes: {pids}"
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most >= 4, f"at most {most} blocks were loading at once: {spans}"
    assert any(spans[j][1] < spans[i][1] for i in range(len(spans)) for j in range(i + 1, len(spans))), \
        "no block finished before one started ahead of it: the order was never at stake"


def test_a_batch_that_raises_is_its_exception_and_the_rest_of_its_block_is_served(ray_session):
    dataset = KeyFailing(12, bad=5)
    got = _drain(Feed(ray, _payload(dataset), chunk_of([[i] for i in range(12)], start=0, batched=True),
                      RayConfig(2, batches_per_task=4, prefetch=2), **LIMITS))
    assert [pos for pos, _ in got] == list(range(12))
    failed = got[5][1]
    assert isinstance(failed, Failure) and isinstance(failed.error, KeyError) and "sample 5 has no label" in \
        failed.message
    assert [_ids(batch) for pos, batch in got if pos != 5] == [[i] for i in range(12) if i != 5]


def test_a_worker_that_dies_is_retried_and_named_when_ray_gives_up(ray_session, tmp_path, monkeypatch):
    once, always = tmp_path / "once", tmp_path / "always"
    once.mkdir()
    always.mkdir()
    batches = [[i] for i in range(8)]
    got = _drain(Feed(ray, _payload(Dies(8, bad=3, times=1, marks=str(once))),
                      chunk_of(batches, start=0, batched=True), RayConfig(2, batches_per_task=2), **LIMITS))
    assert [_ids(batch) for _, batch in got] == batches and len(os.listdir(once)) == 1, "retried once, then loaded"
    monkeypatch.setattr(failures, "TASK_RETRIES", 1)
    feed = Feed(ray, _payload(Dies(8, bad=3, times=99, marks=str(always))), chunk_of(batches, start=0, batched=True),
                RayConfig(2, batches_per_task=2), **LIMITS)
    with pytest.raises(RuntimeError, match=r"batch \d+ of the epoch, or one loading beside it, could not be loaded: "
                                           r"the Ray worker loading it died .*WorkerCrashedError.*Ray ran the task 2 "
                                           r"times and gave up"):
        _drain(feed)
    assert len(os.listdir(always)) == 2


def test_a_feed_closed_early_stops_its_thread(ray_session):
    dataset = Indexed(64)
    feed = Feed(ray, _payload(dataset), chunk_of([[i] for i in range(64)], start=0, batched=True),
                RayConfig(2, batches_per_task=2), **LIMITS)
    assert feed.next()[0] == 0
    feed.close()
    feed._thread.join(20)
    assert not feed._thread.is_alive(), "the reading thread (and Ray Data's execution) went on after close()"
    assert not [t for t in threading.enumerate() if t.name == "autoloader-ray-feed" and t.is_alive()]


def test_a_worker_process_keeps_real_objects_by_reference(ray_session, monkeypatch):
    monkeypatch.setattr(work, "_KEPT", type(work._KEPT)())
    monkeypatch.setattr(work, "KEEP", 2)
    refs = [ray.put((Indexed(n), None)) for n in (1, 2, 3)]
    first = work.kept(refs[0])
    assert first[0].n == 1 and work.kept(refs[0]) is first, "a kept object is not fetched again"
    work.kept(refs[1])
    work.kept(refs[2])  # KEEP = 2: the first goes
    assert list(work._KEPT) == [refs[1].hex(), refs[2].hex()]
    again = work.kept(refs[0])
    assert again[0].n == 1 and again is not first, "an evicted object is fetched from Ray again"


def test_a_dataset_ray_cannot_serialise_is_a_type_error_naming_the_fix(ray_session):
    payload = Payload(threading.Lock(), None)
    with pytest.raises(TypeError, match=r"(?s)cannot be pickled .* define them at module level"):
        payload.ref(ray, ray_session[0])
    fine = Payload(Indexed(4), None)
    assert fine.ref(ray, ray_session[0]) is fine.ref(ray, ray_session[0])
    assert ray.get(fine.ref(ray, ray_session[0]))[0].n == 4


def _bench(steps: list, dataset=None) -> Bench:
    dataset = dataset if dataset is not None else Indexed(96)
    template = DataLoader(dataset, batch_size=4)
    consumer = Consumer(lambda batch: steps.append(_ids(batch)), torch.device("cpu"))
    return Bench(ray, _payload(dataset, template.collate_fn), template, consumer, startup=STARTUP.with_seconds(120),
                 wait=BATCH.with_seconds(60))


def test_a_trial_runs_the_step_on_every_batch_and_measures_the_window_after_the_burst(ray_session):
    steps: list = []
    config = RayConfig(1, batches_per_task=2)
    trial = run_trial(_bench(steps), config, seconds=120.0, step_s=0.0)
    assert trial.reason == "" or trial.reason is None, trial.reason
    assert trial.batches >= 8 and len(steps) > trial.batches, "the window is the batches after its opening"
    assert trial.samples_per_s > 0 and trial.first_batch_s > 0 and 0 <= trial.stall_fraction <= 1
    assert trial.config == config


CLUSTER = {"nodes": 1, "cpus": float(CPUS), "gpus": 0.0, "node_cpus": [float(CPUS)], "resources": []}


def test_the_search_chooses_between_real_candidates(ray_session):
    """Samples that wait 0.1 s (I/O, not CPU) load faster with more tasks: the search measures several pools and
    keeps one of several tasks, within the cluster's 6 CPUs (at most 6 tasks: max_workers=6)."""
    steps: list = []
    dataset = SlowLow(400, slow=400, seconds=0.1)
    tuning = tune_pool(_bench(steps, dataset), costs=Costs(0.4, 0.05, 0.1), cluster=CLUSTER, drivers=1,
                       budget=5.0, max_tasks=6)
    measured = {t.config.tasks: t.samples_per_s for t in tuning.trials if t.ok}
    assert tuning.source == "tuned" and len(measured) >= 2, str(tuning)
    assert tuning.config.tasks >= 2 and tuning.config.cluster_cpus <= CPUS, str(tuning)
    assert "within 5% of the best measured rate" in tuning.reason and steps


def test_a_cold_start_is_start_up_not_the_pools_rate(ray_session):
    """Each worker process's first sample waits 3 s (workers importing torch on a cluster's nodes): the warm-up takes
    it, kept as start-up, outside the trials' rates and the 4 s budget, and the search still compares candidates and
    keeps more than one task."""
    steps: list = []
    dataset = Cold(400, token=uuid.uuid4().hex, cold=3.0, seconds=0.1, slow=400)
    tuning = tune_pool(_bench(steps, dataset), costs=Costs(0.4, 0.05, 0.1), cluster=CLUSTER, drivers=1,
                       budget=4.0, max_tasks=6)
    assert tuning.startup_s is not None and tuning.startup_s >= 3.0, str(tuning)
    measured = [t for t in tuning.trials if t.ok]
    assert tuning.source == "tuned" and len(measured) >= 2 and tuning.config.tasks > 1, str(tuning)
    assert "start-up" in str(tuning)


def test_a_ray_shut_down_by_someone_else_is_started_again_and_its_files_removed(ray_session):
    old = ray_session[0]
    assert session_module.open_session(None, num_cpus=2) is old, "one session per process"
    temp_dir, session_dir = old.temp_dir, old.session_dir
    session_module._readers_ended()  # the trials' runs left early: Ray gone under a thread in it ends the process
    ray.shutdown()  # not autoloader's shutdown(): the user's code, say
    new = session_module.open_session(None, num_cpus=2)
    ray_session[0] = new
    ray_session[1].update(child.pid for child in psutil.Process().children())
    assert new is not old and new.local and new.owned and ray.is_initialized()
    assert not os.path.exists(temp_dir) and not (session_dir and os.path.exists(session_dir))
    assert new.temp_dir != temp_dir and os.path.isdir(new.temp_dir)
