"""``make_loader(..., engine="ray")`` on a local Ray that autoloader starts (one per module: Ray takes seconds to
start; 6 logical CPUs on this 2-core machine), the contracts as hypothesis properties with four to six tasks in
flight: exact batches against a plain DataLoader over reshuffled epochs (shuffle, a weighted or subset sampler, a
batch sampler, ``batch_size=None``), the ambient RNG left as a plain loop leaves it, exact resume by index; a batch
whose ``__getitem__`` raises is raised at its ``next()`` as the dataset's own exception and the epoch goes on, as a
plain DataLoader's does; a task that never returns, an unreachable cluster, a user's Ray (initialised before, at
another address, or in place of autoloader's) as clear errors or left alone; every process and file of autoloader's
own making gone after ``shutdown()``.

The properties fix the pool (``make._decide`` replaced by the drawn configuration: the contracts hold for any, and a
search takes seconds), and their dataset holds every sample until four worker processes are loading at once
(``ray_data.Gathered``), its low indices taking longest: the first epoch's blocks are loaded by at least four tasks
together and finish out of order. Ray runs only when this folder is named (``python -m pytest tests/integrations``):
the default run stays free of it (tests/integrations/conftest.py). Examples per property:
``AUTOLOADER_RAY_EXAMPLES`` (default 4)."""
from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import tempfile
import threading
import time

import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

pytest.importorskip("ray", reason="Ray Data is not installed: pip install '.[integrations]'")

import autoloader.ray  # noqa: E402
from autoloader import make_loader  # noqa: E402
from autoloader.ray import make as make_module  # noqa: E402
from autoloader.ray import session as ray_session_module  # noqa: E402
from autoloader.ray.records import RayConfig, RayTuning  # noqa: E402
from autoloader.ray.session import EXECUTOR_PREFIX, ITERATOR_THREAD  # noqa: E402
from _helpers import strays  # noqa: E402
from helpers import wait_no_children  # noqa: E402
from ray_data import Gathered, Indexed, KeyFailing, SlowLow  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.ray]

