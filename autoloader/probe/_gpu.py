"""The GPUs this process can use (name, memory), found without initialising CUDA in this process."""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

logger = logging.getLogger("autoloader.probe")

CHILD_TIMEOUT_S = 60.0
NVIDIA_SMI_TIMEOUT_S = 20.0
MIB = 1 << 20


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device as this process numbers it (after ``CUDA_VISIBLE_DEVICES``)."""

    index: int
    name: str
    total_bytes: int


# NOTE [ Probing GPUs without initialising CUDA ]
# A process that has initialised CUDA cannot fork children that use CUDA: they fail with "Cannot re-initialize
# CUDA in forked subprocess", and DataLoader workers are forked by default on Linux. The probe runs before the
# user's loader is built, so it must not be the thing that initialises CUDA. Worse, torch.cuda.is_available()
# itself calls cudaGetDeviceCount, which runs cuInit and, per the PyTorch docs ("Poison fork in
# multiprocessing"), poisons fork unless PYTORCH_NVML_BASED_CUDA_CHECK=1. So:
#   1. torch.cuda.is_initialized(): the damage is done (by the user); read the properties in-process.
#   2. torch built without CUDA (torch.backends.cuda.is_built() False): no usable GPU, ().
#   3. Otherwise ask a short-lived child Python (same interpreter, same environment, so the same
#      CUDA_VISIBLE_DEVICES) to print torch.cuda.get_device_properties for each device as JSON; [] = no device.
#   4. If the child fails (timeout, crash, garbage), nvidia-smi (indices mapped through CUDA_VISIBLE_DEVICES
#      where it names plain indices or GPU UUIDs); failing that, None: unknown, never a guess.

_CHILD_CODE = """
import json, torch
out = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "total_bytes": int(p.total_memory)})
print(json.dumps(out))
"""


def probe_gpus() -> Optional[Tuple[GpuInfo, ...]]:
    """The CUDA devices this process can use; () when none, None when that cannot be found out.

    See NOTE [ Probing GPUs without initialising CUDA ].
    """
    if torch.cuda.is_initialized():
        return _in_process()
    if not torch.backends.cuda.is_built():
        return ()
    gpus = _from_child()
    if gpus is None:
        gpus = _from_nvidia_smi()
    if gpus is None:
        logger.info("GPU probe: neither a child torch process nor nvidia-smi could list the GPUs")
    return gpus


def remembered_gpus() -> Optional[Tuple[GpuInfo, ...]]:
    """``probe_gpus()`` for the cache key of every ``make_loader`` call: in-process when CUDA is already initialised,
    else asked once per process (nvidia-smi first, tens of milliseconds; then a child torch process) and remembered,
    since a process's GPUs do not change while it runs."""
    if torch.cuda.is_initialized():
        return _in_process()
    if not torch.backends.cuda.is_built():
        return ()
    return _asked_once(os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.lru_cache(maxsize=None)
def _asked_once(visible: Optional[str]) -> Optional[Tuple[GpuInfo, ...]]:
    gpus = _from_nvidia_smi()
    return gpus if gpus is not None else _from_child()


def _in_process() -> Tuple[GpuInfo, ...]:
    return tuple(GpuInfo(i, p.name, int(p.total_memory))
                 for i, p in ((i, torch.cuda.get_device_properties(i)) for i in range(torch.cuda.device_count())))


def _from_child() -> Optional[Tuple[GpuInfo, ...]]:
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD_CODE], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("GPU probe child failed: %s", exc)
        return None
    if proc.returncode != 0:
        logger.info("GPU probe child exited with %s: %s", proc.returncode, proc.stderr.strip()[-500:])
        return None
    return parse_child_output(proc.stdout)


def parse_child_output(text: str) -> Optional[Tuple[GpuInfo, ...]]:
    """GPUs from the child's last stdout line (a JSON list of {"index","name","total_bytes"}); None if garbled."""
    lines = text.strip().splitlines()
    try:
        items = json.loads(lines[-1]) if lines else None
        if not isinstance(items, list):
            raise ValueError("not a list")
        gpus = tuple(GpuInfo(int(d["index"]), str(d["name"]), int(d["total_bytes"])) for d in items)
    except (ValueError, TypeError, KeyError) as exc:
        logger.info("GPU probe child printed something unexpected (%s): %r", exc, text[-500:])
        return None
    return gpus


def _from_nvidia_smi() -> Optional[Tuple[GpuInfo, ...]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-gpu=name,memory.total,uuid", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("nvidia-smi failed: %s", exc)
        return None
    if proc.returncode != 0:
        logger.info("nvidia-smi exited with %s: %s", proc.returncode, proc.stderr.strip()[-500:])
        return None
    return parse_nvidia_smi(proc.stdout, os.environ.get("CUDA_VISIBLE_DEVICES"))


def parse_nvidia_smi(text: str, visible: Optional[str] = None) -> Optional[Tuple[GpuInfo, ...]]:
    """GPUs from ``nvidia-smi --query-gpu=name,memory.total,uuid --format=csv,noheader,nounits`` (MiB), renumbered
    as CUDA would through ``visible`` (``CUDA_VISIBLE_DEVICES``); None when the text or the mapping is unclear."""
    rows: List[Tuple[str, int, str]] = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.rsplit(",", 2)]
        try:
            rows.append((fields[0], int(float(fields[1]) * MIB), fields[2]))
        except (ValueError, IndexError):
            logger.info("cannot parse nvidia-smi line %r", line)
            return None
    if visible is not None:
        chosen = _visible_rows(rows, visible)
        if chosen is None:
            return None
        rows = chosen
    return tuple(GpuInfo(i, name, total) for i, (name, total, _) in enumerate(rows))


def _visible_rows(rows: List[Tuple[str, int, str]], visible: str) -> Optional[List[Tuple[str, int, str]]]:
    """The rows CUDA_VISIBLE_DEVICES selects, in its order (CUDA stops at the first invalid entry); None when an
    entry (a MIG device, say) cannot be mapped to a row."""
    chosen = []
    for token in (t.strip() for t in visible.split(",")):
        if not token:
            break
        if token.lstrip("-").isdigit():
            index = int(token)
            if not 0 <= index < len(rows):
                break
            chosen.append(rows[index])
        elif token.startswith("GPU-"):
            matches = [r for r in rows if r[2].startswith(token)]
            if len(matches) != 1:
                break
            chosen.append(matches[0])
        else:
            logger.info("cannot map CUDA_VISIBLE_DEVICES entry %r to an nvidia-smi GPU", token)
            return None
    return chosen
