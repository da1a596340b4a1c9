"""``autotune doctor``: the machine settings that make DataLoader workers slow, crash or leak, each checked and
explained with its fix.

Every check is a pure function of facts passed in (so tests feed it fakes); ``run_checks`` gathers the facts of this
machine and runs them all.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Iterable, List, Literal, Mapping, Optional, Sequence, Tuple

import torch.multiprocessing

from ..cache import CacheEntry, resolve_cache
from ..policy import shm_need_bytes
from ..probe import (THREAD_ENV_VARS, CpuInfo, GpuInfo, MachineProfile, ShmInfo, load_profile, open_files_limit,
                     probe_machine)
from ..report import mib

__all__ = ["Finding", "DeviceHolder", "ShmNeed", "run_checks", "check_shm", "check_open_files", "check_cpus",
           "check_start_method", "check_thread_env", "check_gpu_holders", "check_gpus", "check_saved_profile",
           "check_cache", "shm_needs", "find_nvidia_holders", "format_findings"]

Status = Literal["ok", "warn", "fail", "info"]
MIB = 1 << 20
SMALL_SHM_BYTES = 256 * MIB
LOW_NOFILE = 4096
GOOD_NOFILE = 65536


@dataclass(frozen=True)
class Finding:
    """One check's verdict: ``detail`` says what was found, ``fix`` what to do about it (empty when nothing)."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class ShmNeed:
    """The /dev/shm a cached configuration needs: its batches in flight (see ``policy.shm_guard``)."""

    label: str
    need_bytes: int


@dataclass(frozen=True)
class DeviceHolder:
    """A process with an open ``/dev/nvidia*`` file."""

    pid: int
    name: str
    ppid: Optional[int]
    devices: Tuple[str, ...]


# -- /dev/shm -------------------------------------------------------------------------------------------------------
def shm_needs(entries: Iterable[CacheEntry]) -> List[ShmNeed]:
    """What each valid cached configuration with workers needs in /dev/shm: (workers x prefetch + 2) batches, the
    count ``policy.shm_guard`` uses; the batch size is the one its trials measured."""
    needs = []
    for entry in entries:
        result = entry.result
        if result is None or result.num_workers == 0:
            continue
        batch = next((t.batch_bytes for t in result.trials if t.batch_bytes), None)
        if batch is None:
            continue
        need = shm_need_bytes(result.num_workers, result.prefetch_factor, batch)
        label = f"{entry.meta.get('dataset', entry.key[:12])} {result.config.label()}, {mib(batch)} batches"
        needs.append(ShmNeed(label, need))
    return needs


def check_shm(shm: ShmInfo, needs: Sequence[ShmNeed]) -> Finding:
    name = "shared memory"
    fix = ("give the container more: `docker run --shm-size=8g` (Kubernetes: an emptyDir with medium: Memory "
           "mounted at /dev/shm), or use fewer workers / a smaller prefetch_factor")
    if shm.free_bytes is None:
        return Finding(name, "info", f"{shm.path} size unknown (not mounted or not readable)")
    have = f"{shm.path}: {mib(shm.free_bytes)} free of {mib(shm.total_bytes or 0)}"
    if not needs:
        if (shm.total_bytes or 0) < SMALL_SHM_BYTES:
            return Finding(name, "warn", f"{have}; Docker's default is 64 MiB, and workers pass every batch "
                                         f"through it (a full /dev/shm kills workers with a bus error)", fix)
        return Finding(name, "ok", f"{have}; no cached configuration to check it against")
    worst = max(needs, key=lambda n: n.need_bytes)
    detail = f"{have}; the largest cached need is {mib(worst.need_bytes)} ({worst.label})"
    if worst.need_bytes > shm.free_bytes:
        return Finding(name, "fail", detail + ": workers will die with a bus error", fix)
    if worst.need_bytes > shm.free_bytes / 2:
        return Finding(name, "warn", detail + ": more than half of what is free", fix)
    return Finding(name, "ok", detail)


# -- open files -----------------------------------------------------------------------------------------------------
def check_open_files(soft: Optional[int], hard: Optional[int], *, sharing_strategy: Optional[str],
                     max_cached_workers: Optional[int] = None) -> Finding:
    """``ulimit -n`` as ``probe.open_files_limit()`` reads it (None: unlimited)."""
    name = "open files"
    show = (lambda n: "unlimited" if n is None else str(n))
    detail = f"ulimit -n is {show(soft)} (hard limit {show(hard)}); sharing strategy {sharing_strategy or 'unknown'}"
    if sharing_strategy == "file_system":
        return Finding(name, "ok", detail + ": tensors are shared by file name, not descriptors")
    if soft is None or soft >= GOOD_NOFILE:
        return Finding(name, "ok", detail)
    if soft < LOW_NOFILE:
        workers = (f" (a cached configuration uses {max_cached_workers} workers)"
                   if max_cached_workers and max_cached_workers > 1 else "")
        if hard is None or hard > soft:
            raise_it = f"`ulimit -n {GOOD_NOFILE if hard is None else min(hard, GOOD_NOFILE)}`"
        else:
            raise_it = (f"raise the hard limit ({show(hard)}) as root, in /etc/security/limits.conf or with "
                        f"`docker run --ulimit nofile={GOOD_NOFILE}:{GOOD_NOFILE}`, then `ulimit -n {GOOD_NOFILE}`")
        return Finding(name, "warn",
                       detail + ": every tensor a worker hands over holds a descriptor until it is freed; with many "
                       f"workers and prefetched batches this runs out{workers} ('Too many open files', "
                       "'received 0 items of ancdata')",
                       f"{raise_it} before training, or call "
                       "torch.multiprocessing.set_sharing_strategy('file_system') at the start of the script")
    return Finding(name, "ok", detail)


