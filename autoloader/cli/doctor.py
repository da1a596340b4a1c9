"""``autotune doctor``: the machine settings that make DataLoader workers slow, crash or leak, each checked and
explained with its fix.

Every check is a pure function of facts passed in (so tests feed it fakes); ``run_checks`` gathers the facts of this
machine and runs them all.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence

import torch.multiprocessing

from ..cache import CacheEntry, resolve_cache
from ..search.memory import resolve_budget, shm_need_bytes
from ..probe import (THREAD_ENV_VARS, CpuInfo, MachineProfile, MemoryInfo, ShmInfo, load_profile,
                     open_files_limit, probe_machine)
from ..probe._pools import NativePool, pools_here
from .._text import mib
from ._holders import find_nvidia_holders
from .doctor_gpu import check_gpu_holders, check_gpus
from .findings import Finding

__all__ = ["ShmNeed", "run_checks", "check_shm", "check_open_files", "check_cpus", "check_start_method",
           "check_thread_env", "check_native_pools", "check_memory_budget", "check_saved_profile", "check_cache",
           "shm_needs"]

MIB = 1 << 20
SMALL_SHM_BYTES = 256 * MIB
LOW_NOFILE = 4096
GOOD_NOFILE = 65536



@dataclass(frozen=True)
class ShmNeed:
    """The /dev/shm a cached configuration needs: its batches in flight (see ``memory.budget_guard``)."""

    label: str
    need_bytes: int


# -- /dev/shm -------------------------------------------------------------------------------------------------------
def shm_needs(entries: Iterable[CacheEntry]) -> List[ShmNeed]:
    """What each valid cached configuration with workers needs in /dev/shm: (workers x prefetch + 2) batches, the
    count ``memory.budget_guard`` uses; the batch size is the one its trials measured."""
    needs = []
    for entry in entries:
        result = entry.result
        if result is None or result.num_workers == 0:
            continue
        batch = next((t.batch_bytes for t in result.trials if t.batch_bytes), None)
        if batch is None:
            continue
        need = shm_need_bytes(result.config, batch)
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


# -- memory budget --------------------------------------------------------------------------------------------------
_SOURCE_WORDS = {"cgroup": "cgroup (its limit minus what the cgroup uses is tighter than the machine's available "
                           "memory)",
                 "available": "available (the machine's available memory; no tighter cgroup limit)",
                 "user": "user (memory_budget= bytes)"}


def check_memory_budget(memory: MemoryInfo, *, memory_budget: "int | float | None" = None) -> Finding:
    """The memory budget a loader of this process gets (``search/memory.py``, ``resolve_budget``): bytes, the
    fraction, and where it came from (cgroup, available memory or the user)."""
    name = "memory budget"
    budget = resolve_budget(memory_budget, memory)
    if budget.bytes is None:
        return Finding(name, "info", "unknown: the available memory could not be read, so no candidate is checked "
                                     "against a budget", "pass make_loader(memory_budget=...) in bytes")
    share = "as given" if budget.fraction is None else \
        f"{budget.fraction:g} of the {mib(budget.basis_bytes or 0)} this process may still allocate"
    return Finding(name, "ok", f"{mib(budget.bytes)} ({budget.bytes:,} bytes, {share}); source: "
                               f"{_SOURCE_WORDS.get(budget.source, budget.source)}. Every candidate's workers, batches "
                               f"in flight, pinned copies and thread buffers must fit in it; make_loader(memory_budget="
                               f"...) sets it (bytes, or a fraction in (0, 1])")


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
        return Finding(name, "ok", "fork: workers inherit the dataset without pickling and start fast; CUDA may be "
                                   "initialised before they start, as long as the workers themselves never touch "
                                   "it (return CPU tensors and let the loader move batches to the GPU)")
    return Finding(name, "info",
                   f"{method}: each worker starts a fresh interpreter, re-imports the main module and unpickles "
                   f"the dataset, collate_fn and worker_init_fn; start-up is slower",
                   "guard the training script with `if __name__ == \"__main__\":`, define datasets and functions "
                   "at module level (no lambdas or local classes), keep workers alive with persistent_workers=True")


# -- thread variables -----------------------------------------------------------------------------------------------
def check_thread_env(env: Mapping[str, str], *, usable_cpus: Optional[int]) -> Finding:
    name = "thread variables"
    fix = ("autoloader's loaders limit these pools in each worker (see native thread pools); for another DataLoader "
           "call threadpoolctl.threadpool_limits(1) and cv2.setNumThreads(0) in its worker_init_fn, which leaves the "
           "main process alone")
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


def check_native_pools(pools: Optional[Sequence[NativePool]], *, usable_cpus: Optional[int],
                       cached: Sequence[CacheEntry] = ()) -> Finding:
    """The native thread pools of this process (what a forked worker starts with; ``probe._pools.pools_here``: None
    without threadpoolctl), and per cached configuration with workers the pools a worker found and the limit chosen."""
    name = "native thread pools"
    if pools is None:
        return Finding(name, "warn" if (usable_cpus or 1) >= 2 else "info",
                       "threadpoolctl is not installed (a dependency of autoloader the install left out): in "
                       "DataLoader workers autoloader can neither see nor limit the BLAS and OpenMP pools (numpy's "
                       "OpenBLAS or MKL), only OpenCV, numexpr and libraries a worker loads later",
                       "pip install threadpoolctl")
    shown = ", ".join(p.label() for p in pools) or "none loaded"
    detail = (f"in this process {shown}; autoloader limits each worker's to max(1, ({usable_cpus or '?'} usable CPUs - "
              f"1) // workers) threads unless measured slower than without (make_loader(native_threads=N or False) "
              f"to choose)")
    for entry in cached[:3]:
        result = entry.result
        if result is not None and result.num_workers > 0:
            found = result.native_pools
            detail += (f"; cached {entry.meta.get('dataset', entry.key[:12])} {result.config.label()}: "
                       f"{'pools unknown' if found is None else ', '.join(p.label() for p in found) or 'no pool'}")
    return Finding(name, "ok", detail)



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
        check_memory_budget(profile.memory),
        check_open_files(soft, hard, sharing_strategy=torch.multiprocessing.get_sharing_strategy(),
                         max_cached_workers=max(workers) if workers else None),
        check_start_method(profile.start_method),
        check_thread_env(profile.thread_env, usable_cpus=profile.cpu.usable),
        check_native_pools(pools_here(), usable_cpus=profile.cpu.usable, cached=entries),
        check_gpus(profile.gpus),
        check_gpu_holders(holders, device_files=device_files, denied=denied, uid=os.getuid()),
        check_saved_profile(load_profile(), profile),
        check_cache(entries),
    ]
