"""The ``MachineProfile``: usable CPUs, memory, /dev/shm, disk and GPUs, probed, saved and loaded.

Every figure is measured or read from the system; one that cannot be is None, never a guess.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import psutil
import torch

from .._fs import default_cache_dir
from . import _cgroup
from ._disk import DiskInfo, measure_disk
from ._fields import int_field, json_object, num_field, str_field
from ._gpu import GpuInfo, probe_gpus
from ._process import THREAD_ENV_VARS, start_method

logger = logging.getLogger("autoloader.probe")

SCHEMA = 1
SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class CpuInfo:
    """``usable``: CPUs this process may run on at once (affinity, capped by the cgroup quota rounded up).
    ``quota``: the cgroup CPU quota in CPUs; None = no quota (or unreadable)."""

    usable: Optional[int]
    logical: Optional[int]
    physical: Optional[int]
    model: Optional[str]
    affinity: Optional[int]
    quota: Optional[float]


@dataclass(frozen=True)
class MemoryInfo:
    """``limit_bytes``: the tightest cgroup memory limit (None = none). ``budget_bytes``: what this process tree can
    still allocate before either the machine runs out (``available_bytes``) or the cgroup limit is hit
    (``headroom_bytes``: limit minus the cgroup's working set; None without a limit); the ceiling for extra workers'
    memory, from which ``search/memory.py`` takes the loader's memory budget."""

    total_bytes: Optional[int]
    available_bytes: Optional[int]
    limit_bytes: Optional[int]
    budget_bytes: Optional[int]
    headroom_bytes: Optional[int] = None


@dataclass(frozen=True)
class ShmInfo:
    """Size and free space of the shared-memory filesystem DataLoader workers pass batches through."""

    path: str
    total_bytes: Optional[int]
    free_bytes: Optional[int]


@dataclass(frozen=True)
class MachineProfile:
    """Everything ``probe_machine`` found about this machine and process: facts only, None where unknown.

    Saved as ``machine.json`` in the cache directory by ``autotune`` and ``autotune probe`` (``to_dict``), where
    ``make_loader`` reads the disk figures it never measures itself.

    Attributes:
        cpu (CpuInfo): ``usable``: the CPUs this process may run on at once (its affinity, capped by the cgroup CPU
            quota rounded up; in containers ``os.cpu_count()`` says more), ``logical``, ``physical``, ``model``,
            ``affinity`` (CPUs in the affinity mask) and ``quota`` (the cgroup quota in CPUs, None without one).
        memory (MemoryInfo): ``total_bytes``, ``available_bytes``, ``limit_bytes`` (the tightest cgroup limit, None
            without one), ``headroom_bytes`` (that limit minus the cgroup's working set) and ``budget_bytes``: what
            may still be allocated, the smaller of the available memory and the headroom, of which
            ``memory_budget=`` takes a share.
        shm (ShmInfo): ``path`` (``/dev/shm``), ``total_bytes`` and ``free_bytes`` of the shared-memory
            filesystem DataLoader workers hand batches through (None when it cannot be read).
        disk (DiskInfo): Read speed under the data directory with the page cache bypassed (``seq_read_mb_s``,
            ``rand_read_iops``, and how: ``bypass``) and through a warm page cache (``cached_seq_read_mb_s``); None
            when not probed (``disk=False``).
        gpus (tuple of GpuInfo): One ``GpuInfo(index, name, total_bytes)`` per visible CUDA device, listed without
            initialising CUDA; () without GPUs; None when not probed (``gpus=False``) or unknown.
        start_method (str): The multiprocessing start method DataLoader workers get by default (``"fork"``,
            ``"spawn"``, ``"forkserver"``), None when unknown.
        torch_version (str): ``torch.__version__``.
        python_version (str): ``platform.python_version()``.
        thread_env (dict): The thread variables set in the environment (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
            ...), name to value.
        created (float): When it was probed, seconds since the epoch (``time.time()``).
    """

    cpu: CpuInfo
    memory: MemoryInfo
    shm: ShmInfo
    disk: Optional[DiskInfo]
    gpus: Optional[Tuple[GpuInfo, ...]]
    start_method: Optional[str]
    torch_version: str
    python_version: str
    thread_env: Dict[str, str]
    created: float

    def to_dict(self) -> dict:
        """The profile as plain JSON data.

        Returns:
            dict: Every field, nested records as dicts, plus ``"schema": 1``; ``from_dict`` reads it back.
        """
        data = asdict(self)
        data["gpus"] = None if self.gpus is None else [asdict(g) for g in self.gpus]
        data["thread_env"] = dict(self.thread_env)
        data["schema"] = SCHEMA
        return data

    @classmethod
    def from_dict(cls, data: object) -> "MachineProfile":
        """Rebuild a profile from what ``to_dict`` returned (e.g. read back from ``machine.json``).

        Args:
            data: The dict ``to_dict`` made, as JSON gives it back.

        Returns:
            MachineProfile: The profile it holds.

        Raises:
            ValueError: ``data`` is not such a dict: another schema, a missing or unknown key, a value of the wrong
                type or out of range (the message names the field).
        """
        return _from_dict(data)


def probe_machine(data_dir: "str | os.PathLike[str] | None" = None, *, disk: bool = True, gpus: bool = True,
                  disk_seconds: float = 5.0) -> MachineProfile:
    """Probe this machine and process: usable CPUs, memory, ``/dev/shm``, disk, GPUs, start method, thread variables.

    Every figure is measured or read from the system (``/proc``, the cgroup v1/v2 files, ``statvfs``); one that
    cannot be is None, never a guess. With ``disk=False, gpus=False`` it only reads files and takes milliseconds
    (what ``make_loader`` does on every call). Nothing is saved: ``autotune probe`` saves it as ``machine.json``.

    Args:
        data_dir: A directory (str or ``os.PathLike``) on the storage your data lives on, where the disk is
            measured. Default None: the cache directory (``$AUTOLOADER_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/autoloader``, else ``~/.cache/autoloader``; created if missing).
        disk (bool): Measure the disk's read speed with the page cache bypassed (``O_DIRECT``, else
            ``posix_fadvise``): writes a temporary file under ``data_dir`` and reads it back, about
            ``disk_seconds``. Default True. NOTE [ Measuring disk reads past the page cache ] in
            ``autoloader/probe/_disk.py``.
        gpus (bool): List the CUDA devices without initialising CUDA in this process (``nvidia-smi`` or a child
            process; NOTE [ Probing GPUs without initialising CUDA ] in ``autoloader/probe/_gpu.py``). Default True.
        disk_seconds (float): About how long the disk measurement may take, in seconds, in (0, 3600). Default 5.

    Returns:
        MachineProfile: What was found; ``disk`` is None with ``disk=False``, ``gpus`` None with ``gpus=False``.

    Raises:
        TypeError: ``disk`` or ``gpus`` is not True or False.
        ValueError: ``disk_seconds`` is not a number of seconds in (0, 3600).
    """
    for name, value in (("disk", disk), ("gpus", gpus)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if isinstance(disk_seconds, bool) or not isinstance(disk_seconds, (int, float)) or not 0 < disk_seconds < 3600:
        raise ValueError(f"disk_seconds must be a number of seconds in (0, 3600), got {disk_seconds!r}")
    memory = psutil.virtual_memory()
    proc_cgroup = _cgroup.read_proc_cgroup()
    disk_info = _probe_disk(data_dir, disk_seconds) if disk else None
    return MachineProfile(
        cpu=_probe_cpu(proc_cgroup),
        memory=_probe_memory(proc_cgroup, int(memory.total), int(memory.available)),
        shm=_probe_shm(),
        disk=disk_info,
        gpus=probe_gpus() if gpus else None,
        start_method=start_method(),
        torch_version=str(torch.__version__),
        python_version=platform.python_version(),
        thread_env={k: os.environ[k] for k in THREAD_ENV_VARS if k in os.environ},
        created=time.time(),
    )


def _probe_cpu(proc_cgroup: str) -> CpuInfo:
    logical = os.cpu_count()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    quota = _cgroup.cpu_quota(proc_cgroup)
    # Without an affinity API (macOS, Windows) every logical CPU is schedulable.
    candidates = [n for n in (affinity if affinity is not None else logical,
                              math.ceil(quota) if quota is not None else None) if n is not None]
    physical, model = _static_cpu_facts()
    return CpuInfo(usable=min(candidates) if candidates else None, logical=logical, physical=physical,
                   model=model, affinity=affinity, quota=quota)


@functools.lru_cache(maxsize=1)
def _static_cpu_facts() -> Tuple[Optional[int], Optional[str]]:
    """(physical cores, model name): fixed for the life of the process, and slow to read on big machines."""
    return psutil.cpu_count(logical=False), _cpu_model()


def _cpu_model() -> Optional[str]:
    found: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if sep and value and key in ("model name", "Hardware", "Model", "CPU part", "cpu model"):
                    found.setdefault(key, value)
                    if key == "model name":
                        break
    except OSError as exc:
        logger.debug("cannot read /proc/cpuinfo: %s", exc)
    for key in ("model name", "Hardware", "Model", "cpu model"):
        if key in found:
            return found[key]
    if "CPU part" in found:
        return f"CPU part {found['CPU part']}"
    return platform.processor() or None


def _probe_memory(proc_cgroup: str, total: int, available: int) -> MemoryInfo:
    limit = _cgroup.memory_limit(proc_cgroup, total_bytes=total)
    headroom = _cgroup.memory_headroom(proc_cgroup, total_bytes=total)
    budget = available if headroom is None else min(available, headroom)
    return MemoryInfo(total_bytes=total, available_bytes=available, limit_bytes=limit, budget_bytes=budget,
                      headroom_bytes=headroom)


def _probe_shm() -> ShmInfo:
    try:
        st = os.statvfs(SHM_PATH)
    except OSError as exc:
        logger.debug("cannot stat %s: %s", SHM_PATH, exc)
        return ShmInfo(SHM_PATH, None, None)
    return ShmInfo(SHM_PATH, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


def _probe_disk(data_dir: "str | os.PathLike[str] | None", seconds: float) -> DiskInfo:
    if data_dir is None:
        data_dir = default_cache_dir()
        try:
            Path(data_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            logger.info("cannot create the cache directory %s for the disk probe: %s", data_dir, exc)
    return measure_disk(data_dir, seconds=seconds)


def _from_dict(data: object) -> MachineProfile:
    d = json_object(data, "profile", {"cpu", "memory", "shm", "disk", "gpus", "start_method", "torch_version",
                                   "python_version", "thread_env", "created", "schema"})
    if d["schema"] != SCHEMA or isinstance(d["schema"], bool):
        raise ValueError(f"unsupported machine profile schema {d['schema']!r} (expected {SCHEMA})")
    cpu = json_object(d["cpu"], "cpu", {"usable", "logical", "physical", "model", "affinity", "quota"})
    mem = d["memory"]
    old = isinstance(mem, dict) and "headroom_bytes" not in mem  # saved before the field existed: still readable
    mem = json_object(mem, "memory", _MEMORY_KEYS - ({"headroom_bytes"} if old else set()))
    shm = json_object(d["shm"], "shm", {"path", "total_bytes", "free_bytes"})
    disk = None
    if d["disk"] is not None:
        dd = json_object(d["disk"], "disk", {"path", "seq_read_mb_s", "rand_read_iops", "cached_seq_read_mb_s",
                                          "bypass"})
        if dd["bypass"] not in (None, "o_direct", "fadvise"):
            raise ValueError(f"disk.bypass must be 'o_direct', 'fadvise' or null, got {dd['bypass']!r}")
        disk = DiskInfo(str_field(dd, "path", "disk", optional=False), num_field(dd, "seq_read_mb_s", "disk"),
                        num_field(dd, "rand_read_iops", "disk"), num_field(dd, "cached_seq_read_mb_s", "disk"), dd["bypass"])
    gpus = None
    if d["gpus"] is not None:
        if not isinstance(d["gpus"], list):
            raise ValueError(f"gpus must be a list or null, got {type(d['gpus']).__name__}")
        gpus = tuple(
            GpuInfo(int_field(g, "index", "gpu", optional=False), str_field(g, "name", "gpu", optional=False),
                    int_field(g, "total_bytes", "gpu", optional=False))
            for g in (json_object(item, "gpu", {"index", "name", "total_bytes"}) for item in d["gpus"]))
    env = d["thread_env"]
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("thread_env must map variable names to strings")
    return MachineProfile(
        cpu=CpuInfo(int_field(cpu, "usable", "cpu"), int_field(cpu, "logical", "cpu"), int_field(cpu, "physical", "cpu"),
                    str_field(cpu, "model", "cpu"), int_field(cpu, "affinity", "cpu"), num_field(cpu, "quota", "cpu")),
        memory=MemoryInfo(**{k: int_field(mem, k, "memory") for k in _MEMORY_KEYS if k in mem}),
        shm=ShmInfo(str_field(shm, "path", "shm", optional=False), int_field(shm, "total_bytes", "shm"),
                    int_field(shm, "free_bytes", "shm")),
        disk=disk, gpus=gpus, start_method=str_field(d, "start_method", "profile"),
        torch_version=str_field(d, "torch_version", "profile", optional=False),
        python_version=str_field(d, "python_version", "profile", optional=False),
        thread_env=dict(env), created=num_field(d, "created", "profile", optional=False))


_MEMORY_KEYS = frozenset({"total_bytes", "available_bytes", "limit_bytes", "budget_bytes", "headroom_bytes"})