# -- CPUs -----------------------------------------------------------------------------------------------------------
def check_cpus(cpu: CpuInfo) -> Finding:
    name = "usable CPUs"
    if cpu.usable is None or cpu.logical is None:
        return Finding(name, "info", f"could not tell (os.cpu_count() {cpu.logical}, usable {cpu.usable})")
    limits = []
    if cpu.quota is not None:
        limits.append(f"cgroup CPU quota {cpu.quota:g}")
    if cpu.affinity is not None and cpu.affinity < cpu.logical:
        limits.append(f"CPU affinity {cpu.affinity}")
    if cpu.usable < cpu.logical:
        return Finding(name, "warn",
                       f"os.cpu_count() says {cpu.logical} but this process may use {cpu.usable} "
                       f"({', '.join(limits) or 'limited'}): num_workers sized from os.cpu_count() oversubscribes",
                       "size worker pools from the usable count (autoloader does): len(os.sched_getaffinity(0)) "
                       "covers affinity but not a cgroup quota; `autotune probe` shows both")
    return Finding(name, "ok", f"{cpu.usable} CPUs, all usable" + (f" ({limits[0]})" if limits else ""))


# -- start method ---------------------------------------------------------------------------------------------------
def check_start_method(method: Optional[str]) -> Finding:
    name = "start method"
    if method is None:
        return Finding(name, "info", "could not tell how worker processes start")
    if method == "fork":
        return Finding(name, "ok", "fork: workers inherit the dataset without pickling and start fast "
                                   "(do not initialise CUDA before the workers start)")
    return Finding(name, "info",
                   f"{method}: each worker starts a fresh interpreter, re-imports the main module and unpickles "
                   f"the dataset, collate_fn and worker_init_fn; start-up is slower",
                   "guard the training script with `if __name__ == \"__main__\":`, define datasets and functions "
                   "at module level (no lambdas or local classes), keep workers alive with persistent_workers=True")


# -- thread variables -----------------------------------------------------------------------------------------------
def check_thread_env(env: Mapping[str, str], *, usable_cpus: Optional[int]) -> Finding:
    name = "thread variables"
    fix = ("set OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 for the workers, e.g. in worker_init_fn "
           "with threadpoolctl.threadpool_limits(1) and cv2.setNumThreads(0), which leaves the main process alone")
    set_vars = {k: v for k, v in env.items() if k in THREAD_ENV_VARS}
    if set_vars:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(set_vars.items()))
        big = [k for k, v in set_vars.items() if v.strip().isdigit() and usable_cpus and int(v) > usable_cpus]
        if big:
            return Finding(name, "warn", f"{shown}: more threads than the {usable_cpus} usable CPUs", fix)
        return Finding(name, "ok", shown)
    cores = usable_cpus or 1
    detail = (f"none of {', '.join(THREAD_ENV_VARS)} is set: torch uses one thread in DataLoader workers, but numpy "
              f"(OpenBLAS/MKL), OpenCV or numexpr in a dataset may start one thread per core in every worker "
              f"({cores} per worker here): oversubscription")
    return Finding(name, "warn" if cores >= 4 else "info", detail, fix)


# -- processes holding NVIDIA device files --------------------------------------------------------------------------
def find_nvidia_holders(*, proc_root: str = "/proc", exclude: Iterable[int] = ()) -> Tuple[List[DeviceHolder], int]:
    """Processes with an open ``/dev/nvidia*`` file (what ``fuser -v /dev/nvidia*`` shows) and how many could not
    be inspected (other users' processes).

    ``psutil``'s ``open_files()`` skips device files, so the ``fd`` links under ``/proc/<pid>`` are read directly.
    """
    import psutil

    skip = set(exclude)
    holders: List[DeviceHolder] = []
    denied = 0
    for proc in psutil.process_iter(["pid", "name", "ppid"]):
        pid = proc.info["pid"]
        if pid in skip:
            continue
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except PermissionError:
            denied += 1
            continue
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
        devices = set()
        for fd in names:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                devices.add(target)
        if devices:
            holders.append(DeviceHolder(pid, proc.info["name"] or "?", proc.info["ppid"], tuple(sorted(devices))))
    return holders, denied


