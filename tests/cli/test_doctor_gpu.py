"""The doctor's GPU checks (autoloader.cli.doctor_gpu): the usable GPUs, and the processes holding the NVIDIA device
files, read from fake /proc trees: daemons, init processes and other users skipped, only our orphans offered a kill."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from autoloader.cli._holders import INIT, ORPHAN, OTHER_USER, RUNNING, DeviceHolder, classify_holder, find_nvidia_holders
from autoloader.cli.doctor_gpu import check_gpu_holders, check_gpus
from autoloader.probe import GpuInfo


ME = 1000
"""Our uid in the fake trees."""


def fake_proc(root: Path, processes: dict) -> str:
    """A /proc tree: for each ``pid: (name, ppid, uid, cmdline, devices)`` a ``status``, a ``cmdline`` and ``fd``
    links (the devices, plus a socket and a file that must be ignored); a few non-process entries besides."""
    for pid, (name, ppid, uid, cmdline, devices) in processes.items():
        base = root / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "status").write_text(f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\n"
                                     f"PPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (base / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in cmdline))
        for fd, target in enumerate(["socket:[1234]", "/tmp/log.txt", *devices], start=3):
            os.symlink(target, base / "fd" / str(fd))
    (root / "self").mkdir(exist_ok=True)
    (root / "cpuinfo").write_text("processor: 0\n")
    return str(root)


GPU = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")
SPAWN = ("/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, "
         "pipe_handle=7)", "--multiprocessing-fork")
PERSISTENCED = {812: ("nvidia-persiste", 1, 0, ("/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"), GPU)}
HOSTENGINE = {903: ("nv-hostengine", 1, 0, ("/usr/bin/nv-hostengine", "-n", "--service-account", "nvidia-dcgm"), GPU)}
SHELL = {900: ("bash", 1, ME, ("-bash",), ())}

# name: (processes, expected status, what the detail must say, the pids offered `kill` (empty: no kill at all))
HOLDER_CASES = {
    "gpu-daemons-skipped": (
        {**PERSISTENCED, **HOSTENGINE,
         904: ("nv-fabricmanage", 1, 0, ("/usr/bin/nv-fabricmanager", "-c", "/etc/fabricmanager.cfg"), GPU),
         905: ("dcgm-exporter", 1, ME, ("/usr/bin/dcgm-exporter",), GPU),
         906: ("nvidia-cuda-mps", 1, ME, ("nvidia-cuda-mps-control", "-d"), GPU),
         **SHELL, 950: ("nvidia-smi", 900, ME, ("nvidia-smi",), GPU)},
        "ok", ["skipped 6 system daemons: nvidia-persistenced (pid 812), nv-hostengine (pid 903), "
               "nv-fabricmanager (pid 904), dcgm-exporter (pid 905), nvidia-cuda-mps-control (pid 906), "
               "nvidia-smi (pid 950)", "no other process of yours holds /dev/nvidia0"], set()),
    "container-init-skipped": (
        {1: ("sh", 0, ME, ("/bin/sh", "-c", "python train.py"), ("/dev/nvidia0",)),
         77: ("containerd-shim", 1, ME, ("/usr/bin/containerd-shim-runc-v2", "-namespace", "moby"), GPU),
         78: ("pause", 77, ME, ("/pause",), GPU)},
        "ok", ["skipped 3 container init processes: sh (pid 1), containerd-shim-runc-v2 (pid 77), pause (pid 78)"],
        set()),
    "other-users-orphans-skipped": (
        {4100: ("python3", 1, 1001, ("/usr/bin/python3", "train.py"), GPU),
         4101: ("pt_data_worker", 1, 1001, ("/usr/bin/python3", "train.py"), GPU)},
        "ok", ["skipped 2 processes of other users: python3 (pid 4100), pt_data_worker (pid 4101)"], set()),
    "our-orphaned-dataloader-worker": (
        {5000: ("pt_data_worker", 1, ME, ("/usr/bin/python3", "train.py", "--epochs", "90"), GPU)},
        "warn", ["1 process of yours holds", "pid 5000 pt_data_worker (DataLoader worker, orphaned: parent is pid 1)"],
        {5000}),
    "our-spawn-worker-adopted-by-a-subreaper": (
        {7: ("tini", 1, ME, ("/sbin/tini", "-s", "--", "python", "train.py"), ()), 5100: ("python3", 7, ME, SPAWN, GPU)},
        "warn", ["pid 5100 python3 (DataLoader worker, orphaned: adopted by tini (pid 7))"], {5100}),
    "our-orphaned-python-process": (
        {5200: ("python3.11", 1, ME, ("/opt/venv/bin/python3.11", "eval.py"), GPU)},
        "warn", ["pid 5200 python3.11 (orphaned: parent is pid 1)"], {5200}),
    "live-parent-not-flagged": (
        {**SHELL, 6000: ("python3", 900, ME, ("/usr/bin/python3", "train.py"), GPU),
         6001: ("pt_data_worker", 6000, ME, ("/usr/bin/python3", "train.py"), GPU),
         6002: ("pt_data_worker", 6000, ME, ("/usr/bin/python3", "train.py"), ())},
        "info", ["2 processes of yours hold", "pid 6000 python3; pid 6001 pt_data_worker"],
        set()),
    "docker-exec-parent-pid-0-not-flagged": (
        {6100: ("python", 0, ME, ("python", "train.py"), GPU)},
        "info", ["pid 6100 python"], set()),
    "our-orphan-not-python-left-alone": (
        {7000: ("ffmpeg", 1, ME, ("ffmpeg", "-hwaccel", "cuda", "-i", "in.mp4", "out.mp4"), GPU)},
        "info", ["pid 7000 ffmpeg (orphaned: parent is pid 1, not Python: left alone)"], set()),
    "everything-at-once": (
        {**PERSISTENCED, **HOSTENGINE, **SHELL,
         4100: ("python3", 1, 1001, ("/usr/bin/python3", "train.py"), GPU),
         5000: ("pt_data_worker", 1, ME, ("/usr/bin/python3", "train.py"), GPU),
         6000: ("python3", 900, ME, ("/usr/bin/python3", "train.py"), GPU)},
        "warn", ["skipped 2 system daemons: nvidia-persistenced (pid 812), nv-hostengine (pid 903); "
                 "1 process of another user: python3 (pid 4100)", "pid 6000 python3"], {5000}),
}


@pytest.mark.parametrize("case", list(HOLDER_CASES))
def test_gpu_holders_skip_daemons_and_other_users_and_kill_only_our_orphans(tmp_path, case):
    processes, status, fragments, kill = HOLDER_CASES[case]
    holders, denied = find_nvidia_holders(proc_root=fake_proc(tmp_path, processes))
    assert denied == 0
    assert sorted(h.pid for h in holders) == sorted(pid for pid, p in processes.items() if p[4])
    finding = check_gpu_holders(holders, device_files=list(GPU), uid=ME)
    assert finding.status == status, finding
    for fragment in fragments:
        assert fragment in finding.detail, (fragment, finding.detail)
    offered = re.search(r"`kill ([\d ]+)`", finding.fix)
    assert (set(map(int, offered.group(1).split())) if offered else set()) == kill, finding.fix


def test_gpu_holder_facts_read_from_proc(tmp_path):
    processes = {**SHELL, 5100: ("python3", 900, ME, SPAWN, GPU)}
    [holder], _ = find_nvidia_holders(proc_root=fake_proc(tmp_path, processes))
    assert holder == DeviceHolder(5100, "python3", 900, tuple(sorted(GPU)), uid=ME, cmdline=SPAWN, parent_name="bash")
    assert classify_holder(holder, uid=ME) == RUNNING
    assert classify_holder(holder, uid=0) == OTHER_USER
    assert find_nvidia_holders(proc_root=str(tmp_path / "absent")) == ([], 0)


def test_gpu_holder_of_unknown_uid_counts_as_ours(tmp_path):
    orphan = DeviceHolder(5000, "pt_data_worker", 1, ("/dev/nvidia0",))
    assert classify_holder(orphan) == classify_holder(orphan, uid=ME) == ORPHAN
    assert classify_holder(DeviceHolder(1, "python", 0, ("/dev/nvidia0",)), uid=ME) == INIT


def test_the_gpus_check_lists_each_gpu_or_says_why_none(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert check_gpus(None).status == "info" and "probe failed" in check_gpus(None).detail
    none = check_gpus(())
    assert none.status == "info" and "CUDA_VISIBLE_DEVICES=''" in none.detail
    two = check_gpus((GpuInfo(0, "H200", 141 << 30), GpuInfo(1, "H200", 141 << 30)))
    assert two.status == "ok" and two.detail == "cuda:0 H200, 141 GiB; cuda:1 H200, 141 GiB"
    assert check_gpu_holders([], device_files=[]).detail.startswith("no NVIDIA device files")


def test_nvidia_holders_found_from_fd_links(tmp_path):
    fd = tmp_path / str(os.getpid()) / "fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/nvidia0", fd / "7")
    os.symlink("/dev/nvidiactl", fd / "8")
    os.symlink("/tmp/other", fd / "9")
    holders, _ = find_nvidia_holders(proc_root=str(tmp_path))
    [me] = holders
    assert me.pid == os.getpid() and me.devices == ("/dev/nvidia0", "/dev/nvidiactl")
    assert find_nvidia_holders(proc_root=str(tmp_path), exclude={os.getpid()})[0] == []
    files = ["/dev/nvidia0", "/dev/nvidiactl"]
    assert check_gpu_holders(holders, device_files=files).status == "info"
    orphan = check_gpu_holders([DeviceHolder(4242, "python", 1, ("/dev/nvidia0",))], device_files=files)
    assert orphan.status == "warn" and "orphaned" in orphan.detail and "kill 4242" in orphan.fix
    assert check_gpu_holders([], device_files=files).status == "ok"
    none = check_gpu_holders([], device_files=[])
    assert none.status == "info" and "no NVIDIA device files" in none.detail
