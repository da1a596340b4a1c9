"""Machine probe: cgroup parsing, CPU/memory facts, disk measurement, GPU discovery decisions, profile I/O, CLI."""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autoloader import probe
from autoloader.probe import _cgroup, _disk, _gpu
from autoloader.cli import main
from autoloader.errors import AutoloaderWarning
from autoloader.probe import (CpuInfo, DiskInfo, GpuInfo, MachineProfile, MemoryInfo, ShmInfo, load_profile,
                              probe_machine, save_profile)
from autoloader.report import format_profile

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
G = 1 << 30
M = 1 << 20


# ---------------------------------------------------------------- cgroups

def _case(name):
    root = FIXTURES / name
    return (root / "proc_cgroup").read_text(), root


@pytest.mark.parametrize("name, quota, limit, headroom", [
    ("v1", 1.5, 2 * G, 2 * G - (G - 512 * M)),        # co-mounted cpu,cpuacct; usage minus total_inactive_file
    ("v1_unlimited", None, None, None),                # this machine's layout: quota -1, limit 2**63-4096
    ("v1_container", 0.5, G, G),                       # own path missing: the walk reaches the mount root
    ("v2", 2.5, 4 * G, 4 * G - (G - 256 * M)),         # memory.high "max" ignored; usage minus inactive_file
    ("v2_nested", 0.5, G, 256 * M),                    # the parent's tighter limits bind the child
    ("v2_unlimited", None, None, None),
    ("garbage", None, None, None),
    ("missing", None, None, None),
])
def test_cgroup_fixtures(name, quota, limit, headroom):
    text, root = _case(name)
    assert _cgroup.cpu_quota(text, root) == quota
    assert _cgroup.memory_limit(text, root) == limit
    assert _cgroup.memory_headroom(text, root) == headroom


def test_cgroup_limit_at_or_above_physical_memory_is_no_limit():
    text, root = _case("v2")
    assert _cgroup.memory_limit(text, root, total_bytes=8 * G) == 4 * G
    assert _cgroup.memory_limit(text, root, total_bytes=4 * G) is None
    assert _cgroup.memory_headroom(text, root, total_bytes=4 * G) is None


def test_cgroup_garbage_proc_text_and_missing_root(tmp_path):
    for text in ("", "hello\n::\n1:2\n", "0::relative/path\n", "0::/../../escape\n"):
        assert _cgroup.cpu_quota(text, FIXTURES / "v2") is None
        assert _cgroup.memory_limit(text, FIXTURES / "v2") is None
    assert _cgroup.cpu_quota("0::/a\n1:cpu:/a", tmp_path / "absent") is None
    assert _cgroup.memory_headroom("4:memory:/a", tmp_path / "absent") is None


def test_cgroup_parse_functions():
    assert _cgroup.parse_cpu_max("max 100000\n") is None
    assert _cgroup.parse_cpu_max("150000 100000") == 1.5
    assert _cgroup.parse_cpu_max("50000") == 0.5              # period defaults to 100 ms
    for bad in ("", "banana", "0 100000", "-1 100000", "100 0", "1e5 1e5"):
        assert _cgroup.parse_cpu_max(bad) is None, bad
    assert _cgroup.parse_cfs("-1\n", "100000\n") is None
    assert _cgroup.parse_cfs("200000", "100000") == 2.0
    assert _cgroup.parse_cfs("x", "100000") is None
    assert _cgroup.parse_memory_value("max\n") is None
    assert _cgroup.parse_memory_value("9223372036854771712") is None
    assert _cgroup.parse_memory_value("1073741824\n") == G
    assert _cgroup.parse_memory_value("1073741824", total_bytes=G) is None
    for bad in ("", "-5", "0", "lots", "1.5G"):
        assert _cgroup.parse_memory_value(bad) is None, bad
    assert _cgroup.parse_memory_stat("cache 1\ntotal_inactive_file 42\n", "total_inactive_file") == 42
    assert _cgroup.parse_memory_stat("inactive_file x\n", "inactive_file") is None
    assert _cgroup.parse_proc_cgroup("4:cpu,cpuacct:/a/b\n0::/\nbad\n") == [(("cpu", "cpuacct"), "/a/b"), ((), "/")]


def test_cgroup_on_this_machine_does_not_raise():
    quota = _cgroup.cpu_quota()
    limit = _cgroup.memory_limit()
    assert quota is None or quota > 0
    assert limit is None or limit > 0


