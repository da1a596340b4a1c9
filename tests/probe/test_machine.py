"""probe_machine (autoloader.probe.machine): CPU and memory facts, cgroup limits applied, the profile's JSON and
its file."""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time

import pytest
import torch

from autoloader import probe
from autoloader.probe import MachineProfile, probe_machine
from helpers import full_profile

G = 1 << 30
M = 1 << 20


def test_probe_machine_facts_and_speed():
    start = time.perf_counter()
    profile = probe_machine(disk=False, gpus=False)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, "without the disk and GPU parts the probe reads a few files (2 ms here)"
    assert profile.disk is None and profile.gpus is None
    assert profile.cpu.logical == os.cpu_count()
    assert profile.cpu.affinity == len(os.sched_getaffinity(0))
    assert 1 <= profile.cpu.usable <= profile.cpu.affinity
    total = profile.memory.total_bytes
    assert 0 < profile.memory.budget_bytes <= profile.memory.available_bytes <= total
    assert profile.shm.path == "/dev/shm"
    assert profile.torch_version == torch.__version__
    assert profile.python_version.startswith(f"{sys.version_info.major}.{sys.version_info.minor}")


def test_usable_cpus_respect_the_cgroup_quota(monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(probe._cgroup, "cpu_quota", lambda text: 0.5)
    cpu = probe_machine(disk=False, gpus=False).cpu
    assert (cpu.quota, cpu.usable) == (0.5, 1)
    monkeypatch.setattr(probe._cgroup, "cpu_quota", lambda text: affinity + 7.2)
    assert probe_machine(disk=False, gpus=False).cpu.usable == affinity


def test_memory_budget_is_capped_by_cgroup_headroom(monkeypatch):
    monkeypatch.setattr(probe._cgroup, "memory_limit", lambda text, total_bytes: 3 * M)
    monkeypatch.setattr(probe._cgroup, "memory_headroom", lambda text, total_bytes: M)
    mem = probe_machine(disk=False, gpus=False).memory
    assert (mem.limit_bytes, mem.budget_bytes, mem.headroom_bytes) == (3 * M, M, M)


def test_a_profile_saved_before_headroom_was_recorded_still_loads():
    data = probe_machine(disk=False, gpus=False).to_dict()
    assert "headroom_bytes" in data["memory"]
    del data["memory"]["headroom_bytes"]
    assert MachineProfile.from_dict(data).memory.headroom_bytes is None


def test_thread_env_and_start_method_have_no_side_effect(monkeypatch):
    for var in probe.THREAD_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    before = multiprocessing.get_start_method(allow_none=True)
    profile = probe_machine(disk=False, gpus=False)
    assert profile.thread_env == {"OMP_NUM_THREADS": "3"}
    assert multiprocessing.get_start_method(allow_none=True) == before
    assert profile.start_method == (before or multiprocessing.get_all_start_methods()[0])


def test_probe_machine_rejects_bad_arguments():
    with pytest.raises(TypeError, match="disk"):
        probe_machine(disk="yes")
    with pytest.raises(ValueError, match="disk_seconds"):
        probe_machine(disk_seconds=0)


# ---------------------------------------------------------------- the profile's JSON and file


def test_profile_json_round_trip():
    for profile in (full_profile(), probe_machine(disk=False, gpus=False)):
        data = json.loads(json.dumps(profile.to_dict()))
        assert data["schema"] == 1
        assert MachineProfile.from_dict(data) == profile


def _garbage_profiles():
    good = full_profile().to_dict()

    def edit(path, value):
        data = json.loads(json.dumps(good))
        *parents, key = path
        target = data
        for p in parents:
            target = target[p]
        if value is KeyError:
            del target[key]
        else:
            target[key] = value
        return data

    yield None
    yield []
    yield "machine"
    yield {}
    yield edit(["schema"], 2)
    yield edit(["schema"], True)
    yield edit(["cpu"], None)
    yield edit(["cpu", "usable"], "2")
    yield edit(["cpu", "usable"], True)
    yield edit(["cpu", "usable"], -1)
    yield edit(["cpu", "quota"], float("nan"))
    yield edit(["cpu", "model"], 5)
    yield edit(["cpu", "extra"], 1)
    yield edit(["memory", "total_bytes"], KeyError)
    yield edit(["memory", "budget_bytes"], 1.5)
    yield edit(["disk", "bypass"], "magic")
    yield edit(["disk", "seq_read_mb_s"], float("inf"))
    yield edit(["gpus"], "cuda:0")
    yield edit(["gpus"], [{"index": 0, "name": "x"}])
    yield edit(["thread_env"], {"OMP_NUM_THREADS": 1})
    yield edit(["created"], None)
    yield edit(["torch_version"], None)
    yield edit(["surprise"], 1)


@pytest.mark.parametrize("data", list(_garbage_profiles()))
def test_from_dict_rejects_garbage(data):
    with pytest.raises(ValueError):
        MachineProfile.from_dict(data)
