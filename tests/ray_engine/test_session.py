"""This process's connection to Ray (autoloader/ray/session.py) without Ray: an address that does not answer is a
ConnectionError naming the fix within ``waits.CONNECT``, a join that does not return is a TimeoutError within
``waits.INIT`` (and is undone when it returns), a failed join names ``ray start``, a local start that fails leaves no
directory, a Ray the user initialised elsewhere than ``address=`` or with ``runtime_env=`` is refused naming the fix,
a session the user replaced is taken for theirs and never shut down, closing removes only what autoloader made, and
the workers' import path is the driver's (with ``runtime_env``'s own). ``ray`` is a stand-in passed as the ``ray``
argument; starting and shutting down a real Ray is in tests/integrations (test_ray.py, test_ray_engine.py)."""
import os
import socket
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from autoloader.ray import session as session_module
from autoloader.ray import waits
from autoloader.ray.session import Session, _connect, _driver_path, _local_env, _remove_session, _same_address, \
    _start_local, check_reachable, open_session


def _closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once closed


def test_an_address_that_answers_passes_and_other_forms_are_left_to_ray():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    started = time.monotonic()
    for address in ("auto", "ray://127.0.0.1:1", "127.0.0.1", "localhost:http"):
        check_reachable(address)  # no socket tried: none of these is host:port
    assert time.monotonic() - started < 1


def test_an_address_that_does_not_answer_is_a_connection_error_naming_the_fix():
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - started < waits.CONNECT.seconds + 1
    message = str(info.value)
    assert f"no Ray cluster answers at address='127.0.0.1:{port}'" in message
    assert f"`ray start --head --port={port}` on 127.0.0.1" in message and "address=None" in message


class StandInRay:
    """``ray.init`` recorded; ``error``: raised by it; ``context``: what it returns; ``block``: an event it waits
    for first. ``gcs``: the address of the Ray it initialises; each init is a new session."""

    def __init__(self, error=None, context=None, block=None, gcs="10.0.0.1:6379"):
        self.error, self.context, self.block, self.gcs, self.calls = error, context, block, gcs, []
        self.initialised, self.sessions, self.shutdowns = False, 0, 0

    def init(self, **kwargs):
        self.calls.append(kwargs)
        if self.block is not None:
            self.block.wait(10)
        if self.error is not None:
            raise self.error
        self.initialised, self.sessions = True, self.sessions + 1
        return self.context

    def is_initialized(self):
        return self.initialised

    def shutdown(self):
        self.initialised, self.shutdowns = False, self.shutdowns + 1

    def get_runtime_context(self):
        return SimpleNamespace(get_session_name=lambda: f"session_{self.sessions}", get_job_id=lambda: "01000000",
                               gcs_address=self.gcs)


@pytest.mark.parametrize("error", [ConnectionError("refused"), RuntimeError("version mismatch"), ValueError("auth")])
def test_a_failed_join_is_a_connection_error_naming_ray_start(error):
    ray = StandInRay(error)
    with pytest.raises(ConnectionError, match=r"could not join the Ray cluster at address='h:6379' \(.+\)\. Start it "
                                              r"with `ray start --head --port=6379`") as info:
        _connect(ray, "h:6379")
    assert info.value.__cause__ is error and "RAY_AUTH_MODE=token" in str(info.value)
    assert ray.calls[0]["address"] == "h:6379"


def test_an_error_that_is_not_about_joining_is_raised_as_it_is():
    error = KeyError("x")
    with pytest.raises(KeyError) as info:
        _connect(StandInRay(error), "h:6379")
    assert info.value is error


def test_a_local_start_runs_in_a_directory_of_its_own_with_the_drivers_import_path(tmp_path):
    ray = StandInRay(context=SimpleNamespace(address_info={"session_dir": str(tmp_path / "session_1")}))
    session = _start_local(ray, 2)
    try:
        assert (session.owned, session.local, session.address) == (True, True, None)
        assert os.path.isdir(session.temp_dir) and os.path.basename(session.temp_dir).startswith("al-ray-")
        assert session.session_dir == str(tmp_path / "session_1")
        call = ray.calls[0]
        assert call["address"] == "local" and call["num_cpus"] == 2 and call["_temp_dir"] == session.temp_dir
        assert call["runtime_env"] == {"env_vars": {"PYTHONPATH": _driver_path()}}
        assert session.identity == ("session_1", "01000000")
    finally:
        os.rmdir(session.temp_dir)