# ---------------------------------------------------------------- CPU, memory, profile

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
    assert (mem.limit_bytes, mem.budget_bytes) == (3 * M, M)


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


def _full_profile():
    return MachineProfile(
        cpu=CpuInfo(usable=3, logical=8, physical=4, model="Test CPU", affinity=6, quota=2.5),
        memory=MemoryInfo(total_bytes=16 * G, available_bytes=10 * G, limit_bytes=8 * G, budget_bytes=7 * G),
        shm=ShmInfo("/dev/shm", 8 * G, None),
        disk=DiskInfo("/data", 640.0, 12000.0, 9000.0, "o_direct"),
        gpus=(GpuInfo(0, "Fake GPU", 80 * G), GpuInfo(1, "Fake GPU", 80 * G)),
        start_method="spawn", torch_version="2.13.0", python_version="3.11.7",
        thread_env={"OMP_NUM_THREADS": "1"}, created=1700000000.5)


def test_profile_json_round_trip():
    for profile in (_full_profile(), probe_machine(disk=False, gpus=False)):
        data = json.loads(json.dumps(profile.to_dict()))
        assert data["schema"] == 1
        assert MachineProfile.from_dict(data) == profile


def _garbage_profiles():
    good = _full_profile().to_dict()

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


def test_save_and_load_profile(tmp_path, cache_dir):
    profile = _full_profile()
    path = save_profile(profile, tmp_path)
    assert path == tmp_path / "machine.json"
    assert load_profile(tmp_path) == profile
    assert load_profile(tmp_path / "nothing-here") is None
    assert save_profile(profile) == cache_dir / "machine.json"   # default: AUTOLOADER_CACHE_DIR
    assert load_profile() == profile


@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": 1}), "\xff\xfe"])
def test_load_corrupt_profile_warns_and_returns_none(tmp_path, text):
    (tmp_path / "machine.json").write_text(text, encoding="latin-1")
    with pytest.warns(AutoloaderWarning, match="machine profile") as record:
        assert load_profile(tmp_path) is None
    assert record[0].filename == __file__                       # stacklevel points at the caller


def test_format_profile_shows_facts_and_unknowns():
    text = format_profile(_full_profile())
    for fragment in ("usable", "3", "cgroup quota 2.5", "Test CPU", "8.0 GiB", "640 MB/s", "12,000 IOPS",
                     "O_DIRECT", "cuda:1 Fake GPU", "OMP_NUM_THREADS=1", "spawn"):
        assert fragment in text, fragment
    assert "unknown" in text                                     # shm free_bytes is None
    bare = probe_machine(disk=False, gpus=False)
    bare_text = format_profile(MachineProfile(**{**bare.__dict__, "disk": DiskInfo("/dev/shm", None, None, 5e3,
                                                                                    None)}))
    assert "could not be bypassed" in bare_text and "GPUs" in bare_text


# ---------------------------------------------------------------- disk

def _probe_files(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith(".autoloader-disk-probe-"))


def test_disk_probe_on_a_real_disk(tmp_path):
    if _disk.filesystem_type(str(tmp_path)) in _disk.MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} is on a memory filesystem")
    start = time.monotonic()
    info = _disk.measure_disk(tmp_path, seconds=1.0)
    assert time.monotonic() - start < 5.0
    assert info.bypass in ("o_direct", "fadvise")
    for figure in (info.seq_read_mb_s, info.rand_read_iops, info.cached_seq_read_mb_s):
        assert figure is not None and 0 < figure < math.inf
    assert os.listdir(tmp_path) == []


def test_disk_probe_fadvise_fallback(tmp_path, monkeypatch):
    if _disk.filesystem_type(str(tmp_path)) in _disk.MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} is on a memory filesystem")
    monkeypatch.setattr(_disk, "_open_direct", lambda name, buf: None)
    info = _disk.measure_disk(tmp_path, seconds=0.5, size_bytes=8 * M)
    assert info.bypass == "fadvise"
    assert info.seq_read_mb_s > 0 and info.rand_read_iops > 0
    assert os.listdir(tmp_path) == []


