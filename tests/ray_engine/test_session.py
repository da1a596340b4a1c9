"""This process's connection to Ray (autoloader/ray/session.py) without Ray: an address that does not answer is a
ConnectionError naming the fix within ``CONNECT_S``, a failed join names ``ray start``, a local start that fails
leaves no directory, closing removes only what autoloader made (and never touches a Ray it does not own), and the
workers' import path is the driver's. ``ray.init`` is a stand-in passed as the ``ray`` argument; starting and
shutting down a real Ray is in tests/integrations (test_ray.py, test_ray_engine.py)."""
import os
import socket
import sys
import time
from types import SimpleNamespace

import pytest

from autoloader.ray import session as session_module
from autoloader.ray.session import CONNECT_S, Session, _connect, _driver_path, _remove_session, _start_local, \
    check_reachable


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
    assert time.monotonic() - started < CONNECT_S + 1
    message = str(info.value)
    assert f"no Ray cluster answers at address='127.0.0.1:{port}'" in message
    assert f"`ray start --head --port={port}` on 127.0.0.1" in message and "address=None" in message


class StandInRay:
    """``ray.init`` recorded; ``error``: raised by it; ``context``: what it returns."""

    def __init__(self, error=None, context=None):
        self.error, self.context, self.calls = error, context, []

    def init(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        return self.context


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
