"""Which processes hold ``/dev/nvidia*`` and what each is (autoloader.cli._holders), on its own: names cut by the
kernel or suffixed, workers told from their command lines, a parent gone (pid 1, a subreaper) or outside the pid
namespace (pid 0), and ``/proc`` entries missing or half-written. What the doctor says of them is in
test_doctor_gpu.py."""
from __future__ import annotations

import os

import pytest

from autoloader.cli._holders import (DAEMON, INIT, ORPHAN, ORPHAN_NOT_PYTHON, OTHER_USER, RUNNING, DeviceHolder,
                                     classify_holder, executable_name, find_nvidia_holders, is_worker)

ME = 1000


def holder(name="python3", ppid=1, cmdline=(), pid=4000, uid=ME, parent_name=None):
    return DeviceHolder(pid, name, ppid, ("/dev/nvidia0",), uid=uid, cmdline=tuple(cmdline), parent_name=parent_name)


@pytest.mark.parametrize("name, cmdline, expected", [
    ("nvidia-persiste", (), DAEMON),                              # the kernel's 15-character cut
    ("x", ("/usr/bin/dcgm-exporter", "--port", "9400"), DAEMON),  # a suffix, read off the executable
    ("nvidia-smiley", (), ORPHAN_NOT_PYTHON),                     # a name merely starting the same is no daemon
    ("containerd-shim", ("/usr/bin/containerd-shim-runc-v2",), INIT),
    ("python3", ("/usr/bin/python3", "train.py"), ORPHAN),
    ("pt_main_thread", (), ORPHAN),
    ("worker", ("/opt/py/bin/python3.12", "x.py"), ORPHAN),       # Python by its executable
    ("ffmpeg", ("ffmpeg",), ORPHAN_NOT_PYTHON),
])
def test_an_orphan_is_named_by_its_name_or_its_executable(name, cmdline, expected):
    assert classify_holder(holder(name, cmdline=cmdline), uid=ME) == expected


@pytest.mark.parametrize("ppid, parent_name, expected", [
    (1, None, ORPHAN), (0, None, RUNNING), (77, "systemd", ORPHAN), (77, "tini", ORPHAN), (77, "bash", RUNNING),
    (None, None, RUNNING)])
def test_a_parent_is_gone_when_pid_1_or_a_subreaper_adopted_the_process(ppid, parent_name, expected):
    assert classify_holder(holder(ppid=ppid, parent_name=parent_name), uid=ME) == expected


def test_pid_1_is_the_init_and_another_users_process_is_theirs():
    assert classify_holder(holder(pid=1, ppid=0), uid=ME) == INIT
    assert classify_holder(holder(uid=0), uid=ME) == OTHER_USER
    assert classify_holder(holder(uid=0), uid=None) == ORPHAN, "without our uid every process counts as ours"


def test_a_worker_is_torchs_thread_name_or_a_multiprocessing_child():
    assert is_worker(holder("pt_data_worker"))
    assert is_worker(holder("python3", cmdline=("python3", "-c", "from multiprocessing.spawn import spawn_main")))
    assert is_worker(holder("python3", cmdline=("python3", "--multiprocessing-fork")))
    assert not is_worker(holder("python3", cmdline=("python3", "train.py")))
    assert executable_name(holder(cmdline=("/usr/bin/python3", "a"))) == "python3"
    assert executable_name(holder(cmdline=())) == ""


def test_a_holder_whose_status_and_cmdline_are_gone_is_kept_with_its_facts_unknown(tmp_path):
    fd = tmp_path / "4321" / "fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/nvidia-uvm", fd / "3")
    os.symlink("/dev/nvidia0", fd / "4")
    os.symlink("/dev/nvidia0", fd / "5")
    (tmp_path / "4322" / "fd").mkdir(parents=True)  # holds nothing
    (tmp_path / "99").write_text("not a process directory")
    holders, denied = find_nvidia_holders(proc_root=str(tmp_path))
    assert denied == 0
    assert holders == [DeviceHolder(4321, "?", None, ("/dev/nvidia-uvm", "/dev/nvidia0"))]


def test_a_garbled_status_leaves_only_that_fact_unknown(tmp_path):
    base = tmp_path / "4321"
    (base / "fd").mkdir(parents=True)
    os.symlink("/dev/nvidiactl", base / "fd" / "3")
    (base / "status").write_text("Name:\tpython3\nPPid:\tlots\nUid:\t\nnonsense line\n")
    (base / "cmdline").write_bytes(b"python3\0train.py\0")
    [found], _ = find_nvidia_holders(proc_root=str(tmp_path))
    assert (found.name, found.ppid, found.uid, found.cmdline) == ("python3", None, None, ("python3", "train.py"))