def test_disk_probe_on_tmpfs_does_not_report_ram_as_disk():
    if not os.path.isdir("/dev/shm") or _disk.filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs /dev/shm")
    before = _probe_files("/dev/shm")
    info = _disk.measure_disk("/dev/shm", seconds=0.5, size_bytes=8 * M)
    assert (info.bypass, info.seq_read_mb_s, info.rand_read_iops) == (None, None, None)
    assert info.cached_seq_read_mb_s is not None and info.cached_seq_read_mb_s > 0
    assert _probe_files("/dev/shm") == before


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError(5, "Input/output error")])
@pytest.mark.parametrize("victim", ["_cached_read", "_random_reads"])
def test_disk_probe_cleans_up_when_interrupted(tmp_path, monkeypatch, error, victim):
    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(_disk, victim, boom)
    fds_before = len(os.listdir("/proc/self/fd"))
    if error is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            _disk.measure_disk(tmp_path, seconds=0.5, size_bytes=4 * M)
    else:
        assert _disk.measure_disk(tmp_path, seconds=0.5, size_bytes=4 * M) == DiskInfo(str(tmp_path), None, None,
                                                                                      None, None)
    assert os.listdir(tmp_path) == []
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_disk_probe_on_missing_or_non_directory_path(tmp_path):
    missing = tmp_path / "absent"
    assert _disk.measure_disk(missing, seconds=0.1) == DiskInfo(str(missing), None, None, None, None)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert _disk.measure_disk(a_file, seconds=0.1).seq_read_mb_s is None


@pytest.mark.parametrize("kwargs, name", [({"seconds": 0}, "seconds"), ({"seconds": math.nan}, "seconds"),
                                          ({"block": 1000}, "block"), ({"size_bytes": 4096}, "size_bytes")])
def test_disk_probe_rejects_bad_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        _disk.measure_disk(tmp_path, **kwargs)


def test_filesystem_type_from_mounts_text():
    mounts = ("/dev/vda / ext4 rw 0 0\n"
              "tmpfs /dev/shm tmpfs rw 0 0\n"
              "/dev/sdb /mnt/my\\040data xfs rw 0 0\n"
              "/dev/sdc /mnt/over ext4 rw 0 0\n"
              "tmpfs /mnt/over tmpfs rw 0 0\n"
              "garbage\n")
    assert _disk.filesystem_type("/", mounts) == "ext4"
    assert _disk.filesystem_type("/dev/shm", mounts) == "tmpfs"
    assert _disk.filesystem_type("/dev/shmem", mounts) == "ext4"     # a prefix of the name is not a parent
    assert _disk.filesystem_type("/mnt/my data/train", mounts) == "xfs"
    assert _disk.filesystem_type("/mnt/over/x", mounts) == "tmpfs"  # the later mount shadows the earlier
    assert _disk.filesystem_type("/x", "") is None


# ---------------------------------------------------------------- GPUs (decision code, on CPU)

class _Props:
    def __init__(self, name, total_memory):
        self.name, self.total_memory = name, total_memory


def _forbid(name):
    def fail(*args, **kwargs):
        raise AssertionError(f"{name} must not be called")
    return fail


def test_gpus_in_process_when_cuda_is_already_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: _Props(f"GPU{i}", (i + 1) * G))
    monkeypatch.setattr(subprocess, "run", _forbid("subprocess.run"))
    assert _gpu.probe_gpus() == (GpuInfo(0, "GPU0", G), GpuInfo(1, "GPU1", 2 * G))