EXAMPLES = int(os.environ.get("AUTOLOADER_RAY_EXAMPLES", "4"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CPUS = 6
FAST = dict(cache=False, step=0.001)


@pytest.fixture(scope="module")
def ray_session():
    """The local Ray autoloader starts (6 CPUs), shared by the module; after it, shut down with nothing left."""
    session = ray_session_module.open_session(None, num_cpus=CPUS)
    assert session.local and session.owned and session.temp_dir is not None
    roots = {child.pid for child in psutil.Process().children()}
    yield session, roots
    temp_dir, session_dir = session.temp_dir, session.session_dir
    autoloader.ray.shutdown()
    left = wait_no_children(30.0)
    assert not left, f"Ray processes left after shutdown(): {[(p.pid, p.name()) for p in left]}"
    assert not os.path.exists(temp_dir), f"autoloader's Ray directory {temp_dir} was not removed"
    assert session_dir and not os.path.exists(session_dir), f"Ray's session directory {session_dir} was not removed"


@pytest.fixture(autouse=True)
def no_process_left_behind(ray_session):
    """conftest's check, but Ray's own processes (and their workers) live for the module (``ray_session``)."""
    yield
    _, roots = ray_session
    left = strays(roots)
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"


@contextlib.contextmanager
def fixed(config: RayConfig):
    """make_loader with ``config`` in place of the search (the rest of make_loader as it is)."""
    def decide(request, arguments, source, shape, *, timeout):
        return RayTuning(config, None, "fixed", shape, reason="fixed by the test"), None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(make_module, "_decide", decide)
        yield


def _ids(batch) -> list:
    return batch[1].tolist() if isinstance(batch[1], torch.Tensor) else batch[1]


SAMPLINGS = ("shuffle", "sequential", "weighted", "subset", "batch_sampler", "unbatched")


def sampling(kind: str, n: int, batch_size: int, drop_last: bool, seed: int) -> dict:
    """Fresh DataLoader arguments of one ``kind`` (each call its own sampler and generator, seeded alike)."""
    generator = torch.Generator().manual_seed(seed)
    if kind in ("shuffle", "sequential"):
        return dict(batch_size=batch_size, shuffle=kind == "shuffle", drop_last=drop_last, generator=generator)
    if kind == "weighted":
        weights = [1.0 + (i % 3) for i in range(n)]
        return dict(batch_size=batch_size, drop_last=drop_last,
                    sampler=WeightedRandomSampler(weights, num_samples=n, generator=generator))
    if kind == "subset":
        return dict(batch_size=batch_size, drop_last=drop_last,
                    sampler=SubsetRandomSampler(list(range(0, n, 2)) + [n - 1], generator=generator))
    if kind == "batch_sampler":
        return dict(batch_size=1, batch_sampler=BatchSampler(RandomSampler(range(n), generator=generator),
                                                             batch_size, drop_last))
    return dict(batch_size=None, sampler=RandomSampler(range(n), generator=generator))


LOADERS = dict(n=st.integers(24, 72), batch_size=st.integers(1, 6), drop_last=st.booleans(), kind=st.sampled_from(
    SAMPLINGS), seed=st.integers(0, 2 ** 16), tasks=st.integers(4, 6), block=st.integers(1, 3),
    prefetch=st.integers(1, 6))


def _config(batches, tasks, block, prefetch) -> RayConfig:
    """The drawn pool, its block small enough that an epoch of ``batches`` has four blocks to load at once."""
    return RayConfig(tasks, batches_per_task=max(1, min(block, batches // 4)), prefetch=prefetch)


@pytest.fixture
def folders(tmp_path):
    """A fresh folder per example for ``Gathered``'s rendezvous."""
    made = []

    def folder():
        made.append(tmp_path / f"gather{len(made)}")
        made[-1].mkdir()
        return str(made[-1])

    return folder


def _loader(dataset, n, batch_size, drop_last, kind, seed, config):
    with fixed(config):
        return make_loader(dataset, engine="ray", **FAST, **sampling(kind, n, batch_size, drop_last, seed))


def _dataset(n, batch_size, drop_last, kind, seed, folder, tasks, block, prefetch, *, gather=True):
    """The dataset (every sample held until min(4, blocks) worker processes load at once), the epoch's length and the
    pool."""
    batches = len(DataLoader(Indexed(n), **sampling(kind, n, batch_size, drop_last, seed)))
    config = _config(batches, tasks, block, prefetch)
    parties = min(4, -(-batches // config.batches_per_task)) if gather else 1
    return Gathered(n, folder=folder, parties=parties, slow=6, seconds=0.05, fast=0.002), config, parties


def _epochs(loader, count):
    return [[_ids(batch) for batch in loader] for _ in range(count)]


@PROPERTY
@given(**LOADERS)
def test_epochs_are_exactly_a_plain_dataloaders(ray_session, folders, n, batch_size, drop_last, kind, seed, tasks,
                                                 block, prefetch):
    """Same samples, order and batch boundaries over two reshuffled epochs, and the loop's RNGs after them, with four
    to six tasks in flight, four of them loading at once in four processes (fewer only when an epoch has fewer than
    four blocks)."""
    folder = folders()
    dataset, config, parties = _dataset(n, batch_size, drop_last, kind, seed, folder, tasks, block, prefetch)
    loader = _loader(dataset, n, batch_size, drop_last, kind, seed, config)
    torch.manual_seed(7)
    random.seed(7)
    got, after = _epochs(loader, 2), (torch.rand(1).item(), random.random())
    torch.manual_seed(7)
    random.seed(7)
    want = _epochs(DataLoader(dataset, **sampling(kind, n, batch_size, drop_last, seed)), 2)
    assert got == want
    assert after == (torch.rand(1).item(), random.random())
    assert loader.tuning.config == config and loader.stats.batches == len(want[1])
    assert len(os.listdir(folder)) >= parties, f"fewer than {parties} worker processes loaded the first epoch"


@PROPERTY
@given(**LOADERS, stop=st.floats(0, 1), stop_epoch=st.integers(0, 1))
def test_a_resume_yields_the_rest_exactly(ray_session, folders, n, batch_size, drop_last, kind, seed, tasks, block,
                                          prefetch, stop, stop_epoch):
    """Saved after k batches of epoch ``stop_epoch``, loaded into a new loader: the batches the uninterrupted run
    would have yielded next, to the end of epoch 1 (four to six tasks, not held to load at once: a resumed epoch
    may have fewer blocks left than that)."""
    dataset, config, _ = _dataset(n, batch_size, drop_last, kind, seed, folders(), tasks, block, prefetch,
                                  gather=False)
    loader = _loader(dataset, n, batch_size, drop_last, kind, seed, config)
    torch.manual_seed(11)
    want = [b for epoch in _epochs(DataLoader(dataset, **sampling(kind, n, batch_size, drop_last, seed)), 2)
            for b in epoch]
    torch.manual_seed(11)
    served = []
    for _ in range(stop_epoch):
        served += [_ids(b) for b in loader]
    k = int(stop * len(loader))
    it = iter(loader)
    served += [_ids(next(it)) for _ in range(k)]
    state = loader.state_dict()
    it.close()
    again = _loader(dataset, n, batch_size, drop_last, kind, seed, config)
    again.load_state_dict(state)
    rest = [_ids(b) for epoch in range(stop_epoch, 2) for b in again]
    assert served + rest == want


def _served(loader) -> list:
    """Every batch's ids, or the type and message of what its next() raised, until the epoch ends."""
    out, it = [], iter(loader)
    while True:
        try:
            out.append(_ids(next(it)))
        except StopIteration:
            return out
        except KeyError as err:
            out.append(("KeyError", str(err)))


def test_a_batch_that_raises_is_raised_at_its_next_and_the_epoch_goes_on(ray_session):
    """A new user's case: 200 samples, batch 10, ``__getitem__`` raising KeyError at sample 57 in Ray's workers. A plain
    DataLoader raises it at batch 5 and serves the other 19 batches; so does engine='ray', with six tasks."""
    dataset = KeyFailing(200, bad=57)
    with fixed(RayConfig(6, batches_per_task=2, prefetch=6)):
        loader = make_loader(dataset, 10, engine="ray", **FAST)
    got, want = _served(loader), _served(DataLoader(dataset, 10))
    assert want[5] == ("KeyError", "'sample 57 has no label'") and len(want) == 20
    assert got == want


def test_no_thread_of_the_trials_is_in_ray_when_make_loader_returns(ray_session):
    """CI, 1 run in 5: the user shut autoloader's Ray down right after make_loader returned, while the last trial's
    threads were still cancelling its tasks; one of them called into Ray, which started again on that thread and died
    with it (Ray's GCS gone, the process ended 60 s later). The trials' reading threads and Ray Data's executions of
    them have ended when make_loader returns."""
    before = set(threading.enumerate())
    make_loader(SlowLow(256, slow=256, seconds=0.02), 4, engine="ray", cache=False, budget=2.0, max_workers=2,
                step=0.001)
    left = [t.name for t in set(threading.enumerate()) - before
            if t.name in ("autoloader-ray-feed", ITERATOR_THREAD) or t.name.startswith(EXECUTOR_PREFIX)]
    assert not left, left


def test_a_second_address_in_one_process_is_refused(ray_session):
    with pytest.raises(ValueError, match=r"one process is one Ray driver: call autoloader.ray.shutdown\(\)"):
        make_loader(Indexed(8), 2, engine="ray", address="127.0.0.1:1", **FAST)


SCRIPT = '''
import os, sys, json, time
sys.path[:0] = {paths!r}
import torch
from autoloader import make_loader
from ray_data import Indexed
mode = sys.argv[1]
if mode == "unreachable":
    try:
        make_loader(Indexed(8), 2, engine="ray", address="127.0.0.1:9", cache=False)
    except ConnectionError as err:
        print("ConnectionError:", err)
    sys.exit(0)
if mode == "blocking":  # its own process: the stuck tasks and the thread waiting on them die with it
    from ray_data import Blocking
    started = time.monotonic()
    try:
        make_loader(Blocking(8, seconds=60.0), 2, engine="ray", timeout=3, cache=False, budget=2.0, max_workers=1,
                    step=0.001)
    except TimeoutError as err:
        print("tuning TimeoutError:", err, "after", round(time.monotonic() - started, 1), flush=True)
    os._exit(0)  # the stuck task's thread and Ray go with the process
import ray
import autoloader.ray
from autoloader.ray import session
if mode == "users":
    env = {{"env_vars": {{"PYTHONPATH": os.pathsep.join({paths!r})}}}}  # the user's Ray: their workers' path
    ray.init(num_cpus=1, _temp_dir=sys.argv[2], include_dashboard=False, runtime_env=env)
    loader = make_loader(Indexed(16), 4, engine="ray", cache=False, budget=2.0, max_workers=1)
    print("batches", sum(1 for _ in loader), "owned", session._SESSION.owned, flush=True)
    for kwargs in (dict(address="127.0.0.1:1"), dict(runtime_env={{"working_dir": "."}})):
        try:
            make_loader(Indexed(16), 4, engine="ray", cache=False, **kwargs)
        except ValueError as err:
            print("ValueError:", err, flush=True)
    autoloader.ray.shutdown()
    print("still initialised", ray.is_initialized(), flush=True)
    ray.shutdown()
    loader = make_loader(Indexed(16), 4, engine="ray", cache=False, budget=2.0, max_workers=1)  # autoloader's own
    ours = session._SESSION
    print("ours", ours.owned, ours.local, flush=True)
    ray.shutdown()  # the user replaces it with their own Ray
    ray.init(num_cpus=1, _temp_dir=sys.argv[2], include_dashboard=False, runtime_env=env)
    loader = make_loader(Indexed(16), 4, engine="ray", cache=False, budget=2.0, max_workers=1)
    print("replaced batches", sum(1 for _ in loader), "owned", session._SESSION.owned,
          "ours removed", not os.path.exists(ours.temp_dir or "/nonexistent-al"), flush=True)
    autoloader.ray.shutdown()
    print("replacement still initialised", ray.is_initialized(), flush=True)
    ray.shutdown()
    sys.exit(0)
loader = make_loader(Indexed(16), 4, engine="ray", cache=False, budget=2.0, max_workers=1)
print("batches", sum(1 for _ in loader))
print("temp", session._SESSION.temp_dir, "session", session._SESSION.session_dir)
'''


def _script(tmp_path, *args):
    import subprocess

    from _helpers import HERE, ROOT
    path = tmp_path / "ray_script.py"
    path.write_text(SCRIPT.format(paths=[str(ROOT), str(HERE), str(ROOT / "tests")]))
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=200,
                          cwd=str(tmp_path))


def test_a_task_that_never_returns_is_a_timeout_naming_the_limit_and_the_fix(ray_session, tmp_path):
    """In a process of its own: shutting Ray down under a thread still blocked in it ended the whole process
    (pytest with it) in 2 runs of this module, some seconds after the shutdown. With timeout=3, the warm-up's first
    batch gives up within it, naming the limit and the fix (a later batch's limit, BATCH, is hit through the real
    ``Feed`` in tests/ray_engine/test_pipeline.py)."""
    proc = _script(tmp_path, "blocking")
    out = proc.stdout
    found = re.search(r"tuning TimeoutError: autoloader: the first batch of a run of Ray tasks .* did not finish "
                      r"within 3 s .*\(autoloader.ray.waits.STARTUP\).*timeout=<seconds>.* after ([\d.]+)", out)
    assert found and float(found.group(1)) < 60, out[-3000:] + proc.stderr[-3000:]


def test_an_unreachable_cluster_is_a_connection_error_naming_the_fix(ray_session, tmp_path):
    started = time.monotonic()
    proc = _script(tmp_path, "unreachable")
    assert "ConnectionError: no Ray cluster answers at address='127.0.0.1:9'" in proc.stdout, proc.stderr[-3000:]
    assert "ray start --head --port=9" in proc.stdout and "autoloader.ray.waits.CONNECT" in proc.stdout
    assert time.monotonic() - started < 60


def test_a_local_ray_autoloader_started_is_gone_at_exit(ray_session, tmp_path):
    """No shutdown() call: the exit shuts it down, processes and directory."""
    proc = _script(tmp_path, "local")
    assert proc.returncode == 0 and "batches 4" in proc.stdout, proc.stderr[-3000:]
    temp_dir = proc.stdout.split("temp ", 1)[1].split()[0]
    session_dir = proc.stdout.split(" session ", 1)[1].split()[0]
    assert not os.path.exists(temp_dir) and not os.path.exists(session_dir), (temp_dir, session_dir)
    deadline = time.monotonic() + 20
    while _processes_of(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_of(temp_dir)


def test_a_ray_the_user_initialised_or_put_in_autoloaders_place_is_never_shut_down(ray_session, tmp_path):
    """The user's Ray is used as it is; address= naming another cluster and runtime_env= are ValueErrors naming the
    fix; a Ray the user started after shutting autoloader's down is taken for theirs, never stopped by autoloader."""
    import shutil

    temp = tempfile.mkdtemp(prefix="al-ru-", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        proc = _script(tmp_path, "users", temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    out = proc.stdout
    assert proc.returncode == 0 and "batches 4 owned False" in out, out[-3000:] + proc.stderr[-3000:]
    assert re.search(r"ValueError: this process's Ray, which you initialised, is the cluster at \S+, not "
                     r"address='127.0.0.1:1'", out), out
    assert "ValueError: runtime_env= applies to the Ray autoloader starts or joins" in out
    assert "still initialised True" in out and "ours True True" in out
    assert "replaced batches 4 owned False ours removed True" in out and "replacement still initialised True" in out



def _processes_of(temp_dir: str) -> list:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in process.info["cmdline"] or ()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found
