"""The doctor's GPU checks: which CUDA GPUs are usable, and which processes hold the NVIDIA device files (a leftover
DataLoader worker or crashed run keeps its GPU memory until it exits)."""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

from ..probe import GpuInfo
from ._holders import (DAEMON, INIT, ORPHAN, ORPHAN_NOT_PYTHON, OTHER_USER, RUNNING, DeviceHolder, classify_holder,
                       executable_name, is_worker)
from .findings import Finding


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _display(holder: DeviceHolder) -> str:
    """The name, or the executable's when the kernel cut the name to 15 characters (``nvidia-persiste``)."""
    exe = executable_name(holder)
    return exe if len(holder.name) == 15 and exe.startswith(holder.name) else holder.name


def _shown(holders: Sequence[DeviceHolder]) -> str:
    return ", ".join(f"{_display(h)} (pid {h.pid})" for h in holders[:8]) + (", ..." if len(holders) > 8 else "")


def _label(holder: DeviceHolder, kind: str) -> str:
    if kind == RUNNING:
        return f"pid {holder.pid} {_display(holder)}"
    parent = "parent is pid 1" if holder.ppid == 1 else f"adopted by {holder.parent_name} (pid {holder.ppid})"
    worker = "DataLoader worker, " if is_worker(holder) else ""
    return (f"pid {holder.pid} {_display(holder)} ({worker}orphaned: {parent}"
            f"{'' if kind == ORPHAN else ', not Python: left alone'})")


def check_gpu_holders(holders: Sequence[DeviceHolder], *, device_files: Sequence[str], denied: int = 0,
                      uid: Optional[int] = None) -> Finding:
    """The processes holding the GPUs, sorted by ``classify_holder`` (``uid``: ours; None: unknown, nobody is
    skipped as another user's). Warns, and offers ``kill``, only for our orphaned Python processes; says which system
    daemons and init processes it skipped and how many processes of other users."""
    name = "GPU device holders"
    if not device_files:
        return Finding(name, "info", "no NVIDIA device files (/dev/nvidia*) on this machine")
    kinds: Dict[str, List[DeviceHolder]] = {}
    for holder in holders:
        kinds.setdefault(classify_holder(holder, uid=uid), []).append(holder)
    skipped = [f"{_count(len(kinds[kind]), one, many)}: {_shown(kinds[kind])}"
               for kind, one, many in ((DAEMON, "system daemon", "system daemons"),
                                       (INIT, "container init process", "container init processes"))
               if kind in kinds]
    if OTHER_USER in kinds:
        skipped.append(_count(len(kinds[OTHER_USER]), "process of another user", "processes of other users")
                       + f": {_shown(kinds[OTHER_USER])}")
    if denied:
        skipped.append(f"{_count(denied, 'process', 'processes')} of other users could not be inspected")
    unseen = f"; skipped {'; '.join(skipped)}" if skipped else ""
    ours = [(kind, h) for kind in (ORPHAN, ORPHAN_NOT_PYTHON, RUNNING) for h in kinds.get(kind, [])]
    if not ours:
        files = f"{', '.join(device_files[:3])}{', ...' if len(device_files) > 3 else ''}"
        return Finding(name, "ok", f"no other process {'of yours ' if skipped else ''}holds {files}{unseen}")
    shown = "; ".join(_label(h, kind) for kind, h in ours[:8]) + ("; ..." if len(ours) > 8 else "")
    detail = (f"{_count(len(ours), 'process', 'processes')} of yours {'holds' if len(ours) == 1 else 'hold'} NVIDIA "
              f"device files: {shown}{unseen}. "
              f"A leftover DataLoader worker or crashed run keeps its GPU memory until it exits")
    look = "check them with `fuser -v /dev/nvidia*` or `nvidia-smi`"
    if ORPHAN in kinds:
        return Finding(name, "warn", detail,
                       f"{look}, then `kill {' '.join(str(h.pid) for h in kinds[ORPHAN])}` for any that is a leftover "
                       f"(a job started directly by the container's init also has parent pid 1)")
    return Finding(name, "info", detail, f"{look} if GPU memory is missing; none of them looks like a leftover")


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