def check_gpu_holders(holders: Sequence[DeviceHolder], *, device_files: Sequence[str], denied: int = 0) -> Finding:
    name = "GPU device holders"
    if not device_files:
        return Finding(name, "info", "no NVIDIA device files (/dev/nvidia*) on this machine")
    unseen = f"; {denied} processes of other users could not be inspected" if denied else ""
    if not holders:
        return Finding(name, "ok", f"no other process holds {', '.join(device_files[:3])}"
                                   f"{', ...' if len(device_files) > 3 else ''}{unseen}")
    shown = "; ".join(f"pid {h.pid} {h.name}" + (" (orphaned: parent is pid 1)" if h.ppid == 1 else "")
                      for h in holders[:8])
    pids = " ".join(str(h.pid) for h in holders)
    orphans = [h for h in holders if h.ppid == 1]
    detail = (f"{len(holders)} process(es) hold NVIDIA device files: {shown}{unseen}. A leftover DataLoader worker "
              f"or crashed run keeps its GPU memory until it exits")
    return Finding(name, "warn" if orphans else "info", detail,
                   f"check them with `fuser -v /dev/nvidia*` or `nvidia-smi`, then `kill {pids}` for any leftover")


def check_gpus(gpus: Optional[Sequence[GpuInfo]]) -> Finding:
    name = "GPUs"
    if gpus is None:
        return Finding(name, "info", "could not tell which GPUs are usable (the probe failed)")
    if not gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return Finding(name, "info", "no CUDA GPU visible: loaders deliver to the CPU and pin_memory stays off"
                       + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""))
    return Finding(name, "ok", "; ".join(f"cuda:{g.index} {g.name}, {g.total_bytes / (1 << 30):.0f} GiB"
                                         for g in gpus))


# -- saved profile and cache ----------------------------------------------------------------------------------------
def check_saved_profile(saved: Optional[MachineProfile], current: MachineProfile) -> Finding:
    name = "machine profile"
    if saved is None:
        return Finding(name, "info", "no machine profile saved yet", "run `autotune` (or `autotune probe`) once")
    changed = [f"{label} {old} -> {new}" for label, old, new in (
        ("torch", saved.torch_version, current.torch_version),
        ("python", saved.python_version, current.python_version),
        ("usable CPUs", saved.cpu.usable, current.cpu.usable),
        ("CPU", saved.cpu.model, current.cpu.model)) if old != new]
    if changed:
        return Finding(name, "warn", "the saved profile describes another machine or setup (" + "; ".join(changed)
                       + "); tunings cached before the change are not reused (the key includes these facts)",
                       "run `autotune probe` to refresh it, and `autotune clear` to drop the old tunings")
    return Finding(name, "ok", "the saved profile matches this machine")


def check_cache(entries: Sequence[CacheEntry]) -> Finding:
    name = "cache"
    bad = [e for e in entries if e.result is None]
    if bad:
        return Finding(name, "warn", f"{len(bad)} of {len(entries)} cache entries cannot be used "
                                     f"({bad[0].key[:12]}...: {bad[0].error})",
                       f"`autotune clear {bad[0].key}` for one, `autotune clear` for every tuning")
    return Finding(name, "ok" if entries else "info", f"{len(entries)} cached tuning(s); `autotune show` lists them")


def run_checks(*, profile: Optional[MachineProfile] = None,
               entries: Optional[Sequence[CacheEntry]] = None) -> List[Finding]:
    """Gather this machine's facts (no disk probe; GPUs listed without initialising CUDA) and run every check."""
    if profile is None:
        profile = probe_machine(disk=False, gpus=True)
    if entries is None:
        cache = resolve_cache(True)
        entries = cache.entries() if cache is not None else []
    soft, hard = open_files_limit()
    workers = [e.result.num_workers for e in entries if e.result is not None]
    device_files = sorted(glob.glob("/dev/nvidia*"))
    holders, denied = find_nvidia_holders(exclude={os.getpid()}) if device_files else ([], 0)
    return [
        check_cpus(profile.cpu),
        check_shm(profile.shm, shm_needs(entries)),
        check_open_files(soft, hard, sharing_strategy=torch.multiprocessing.get_sharing_strategy(),
                         max_cached_workers=max(workers) if workers else None),
        check_start_method(profile.start_method),
        check_thread_env(profile.thread_env, usable_cpus=profile.cpu.usable),
        check_gpus(profile.gpus),
        check_gpu_holders(holders, device_files=device_files, denied=denied),
        check_saved_profile(load_profile(), profile),
        check_cache(entries),
    ]


def format_findings(findings: Sequence[Finding]) -> str:
    """Doctor findings: one block per check with its status, what was found and the fix."""
    counts = {s: sum(1 for f in findings if f.status == s) for s in ("fail", "warn")}
    lines = [f"autotune doctor: {counts['fail']} problem(s), {counts['warn']} warning(s)"]
    for finding in findings:
        lines.append(f"  {('[' + finding.status + ']').ljust(6)} {finding.name}: {finding.detail}")
        if finding.fix:
            lines.append(f"  {' ' * 6} fix: {finding.fix}")
    return "\n".join(lines)
