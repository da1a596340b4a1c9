"""Which device batches go to, resolved once to an indexed device, and the one side CUDA stream of each device.

# NOTE [ One side stream per device ]
# A CUDA stream's caching-allocator pool is its own: blocks freed by work on one stream are reused only by later
# allocations on that stream. A stream made per epoch, per trial or per loader strands its blocks when it is dropped,
# and reserved memory grows with every new one (timm issue 2781, one level up: per trial). So the process has one side
# stream per device, made on first use and shared by every trial, the loader make_loader returns, and any
# PrefetchLoader the user builds. Sharing is safe: each consumer waits on the side stream before using a batch, so a
# batch copied for another loader can only add a wait, never a race (NOTE [ Stream synchronisation ] in stream_copy.py).
"""
from __future__ import annotations

import os
import threading
from typing import Dict, Optional, Union

import torch
import torch.distributed as dist

_STREAMS: Dict[int, "torch.cuda.Stream"] = {}
_STREAMS_LOCK = threading.Lock()


def resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    """``device`` checked and, for CUDA, given its index: the default is CUDA when available, else the CPU.

    ``"cuda"`` and the default become ``cuda:{current device}``, so the side stream and the consumer's stream are on
    the same GPU for the loader's whole life. Under a process group whose rank has a ``LOCAL_RANK`` of its own GPU,
    the current device must be that GPU (``torch.cuda.set_device(local_rank)``, as every NCCL program does): a
    ``ValueError`` says so otherwise, rather than copying every rank's batches to cuda:0.
    """
    if device is None:
        resolved = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif isinstance(device, str):
        try:
            resolved = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"device={device!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'") from exc
    elif isinstance(device, torch.device):
        resolved = device
    else:
        raise TypeError(f"device must be a str or torch.device, got {device!r}; use e.g. device='cuda:0'")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported; PrefetchLoader handles 'cpu' and 'cuda' devices")
    if resolved.type != "cuda":
        return resolved
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but torch.cuda.is_available() is False; pass device='cpu'")
    count = torch.cuda.device_count()
    if resolved.index is not None:
        if resolved.index >= count:
            raise ValueError(f"device={device!r} but only {count} CUDA device(s) are visible")
        return resolved
    return torch.device("cuda", _current_index(count))


def _current_index(count: int) -> int:
    current = torch.cuda.current_device()
    local = os.environ.get("LOCAL_RANK", "")
    if count > 1 and local.isdigit() and int(local) < count and dist.is_available() and dist.is_initialized():
        want = int(local)
        if current != want:
            raise ValueError(
                f"this rank's LOCAL_RANK is {want} but the current CUDA device is cuda:{current}, so every rank "
                f"would copy its batches to cuda:{current}: call torch.cuda.set_device({want}) before make_loader "
                f"(as NCCL needs anyway), or pass device='cuda:{want}'")
    return current


def side_stream(device: torch.device) -> Optional["torch.cuda.Stream"]:
    """The side stream of ``device`` (an indexed CUDA device), made once per process; None on the CPU.

    See NOTE [ One side stream per device ]."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _STREAMS_LOCK:
        stream = _STREAMS.get(index)
        if stream is None:
            stream = _STREAMS[index] = torch.cuda.Stream(device=torch.device("cuda", index))
    return stream


def release_cached(device: torch.device) -> None:
    """Give back what the caching allocator holds unused on ``device`` (after tuning: the trials' batches)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
