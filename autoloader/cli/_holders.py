"""Which processes hold ``/dev/nvidia*`` and what each one is, read from ``/proc`` (``doctor`` decides what to say).

A leftover DataLoader worker (its parent gone) keeps GPU memory for good; a system daemon (persistence, fabric
manager, DCGM, MPS), a container's init or another user's process holds the devices on purpose and is never ours to
kill. Everything is read under ``proc_root``, so tests feed fake ``/proc`` trees.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class DeviceHolder:
    """A process with an open ``/dev/nvidia*`` file."""

    pid: int
    name: str                       # the process name (``/proc/<pid>/status`` Name, 15 characters at most)
    ppid: Optional[int]
    devices: Tuple[str, ...]
    uid: Optional[int] = None       # the real uid; None when unknown
    cmdline: Tuple[str, ...] = ()
    parent_name: Optional[str] = None


GPU_DAEMONS = ("nvidia-persistenced", "nv-fabricmanager", "nvidia-fabricmanager", "nv-hostengine", "dcgm", "dcgmi",
               "nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
"""System GPU daemons and tools that hold ``/dev/nvidia*`` on purpose, usually with parent pid 1 (persistence mode,
NVLink fabric manager, DCGM and its exporter, MPS, nvidia-smi itself): never a leftover to kill."""
CONTAINER_INITS = ("tini", "dumb-init", "docker-init", "containerd-shim", "catatonit", "pause")
"""A container's init or sandbox processes. Pid 1 is always one, whatever its name (``sh``, ``bash``, ``python``)."""
SUBREAPERS = CONTAINER_INITS + ("systemd", "init")
"""Parents that adopt orphans besides pid 1 (``PR_SET_CHILD_SUBREAPER``): a child of one lost its own parent."""
_WORKER_MARKS = ("multiprocessing.spawn", "multiprocessing.forkserver", "--multiprocessing-fork")

# What classify_holder says about a holder; the first three are skipped, only ORPHAN is offered ``kill``.
DAEMON, INIT, OTHER_USER = "system daemon", "container init", "another user"
ORPHAN, ORPHAN_NOT_PYTHON, RUNNING = "orphan", "orphan, not python", "running"


def _named(names: Iterable[str], known: Sequence[str]) -> bool:
    """Whether a process name or executable is one of ``known``, allowing for the kernel's 15-character cut of names
    (``nvidia-persiste``) and for suffixes (``containerd-shim-runc-v2``, ``dcgm-exporter``)."""
    return any(name == k or name.startswith(k + "-") or (len(name) == 15 and k.startswith(name))
               for name in names if name for k in known)


def executable_name(holder: DeviceHolder) -> str:
    return os.path.basename(holder.cmdline[0]) if holder.cmdline else ""


def is_worker(holder: DeviceHolder) -> bool:
    """A DataLoader worker (torch names its thread ``pt_data_worker``) or a spawn/forkserver multiprocessing child."""
    return holder.name == "pt_data_worker" or any(m in arg for arg in holder.cmdline for m in _WORKER_MARKS)


def _is_python(holder: DeviceHolder) -> bool:
    return (is_worker(holder) or holder.name == "pt_main_thread"
            or any(n.startswith("python") for n in (holder.name, executable_name(holder))))


def _parent_gone(holder: DeviceHolder) -> bool:
    """Reparented to pid 1 or to a known subreaper. Parent pid 0 is not gone: it lives outside this pid namespace
    (``docker exec`` starts processes so)."""
    return holder.ppid == 1 or _named([holder.parent_name or ""], SUBREAPERS)


def classify_holder(holder: DeviceHolder, *, uid: Optional[int] = None) -> str:
    """What a process holding ``/dev/nvidia*`` is, for ``check_gpu_holders``:

    - ``DAEMON``: a GPU system daemon or tool (``GPU_DAEMONS``). Skipped.
    - ``INIT``: pid 1 (the container's init, whatever it runs: ``sh``, ``tini``, even ``python``) or a container init
      or sandbox process (``CONTAINER_INITS``). Skipped.
    - ``OTHER_USER``: its real uid is not ``uid`` (ours); not ours to kill. Skipped. An unknown uid counts as ours.
    - ``ORPHAN``: ours, its parent is gone (parent pid 1 or a subreaper in ``SUBREAPERS``) and it is a DataLoader
      worker or at least a Python process: the leftover that keeps its GPU memory. The only kind offered ``kill``.
    - ``ORPHAN_NOT_PYTHON``: ours and orphaned, but not Python (someone's daemon, a tool): shown, left alone.
    - ``RUNNING``: ours with a live parent (or one that could not be read): a job in progress. Shown, left alone.
    """
    names = [holder.name, executable_name(holder)]
    if _named(names, GPU_DAEMONS):
        return DAEMON
    if holder.pid == 1 or _named(names, CONTAINER_INITS):
        return INIT
    if uid is not None and holder.uid is not None and holder.uid != uid:
        return OTHER_USER
    if not _parent_gone(holder):
        return RUNNING
    return ORPHAN if _is_python(holder) else ORPHAN_NOT_PYTHON


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _status_fields(text: Optional[str]) -> Dict[str, str]:
    fields = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text.split()[0]) if text else None
    except ValueError:
        return None


def find_nvidia_holders(*, proc_root: str = "/proc", exclude: Iterable[int] = ()) -> Tuple[List[DeviceHolder], int]:
    """Processes with an open ``/dev/nvidia*`` file (what ``fuser -v /dev/nvidia*`` shows) and how many could not
    be inspected (other users' processes, when not root).

    Everything is read under ``proc_root`` (tests pass a fake tree): the ``fd`` links of every ``<pid>`` directory
    (``psutil``'s ``open_files()`` skips device files), and for each holder its ``status`` (``Name``, ``PPid``, the
    real ``Uid``), its ``cmdline`` and its parent's ``Name``. A missing file leaves that fact unknown.

    Nothing is decided here: ``check_gpu_holders`` sorts the holders with ``classify_holder``. It skips the GPU system
    daemons (nvidia-persistenced, the fabric manager, DCGM's nv-hostengine/dcgmi/dcgm-exporter, MPS, nvidia-smi), the
    container's init and sandbox processes (pid 1 whatever its name, tini, dumb-init, docker-init, containerd-shim,
    catatonit, pause) and other users' processes, and says what it skipped; it offers ``kill`` only for a process of
    ours whose parent is gone (parent pid 1 or a subreaper) and that is a DataLoader worker or at least Python.
    """
    skip = set(exclude)
    holders: List[DeviceHolder] = []
    denied = 0
    try:
        pids = sorted(int(n) for n in os.listdir(proc_root) if n.isdigit())
    except OSError:
        return [], 0
    for pid in pids:
        if pid in skip:
            continue
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except PermissionError:
            denied += 1
            continue
        except OSError:         # gone meanwhile, or not a process directory
            continue
        devices = set()
        for fd in names:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                devices.add(target)
        if not devices:
            continue
        status = _status_fields(_read(os.path.join(proc_root, str(pid), "status")))
        ppid = _int(status.get("PPid"))
        parent = _status_fields(_read(os.path.join(proc_root, str(ppid), "status"))) if ppid else {}
        cmdline = tuple(a for a in (_read(os.path.join(proc_root, str(pid), "cmdline")) or "").split("\0") if a)
        holders.append(DeviceHolder(pid, status.get("Name") or "?", ppid, tuple(sorted(devices)),
                                    uid=_int(status.get("Uid")), cmdline=cmdline, parent_name=parent.get("Name")))
    return holders, denied