def test_gpus_none_without_a_cuda_build(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    monkeypatch.setattr(subprocess, "run", _forbid("subprocess.run"))
    assert _gpu.probe_gpus() == ()


def _fake_run(child=None, smi=None):
    """subprocess.run stand-in: ``child``/``smi`` are (returncode, stdout) or an exception to raise."""
    def run(argv, **kwargs):
        result = child if argv[0] == sys.executable else smi
        if isinstance(result, BaseException):
            raise result
        if result is None:
            raise AssertionError(f"unexpected command {argv}")
        return subprocess.CompletedProcess(argv, result[0], result[1], "boom")
    return run


@pytest.fixture
def cuda_build(monkeypatch):
    """Pretend torch has CUDA but nothing initialised it; in-process CUDA queries are forbidden."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", _forbid("torch.cuda.is_available in-process"))
    monkeypatch.setattr(torch.cuda, "device_count", _forbid("torch.cuda.device_count in-process"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_gpus_from_a_child_process(monkeypatch, cuda_build):
    out = "some warning\n" + json.dumps([{"index": 0, "name": "NVIDIA H200", "total_bytes": 140 * G}]) + "\n"
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(0, out)))
    assert _gpu.probe_gpus() == (GpuInfo(0, "NVIDIA H200", 140 * G),)
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(0, "[]\n")))
    assert _gpu.probe_gpus() == ()


@pytest.mark.parametrize("child", [(1, ""), (0, "not json"), (0, '{"a": 1}'),
                                   subprocess.TimeoutExpired("python", 60), OSError("no exec")])
def test_gpus_fall_back_to_nvidia_smi(monkeypatch, cuda_build, child):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", _fake_run(child=child, smi=(0, "NVIDIA H200, 143771, GPU-aaa\n")))
    assert _gpu.probe_gpus() == (GpuInfo(0, "NVIDIA H200", 143771 * M),)


def test_gpus_unknown_when_everything_fails(monkeypatch, cuda_build):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(1, "")))
    assert _gpu.probe_gpus() is None
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", _fake_run(child=(1, ""), smi=(9, "")))
    assert _gpu.probe_gpus() is None


def test_parse_nvidia_smi_and_visible_devices():
    text = "A100, 40960, GPU-aaa\nH100, 81559, GPU-bbb\nL4, 23034, GPU-ccc\n"
    a, h, l4 = GpuInfo(0, "A100", 40960 * M), GpuInfo(1, "H100", 81559 * M), GpuInfo(2, "L4", 23034 * M)
    assert _gpu.parse_nvidia_smi(text) == (a, h, l4)
    assert _gpu.parse_nvidia_smi(text, "2,0") == (GpuInfo(0, "L4", l4.total_bytes), GpuInfo(1, "A100", a.total_bytes))
    assert _gpu.parse_nvidia_smi(text, "GPU-bb") == (GpuInfo(0, "H100", h.total_bytes),)
    assert _gpu.parse_nvidia_smi(text, "0,7,1") == (a,)          # CUDA stops at the first invalid entry
    assert _gpu.parse_nvidia_smi(text, "") == ()
    assert _gpu.parse_nvidia_smi(text, "MIG-123") is None        # cannot map a MIG device: unknown
    assert _gpu.parse_nvidia_smi("H100, [N/A], GPU-x\n") is None
    assert _gpu.parse_nvidia_smi("") == ()


# ---------------------------------------------------------------- CLI

def _cli(args, tmp_path, prefix=()):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOLOADER_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([*prefix, sys.executable, "-m", "autoloader.cli", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


def test_cli_probe_json(tmp_path):
    proc = _cli(["probe", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"cpu", "memory", "shm", "disk", "gpus", "start_method", "torch_version",
                         "python_version", "thread_env", "created", "schema"}
    assert set(data["cpu"]) == {"usable", "logical", "physical", "model", "affinity", "quota"}
    assert set(data["memory"]) == {"total_bytes", "available_bytes", "limit_bytes", "budget_bytes"}
    assert set(data["shm"]) == {"path", "total_bytes", "free_bytes"}
    assert set(data["disk"]) == {"path", "seq_read_mb_s", "rand_read_iops", "cached_seq_read_mb_s", "bypass"}
    assert data["disk"]["path"] == str(tmp_path / "cache")
    saved = tmp_path / "cache" / "machine.json"
    assert MachineProfile.from_dict(json.loads(saved.read_text())) == MachineProfile.from_dict(data)
    assert _probe_files(tmp_path / "cache") == []


def test_cli_probe_under_taskset_sees_one_cpu(tmp_path):
    if shutil.which("taskset") is None:
        pytest.skip("taskset not installed")
    proc = _cli(["probe", "--json", "--no-disk"], tmp_path, prefix=("taskset", "-c", "0"))
    assert proc.returncode == 0, proc.stderr
    cpu = json.loads(proc.stdout)["cpu"]
    assert (cpu["usable"], cpu["affinity"]) == (1, 1)


def test_cli_probe_table_and_usage_errors(tmp_path, cache_dir, capsys):
    assert main(["probe", "--no-disk"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Machine profile") and "not probed" in out
    assert str(cache_dir / "machine.json") in err
    assert load_profile() is not None
    assert main(["probe", "--bogus"]) == 2
    assert main(["probe", "--data-dir", str(tmp_path / "absent")]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "probe" in capsys.readouterr().out


def test_cli_probe_fails_with_one_line_when_the_profile_cannot_be_saved(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(blocker / "cache"))
    assert main(["probe", "--no-disk", "--json"]) == 1
    out, err = capsys.readouterr()
    json.loads(out)
    assert err.count("\n") == 1 and "cannot save" in err