def test_a_local_start_that_fails_leaves_no_directory(monkeypatch):
    made = []
    mkdtemp = session_module.tempfile.mkdtemp
    monkeypatch.setattr(session_module.tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    with pytest.raises(RuntimeError, match="no room"):
        _start_local(StandInRay(RuntimeError("no room")), 1)
    assert len(made) == 1 and not os.path.exists(made[0])


def test_the_workers_import_path_is_the_drivers_absolute_and_existing(monkeypatch, tmp_path):
    (tmp_path / "code").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", "code", str(tmp_path / "missing"), str(tmp_path / "code")])
    assert _driver_path().split(os.pathsep) == [str(tmp_path), str(tmp_path / "code"), str(tmp_path / "code")]


def test_removing_a_session_removes_ray_latest_link_only_when_it_points_there(tmp_path):
    ours, other = tmp_path / "session_ours", tmp_path / "session_other"
    for folder in (ours, other):
        (folder / "logs").mkdir(parents=True)
    latest = tmp_path / "session_latest"
    latest.symlink_to(other)
    _remove_session(str(ours))
    assert not ours.exists() and latest.is_symlink() and other.exists()
    latest.unlink()
    latest.symlink_to(ours)
    (ours / "logs").mkdir(parents=True)
    _remove_session(str(ours))
    assert not ours.exists() and not latest.is_symlink() and other.exists()


def test_closing_a_session_autoloader_does_not_own_removes_its_files_and_never_touches_ray(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # importing ray fails: closing must not need it
    temp, run = tmp_path / "temp", tmp_path / "session_1"
    temp.mkdir()
    run.mkdir()
    session = Session("h:6379", owned=False, local=False, temp_dir=str(temp), session_dir=str(run))
    session.close()
    assert not temp.exists() and not run.exists() and (session.temp_dir, session.session_dir) == (None, None)
    session.close()  # once only: nothing left to do


def test_shutdown_closes_the_processs_session_once(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(session_module, "_SESSION", Session(None, owned=False, local=False, temp_dir=str(temp)))
    session_module.shutdown()
    assert session_module._SESSION is None and not temp.exists()
    session_module.shutdown()  # nothing open: nothing to do


def test_a_join_that_does_not_return_is_a_timeout_within_init_and_is_undone_when_it_returns(monkeypatch):
    monkeypatch.setattr(session_module, "INIT", waits.INIT.with_seconds(0.3))
    release = threading.Event()
    ray = StandInRay(block=release)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ray.init joining the cluster did not finish within 0.3 s \(joining "
                                           r"address='h:6379'\) \(autoloader.ray.waits.INIT\)"):
        _connect(ray, "h:6379")
    assert time.monotonic() - started < 2
    release.set()
    deadline = time.monotonic() + 5
    while ray.shutdowns == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ray.shutdowns == 1 and not ray.initialised, "a join that came back too late is shut down"


def test_runtime_env_goes_to_the_join_and_keeps_its_own_pythonpath_in_a_local_start():
    ray = StandInRay()
    _connect(ray, "h:6379", {"working_dir": "/code"})
    assert ray.calls[0]["runtime_env"] == {"working_dir": "/code"}
    env = _local_env({"py_modules": ["/m"], "env_vars": {"PYTHONPATH": "/mine", "X": "1"}})
    assert env["py_modules"] == ["/m"] and env["env_vars"]["X"] == "1"
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == "/mine"
    assert env["env_vars"]["PYTHONPATH"].endswith(_driver_path())


@pytest.fixture
def no_session(monkeypatch):
    monkeypatch.setattr(session_module, "_SESSION", None)
    monkeypatch.setattr(session_module.atexit, "register", lambda f: None)


def _users_ray(monkeypatch, gcs="127.0.0.1:6379"):
    ray = StandInRay(gcs=gcs)
    ray.initialised, ray.sessions = True, 1  # the user's own ray.init
    monkeypatch.setattr(session_module, "import_ray", lambda: ray)
    return ray


def test_a_ray_the_user_initialised_is_used_never_owned_and_checked_against_address(monkeypatch, no_session):
    ray = _users_ray(monkeypatch)
    session = open_session("localhost:6379", num_cpus=None)
    assert (session.owned, session.local) == (False, False)
    session.close()
    assert ray.shutdowns == 0 and ray.initialised
    for fresh in (False, True):  # the session of the user's Ray kept from the call above, then a first call
        if fresh:
            monkeypatch.setattr(session_module, "_SESSION", None)
        with pytest.raises(ValueError, match=r"this process's Ray, which you initialised, is the cluster at "
                                             r"127.0.0.1:6379, not address='127.0.0.1:7000': pass address=None to use "
                                             r"it, or call ray.shutdown\(\)"):
            open_session("127.0.0.1:7000", num_cpus=None)
        with pytest.raises(ValueError, match=r"runtime_env= applies to the Ray autoloader starts or joins, but you "
                                             r"initialised Ray yourself: pass runtime_env to your ray.init\(\)"):
            open_session(None, num_cpus=None, runtime_env={"working_dir": "."})


def test_a_session_the_user_replaced_is_theirs_and_never_shut_down_by_autoloader(monkeypatch, no_session, tmp_path):
    ray = _users_ray(monkeypatch)
    temp = tmp_path / "ours"
    temp.mkdir()
    ours = Session(None, owned=True, local=True, temp_dir=str(temp), identity=("session_0", "01000000"))
    monkeypatch.setattr(session_module, "_SESSION", ours)  # autoloader's Ray (session_0) was replaced by session_1
    assert not ours.current(ray)
    ours_again = Session(None, owned=True, local=True, identity=("session_0", "01000000"))
    ours_again.close()
    assert ray.shutdowns == 0, "closing a session whose Ray was replaced stops nothing"
    session = open_session(None, num_cpus=None)
    assert session is not ours and not session.owned and not temp.exists()
    session_module.shutdown()
    assert ray.shutdowns == 0 and ray.initialised


@pytest.mark.parametrize("given, gcs, same", [
    ("127.0.0.1:6379", "127.0.0.1:6379", True), ("localhost:6379", "127.0.0.1:6379", True),
    ("127.0.0.1:6380", "127.0.0.1:6379", False), ("auto", "127.0.0.1:6379", True),
    ("ray://h:10001", "10.0.0.1:6379", True), ("127.0.0.1:6379", None, True)])
def test_an_address_is_compared_by_host_and_port_where_it_can_be(given, gcs, same):
    assert _same_address(given, gcs) is same


def test_shutdown_lets_reading_threads_end_first_within_close(monkeypatch, caplog):
    ray = StandInRay()
    ray.initialised, ray.sessions = True, 1
    monkeypatch.setattr(session_module, "import_ray", lambda: ray)
    monkeypatch.setattr(session_module, "CLOSE", waits.CLOSE.with_seconds(0.3))
    monkeypatch.setattr(session_module, "_READERS", type(session_module._READERS)())
    quick, unread, stuck = threading.Event(), threading.Event(), threading.Event()
    ended = threading.Thread(target=lambda: quick.wait(0.1))
    waiting = threading.Thread(target=lambda: unread.wait(10))  # a run never closed: its thread waits for a loop
    blocked = threading.Thread(target=lambda: stuck.wait(10))  # in Ray: its stop is read after Ray's next block
    for thread, stop in ((ended, threading.Event()), (waiting, unread), (blocked, threading.Event())):
        thread.start()
        session_module.reading(thread, stop)
    monkeypatch.setattr(session_module, "_SESSION", Session(None, owned=True, local=False,
                                                            identity=("session_1", "01000000")))
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="autoloader.ray"):
        session_module.shutdown()
    assert time.monotonic() - started < 2 and ray.shutdowns == 1
    assert not ended.is_alive() and not waiting.is_alive(), "a run's reading thread is told to stop, not waited for"
    assert "1 reading thread(s) still in Ray" in caplog.text and "autoloader.ray.waits.CLOSE" in caplog.text
    stuck.set()
    blocked.join(5)


def test_shutdown_also_lets_ray_datas_executor_threads_end(monkeypatch):
    """A run that left early leaves Ray Data's executor thread cancelling its tasks after its reading thread ended;
    Ray shut down under it ended the process once in two runs of the integration tests."""
    ray = StandInRay()
    ray.initialised, ray.sessions = True, 1
    monkeypatch.setattr(session_module, "import_ray", lambda: ray)
    monkeypatch.setattr(session_module, "_READERS", type(session_module._READERS)())
    done = threading.Event()
    executor = threading.Thread(target=lambda: done.wait(0.2), name="StreamingExecutor-dataset_1_0")
    executor.start()
    monkeypatch.setattr(session_module, "_SESSION", Session(None, owned=True, local=False,
                                                            identity=("session_1", "01000000")))
    session_module.shutdown()
    assert not executor.is_alive() and ray.shutdowns == 1
