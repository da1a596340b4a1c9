"""``make_loader(..., engine="ray")`` on a local Ray that autoloader starts (one per module: Ray takes seconds to
start): the contracts as hypothesis properties (exact batches against a plain DataLoader over reshuffled epochs,
the ambient RNG left as a plain loop leaves it, exact resume by index), a failing task and a task that never
returns as clear errors, and every process and file of autoloader's own making gone after ``shutdown()``.

Ray runs only when this folder is named (``python -m pytest tests/integrations``): the default run stays free of it
(tests/integrations/conftest.py). Examples per property: ``AUTOLOADER_RAY_EXAMPLES`` (default 4)."""
from __future__ import annotations

import os
import random
import re
import sys
import time

import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

pytest.importorskip("ray", reason="Ray Data is not installed: pip install '.[integrations]'")

import autoloader.ray  # noqa: E402
from autoloader import make_loader  # noqa: E402
from autoloader.ray import session as ray_session_module  # noqa: E402
from _helpers import strays  # noqa: E402
from helpers import wait_no_children  # noqa: E402
from ray_data import Failing, Indexed  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.ray]

EXAMPLES = int(os.environ.get("AUTOLOADER_RAY_EXAMPLES", "4"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FAST = dict(cache=False, budget=2.0, max_workers=1, step=0.001)
"""One trial per loader: the contracts hold for any configuration, and Ray's trials take seconds each."""


@pytest.fixture(scope="module")
def ray_session():
    """The local Ray autoloader starts (2 CPUs), shared by the module; after it, shut down with nothing left."""
    session = ray_session_module.open_session(None, num_cpus=2)
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


def _ids(batch) -> list:
    return batch[1].tolist()


def _plain(dataset, batch_size, shuffle, drop_last, seed):
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator)


def _ray(dataset, batch_size, shuffle, drop_last, seed, **extra):
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return make_loader(dataset, batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator, engine="ray",
                       **{**FAST, **extra})


def _epochs(loader, count):
    return [[_ids(batch) for batch in loader] for _ in range(count)]


LOADERS = dict(n=st.integers(3, 48), batch_size=st.integers(1, 7), shuffle=st.booleans(), drop_last=st.booleans(),
               seed=st.one_of(st.none(), st.integers(0, 2 ** 16)))


@PROPERTY
@given(**LOADERS)
def test_epochs_are_exactly_a_plain_dataloaders(ray_session, n, batch_size, shuffle, drop_last, seed):
    """Same samples, order and batch boundaries over two reshuffled epochs, and the loop's RNGs after them."""
    dataset = Indexed(n)
    loader = _ray(dataset, batch_size, shuffle, drop_last, seed)
    torch.manual_seed(7)
    random.seed(7)
    got, after = _epochs(loader, 2), (torch.rand(1).item(), random.random())
    torch.manual_seed(7)
    random.seed(7)
    want = _epochs(_plain(dataset, batch_size, shuffle, drop_last, seed), 2)
    assert got == want
    assert after == (torch.rand(1).item(), random.random())
    assert loader.tuning.source in ("tuned", "fixed") and loader.stats.batches == len(want[1])


@PROPERTY
@given(**LOADERS, stop=st.floats(0, 1), stop_epoch=st.integers(0, 1))
def test_a_resume_yields_the_rest_exactly(ray_session, n, batch_size, shuffle, drop_last, seed, stop, stop_epoch):
    """Saved after k batches of epoch ``stop_epoch``, loaded into a new loader: the batches the uninterrupted run
    would have yielded next, to the end of epoch 1."""
    dataset = Indexed(n)
    torch.manual_seed(11)
    want = [b for epoch in _epochs(_plain(dataset, batch_size, shuffle, drop_last, seed), 2) for b in epoch]
    loader = _ray(dataset, batch_size, shuffle, drop_last, seed)
    torch.manual_seed(11)
    served = []
    for _ in range(stop_epoch):
        served += [_ids(b) for b in loader]
    k = int(stop * len(loader))
    it = iter(loader)
    served += [_ids(next(it)) for _ in range(k)]
    state = loader.state_dict()
    it.close()
    again = _ray(dataset, batch_size, shuffle, drop_last, seed)
    again.load_state_dict(state)
    rest = [_ids(b) for epoch in range(stop_epoch, 2) for b in again]
    assert served + rest == want


def test_a_failing_task_is_a_clear_error_naming_the_datasets_own(ray_session):
    loader = make_loader(Failing(32, bad=20), 4, engine="ray", **FAST)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"a Ray task failed while loading batch \d+ .*ValueError: sample 20 is "
                                           r"corrupt"):
        for _ in loader:
            pass
    assert time.monotonic() - started < 60


