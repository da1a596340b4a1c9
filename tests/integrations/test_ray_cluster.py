"""engine='ray' on clusters, each node a raylet of its own on this machine's loopback (no second machine here): a
``ray.cluster_utils.Cluster`` (the step on a head with no CPU, which first waits for a CPU node, then the tasks on
the CPU nodes; a node that dies mid-epoch; a module the nodes lack, shipped by ``runtime_env``) and two torchrun ranks
joining a ``ray start`` cluster, each rank its own driver. Each run is a script of
its own (ray_cluster_script.py, ray_torchrun_script.py) started in a session of its own: when it has exited, no
process of that session may be left (``_run``), before the session is killed anyway."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

pytest.importorskip("ray", reason="Ray Data is not installed: pip install '.[integrations]'")

from _helpers import HERE, ROOT, check_epochs, child_env, read_reports, teardown_abort_only, torchrun  # noqa: E402,E501

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def _processes_of(temp_dir: str) -> list:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in process.info["cmdline"] or ()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _gone(temp_dir: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while _processes_of(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _processes_of(temp_dir)


def _in_session(sid: int) -> list:
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found


def _run(command, env, timeout: float = 240.0, out_dir=None) -> str:
    """Run ``command`` in a session of its own; fail on a non-zero exit, or when a process of that session is still
    running 20 s after it exited (then killed)."""
    process = subprocess.Popen(list(map(str, command)), env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        deadline = time.monotonic() + 20
        while _in_session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [(p.pid, p.name()) for p in _in_session(process.pid)]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"{command} did not finish in {timeout:.0f} s: {process.communicate()[0][-4000:]}")
    finally:
        for leftover in _in_session(process.pid):
            leftover.kill()
    if not teardown_abort_only(process.returncode, output, out_dir, 2):  # gloo's rare abort after the reports
        assert process.returncode == 0, output[-6000:]
    assert not left, f"processes left behind by {command}: {left}\n{output[-3000:]}"
    return output


def _env(**extra: str) -> dict:
    return child_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), str(ROOT / "tests")]), **extra)


def test_a_cluster_of_raylets_waits_for_cpus_survives_a_dead_node_and_ships_missing_code(tmp_path):
    output = _run([sys.executable, HERE / "ray_cluster_script.py", tmp_path], _env())
    report = json.loads((tmp_path / "report.json").read_text())
    message, seconds = report["no_cpu"]
    assert "a Ray cluster with no CPU getting its first CPU node did not finish within 2 s" in message, message
    assert "autoloader.ray.waits.NODES" in message and "--num-cpus=N" in message and seconds < 30
    assert report["waited_s"] >= 2.5, "make_loader returned before the CPU node joined"
    assert report["exact"], report
    assert report["nodes"] == [report["worker"]] and report["worker"] != report["head"], report
    assert report["tuning"]["cluster"]["nodes"] == 2 and report["tuning"]["cluster"]["cpus"] == 2.0
    assert report["tuning"]["config"]["tasks"] * report["tuning"]["config"]["cpus"] <= 2.0
    assert report["second_source"] == "cache", "the decision is cached under the cluster's shape"
    died = report["node_died"]
    assert died["exact"] and died["batches"] == 16, "the dead node's tasks were not run again"
    assert died["doomed_loaded"] and not died["doomed_after"], died
    is_missing, text = report["missing"]
    assert is_missing and "cannot import the module 'al_missing_module'" in text and "py_modules" in text, text
    assert report["shipped_exact"], "runtime_env's py_modules did not reach the workers"
    temp_dir = output.split("temp ", 1)[1].split()[0]
    assert _gone(temp_dir), f"processes of the cluster left: {_processes_of(temp_dir)}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"ray start exited with {process.returncode}: {process.stdout.read()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"ray start did not listen on {port} within {timeout:.0f} s")


def _stop(process: subprocess.Popen, temp_dir: str) -> None:
    """The ``ray start --block`` session, then any process of this cluster (named by its own directory)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue
    for leftover in _processes_of(temp_dir) + _in_session(process.pid):  # Ray Data's detached actors, too
        leftover.kill()
    deadline = time.monotonic() + 15
    while (_processes_of(temp_dir) or _in_session(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)


def test_two_torchrun_ranks_each_drive_their_share_on_one_ray_start_cluster(tmp_path):
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="al-rs-", dir="/tmp")
    env = _env(RAY_AUTH_MODE="token")
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray, "start", "--head", f"--port={port}", "--num-cpus=3", f"--temp-dir={temp_dir}",
                             "--include-dashboard=false", "--disable-usage-stats", "--block"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            cwd=str(tmp_path))
    try:
        _wait_for_port(port, head)
        out = tmp_path / "out"
        out.mkdir()
        _run(torchrun(HERE / "ray_torchrun_script.py", str(out), f"127.0.0.1:{port}", str(tmp_path / "cache")), env,
             out_dir=out)
        reports = read_reports(out, 2)
    finally:
        _stop(head, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not _in_session(head.pid), "processes of the ray start cluster left"
    assert all(r["exact"] for r in reports), "each rank's batches are a plain DataLoader's over its shard"
    check_epochs([r["epochs"] for r in reports], 64)
    assert reports[0]["tuning"] == reports[1]["tuning"] and reports[0]["pid"] != reports[1]["pid"]
    config = reports[0]["tuning"]["config"]
    assert config["tasks"] * config["cpus"] <= 1.5  # 3 CPUs shared by 2 drivers
    assert all(r["state_ranks"] == 2 for r in reports)
    assert _gone(temp_dir), f"processes of the cluster left: {_processes_of(temp_dir)}"