def test_a_second_address_in_one_process_is_refused(ray_session):
    with pytest.raises(ValueError, match=r"one process is one Ray driver: call autoloader.ray.shutdown\(\)"):
        make_loader(Indexed(8), 2, engine="ray", address="127.0.0.1:1", **FAST)


SCRIPT = '''
import os, sys, json
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
    import time
    from ray_data import Blocking
    loader = make_loader(Blocking(8, seconds=20.0), 2, engine="ray", timeout=3, cache=False, budget=2.0,
                         max_workers=1, step=0.001)
    print("source", loader.tuning.source, "TimeoutError" in str(loader.tuning), flush=True)
    started = time.monotonic()
    try:
        next(iter(loader))
    except TimeoutError as err:
        print("TimeoutError:", err, "after", round(time.monotonic() - started, 1), flush=True)
    sys.exit(0)
import ray
if mode == "users":
    ray.init(num_cpus=1, _temp_dir=sys.argv[2], include_dashboard=False,  # the user's Ray: their workers' path
             runtime_env={{"env_vars": {{"PYTHONPATH": os.pathsep.join({paths!r})}}}})
loader = make_loader(Indexed(16), 4, engine="ray", cache=False, budget=2.0, max_workers=1)
print("batches", sum(1 for _ in loader))
from autoloader.ray import session
print("temp", session._SESSION.temp_dir, "session", session._SESSION.session_dir)
if mode == "users":
    import autoloader.ray
    autoloader.ray.shutdown()
    print("still initialised", ray.is_initialized())
    ray.shutdown()
'''


def _script(tmp_path, *args):
    import subprocess

    from _helpers import HERE, ROOT
    path = tmp_path / "ray_script.py"
    path.write_text(SCRIPT.format(paths=[str(ROOT), str(HERE), str(ROOT / "tests")]))
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=150,
                          cwd=str(tmp_path))


def test_a_task_that_never_returns_is_a_timeout_naming_the_fix(ray_session, tmp_path):
    """In a process of its own: shutting Ray down under a thread still blocked in it ended the whole process
    (pytest with it) in 2 runs of this module, some seconds after the shutdown."""
    proc = _script(tmp_path, "blocking")
    assert "source fixed True" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"TimeoutError: autoloader: no batch came from Ray within 3 s .*pass timeout=<seconds>.* after "
                      r"([\d.]+)", proc.stdout)
    assert found and float(found.group(1)) < 15, proc.stdout[-3000:]


def test_an_unreachable_cluster_is_a_connection_error_naming_the_fix(ray_session, tmp_path):
    started = time.monotonic()
    proc = _script(tmp_path, "unreachable")
    assert "ConnectionError: no Ray cluster answers at address='127.0.0.1:9'" in proc.stdout, proc.stderr[-3000:]
    assert "ray start --head --port=9" in proc.stdout and time.monotonic() - started < 60


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


def test_a_ray_the_user_initialised_is_never_shut_down(ray_session, tmp_path):
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="al-ru-", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        proc = _script(tmp_path, "users", temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0 and "batches 4" in proc.stdout, proc.stderr[-3000:]
    assert "temp None" in proc.stdout and "still initialised True" in proc.stdout


def _processes_of(temp_dir: str) -> list:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in process.info["cmdline"] or ()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found
