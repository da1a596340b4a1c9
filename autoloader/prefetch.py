"""``PrefetchLoader``: hands out batches already on the device, copied on a side CUDA stream while the consumer
works on the previous batch, optionally converted and normalised there. On the CPU it is a pass-through.

    loader = PrefetchLoader(DataLoader(ds, batch_size=64, pin_memory=True, num_workers=4),   # uint8 images
                            normalize=((123.7, 116.3, 103.5), (58.4, 57.1, 57.4)), dtype=torch.float32)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for images, labels in loader:     # on the GPU, images float32 and normalised
            train_step(images, labels)
        print(loader.stats.stall_fraction)  # share of the epoch spent waiting for data
"""
from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from ._batch import _is_namedtuple, iter_tensors, map_tensors, rebuild_mapping
from .results import TuneResult

logger = logging.getLogger("autoloader.prefetch")

_END = object()


@dataclass(frozen=True)
class EpochStats:
    """One epoch as the consumer saw it: ``wait_s`` is the time spent inside ``next()`` waiting for data.

    On CUDA this is host-side waiting only: no device synchronisation is made, so a copy still running on the GPU
    when the consumer's kernels are queued is not counted.
    """

    epoch: int
    batches: int
    wall_s: float
    wait_s: float

    @property
    def stall_fraction(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0


class _EpochClock:
    __slots__ = ("epoch", "batches", "start", "end", "wait")

    def __init__(self, epoch: int, start: float) -> None:
        self.epoch, self.batches, self.start, self.end, self.wait = epoch, 0, start, start, 0.0

    def snapshot(self) -> EpochStats:
        return EpochStats(self.epoch, self.batches, self.end - self.start, self.wait)


def resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    """``device`` checked, or CUDA when available, else the CPU (CUDA is not initialised by asking)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, str):
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
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but torch.cuda.is_available() is False; pass device='cpu'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return resolved


def _check_normalize(normalize: Any) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    if normalize is None:
        return None
    example = "e.g. normalize=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))"
    if not isinstance(normalize, (tuple, list)) or len(normalize) != 2:
        raise TypeError(f"normalize must be a (mean, std) pair, got {normalize!r}; {example}")
    parts: List[torch.Tensor] = []
    for name, value in zip(("mean", "std"), normalize):
        if isinstance(value, (str, bytes)):
            raise TypeError(f"normalize {name} must be numbers per channel, got {value!r}; {example}")
        try:
            part = torch.as_tensor(value, dtype=torch.float64).detach().cpu().reshape(-1)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"normalize {name} must be numbers per channel, got {value!r}; {example}") from exc
        if part.numel() == 0 or not bool(torch.isfinite(part).all()):
            raise ValueError(f"normalize {name} must be finite numbers, one per channel, got {value!r}; {example}")
        parts.append(part)
    mean, std = parts
    if mean.numel() != std.numel():
        raise ValueError(f"normalize mean has {mean.numel()} channels but std has {std.numel()}; give one per channel")
    if bool((std == 0).any()):
        raise ValueError(f"normalize std must be non-zero, got {normalize[1]!r}")
    return mean, std


@contextlib.contextmanager
def quiet_worker_count_warning(active: bool) -> Iterator[None]:
    """Silence DataLoader's "will create N worker processes ... suggested max" warning for a count autoloader chose.

    That warning is a rule of thumb (workers <= cores); a tuned count above it was measured to be faster, typically
    workers that wait on storage or network. Counts the user chose still get the warning.
    """
    if not active:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield


class PrefetchLoader:
    """Wraps ``loader`` (a DataLoader or any iterable of batches) and yields its batches on ``device``.

    ``dtype`` then ``normalize=(mean, std)`` (per channel, in the input's units: 0-255 for uint8 images) apply to
    the input tensor only: the batch itself when it is a tensor, its first element when it is a tuple/list,
    ``batch[input_key]`` when it is a mapping. ``stats``/``history``
    report the time the consumer waited for data (see ``EpochStats``).
    """

    def __init__(self, loader: Iterable, *, device: Union[str, torch.device, None] = None,
                 normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
                 dtype: Optional[torch.dtype] = None, input_key: Optional[Hashable] = None,
                 tuning: Optional[TuneResult] = None, cache_key: Optional[str] = None) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be an iterable of batches (e.g. a DataLoader), got {type(loader).__name__}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}; use e.g. dtype=torch.float32")
        self._normalize = _check_normalize(normalize)
        if self._normalize is not None and dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} cannot hold normalised values; use a floating dtype such as torch.float32")
        self.loader = loader
        self.device = resolve_device(device)
        self.tuning = tuning
        """What ``make_loader`` chose and why (``print`` it for the trial table); None for a loader you wrapped."""
        self.cache_key = cache_key
        """The cache entry holding ``tuning`` (``autotune show`` lists it); None when it is not cached."""
        self._dtype = dtype
        self._input_key = input_key
        self._transforms = self._normalize is not None or dtype is not None
        self._stream: Optional[torch.cuda.Stream] = None
        self._norm_cache: dict = {}
        self._next_epoch = 0
        self._clocks: List[_EpochClock] = []

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    @property
    def batch_size(self) -> Optional[int]:
        return getattr(self.loader, "batch_size", None)

    @property
    def stream(self) -> Optional[torch.cuda.Stream]:
        """The side CUDA stream (created on the first CUDA iteration, then reused); None on the CPU."""
        return self._stream

    @property
    def stats(self) -> Optional[EpochStats]:
        """The latest epoch's statistics (updated at every batch), None before the first epoch."""
        return self._clocks[-1].snapshot() if self._clocks else None

    @property
    def history(self) -> Tuple[EpochStats, ...]:
        """Every epoch's statistics, oldest first."""
        return tuple(clock.snapshot() for clock in self._clocks)

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch and forward ``epoch`` to every sampler of the loader that has ``set_epoch``."""
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise TypeError(f"epoch must be an int, got {epoch!r}")
        self._next_epoch = epoch
        batch_sampler = getattr(self.loader, "batch_sampler", None)
        candidates = (getattr(self.loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None))
        for i, sampler in enumerate(candidates):
            if callable(getattr(sampler, "set_epoch", None)) and all(sampler is not c for c in candidates[:i]):
                sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return self._epoch()

    # NOTE [ Stream synchronisation ]
    # Batch i+1 is copied (and converted) on one side stream while the consumer's stream runs its step on batch i.
    # Three rules keep that correct, with no host-device synchronisation:
    # 1. Before the side stream writes batch i+1, it waits on the consumer's current stream
    #    (``side.wait_stream(consumer)``): work the consumer queued (e.g. on tensors that feed the batch) is done.
    # 2. Before batch i is handed out, the consumer stream waits on the side stream. This happens before batch i+1's
    #    copy is queued, so the consumer waits for batch i's copy only and the copy of i+1 overlaps its step.
    # 3. Each handed-out tensor was allocated on the side stream; ``record_stream(consumer)`` tells the caching
    #    allocator not to reuse its memory until the consumer's queued work on it has finished.
    # The stream is created once per PrefetchLoader and reused: a stream per epoch strands each epoch's cached
    # blocks in a pool no later stream can use, so reserved memory grows (timm issue 2781).
    # On the CPU the same loop runs with ``contextlib.nullcontext()`` in place of the stream context and no copy.

    def _tuned_workers(self) -> bool:
        """True when the loader's worker count is one autoloader measured (see quiet_worker_count_warning)."""
        workers = getattr(self.loader, "num_workers", None)
        return bool(self.tuning is not None and workers and workers == getattr(self.tuning, "num_workers", None))

    def _side_stream(self) -> Optional[torch.cuda.Stream]:
        if self.device.type != "cuda":
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
            logger.debug("created side stream %r on %s", self._stream, self.device)
        return self._stream

    def _epoch(self) -> Iterator[Any]:
        stream = self._side_stream()
        clock = _EpochClock(self._next_epoch, time.perf_counter())
        self._next_epoch += 1
        self._clocks.append(clock)
        entered = clock.start
        with quiet_worker_count_warning(self._tuned_workers()):
            it = iter(self.loader)
        batch = self._fetch(it, stream)
        while batch is not _END:
            if stream is not None:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_stream(stream)
                for tensor in iter_tensors(batch):
                    if tensor.is_cuda:
                        tensor.record_stream(consumer)
            following = self._fetch(it, stream)
            now = time.perf_counter()
            clock.batches += 1
            clock.wait += now - entered
            clock.end = now
            yield batch
            entered = time.perf_counter()
            batch = following
        clock.end = time.perf_counter()
        clock.wait += clock.end - entered
        logger.debug("epoch %d: %d batches in %.3f s, stall %.1f%%", clock.epoch, clock.batches,
                     clock.end - clock.start, 100.0 * clock.snapshot().stall_fraction)

    def _fetch(self, it: Iterator[Any], stream: Optional[torch.cuda.Stream]) -> Any:
        """The next batch, copied (see NOTE [ Stream synchronisation ]) and transformed; ``_END`` when exhausted."""
        try:
            batch = next(it)
        except StopIteration:
            return _END
        if stream is None and not self._transforms:
            return batch
        consumer = torch.cuda.current_stream(self.device) if stream is not None else None
        context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            if stream is not None:
                stream.wait_stream(consumer)
                batch = map_tensors(lambda t: t.to(self.device, non_blocking=True), batch)
            if self._transforms:
                batch = self._transform_input(batch)
        return batch

    def _transform_input(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return self._convert(batch)
        if isinstance(batch, Mapping):
            if self._input_key is None:
                raise ValueError("the batches are mappings: pass input_key= to say which entry to normalise/convert")
            if self._input_key not in batch:
                raise ValueError(f"input_key={self._input_key!r} is not in the batch (keys: {list(batch)})")
            items = dict(batch)
            items[self._input_key] = self._convert(batch[self._input_key])
            return rebuild_mapping(batch, items)
        if isinstance(batch, (tuple, list)) and len(batch) > 0:
            first = self._convert(batch[0])
            if _is_namedtuple(batch):
                return type(batch)(first, *batch[1:])
            return (first,) + tuple(batch[1:]) if isinstance(batch, tuple) else [first, *batch[1:]]
        raise TypeError(f"normalize/dtype need a tensor, a tuple/list or a mapping batch, got {type(batch).__name__}")

    def _convert(self, x: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"normalize/dtype apply to the input tensor, but the batch holds {type(x).__name__}")
        if self._dtype is not None:
            x = x.to(self._dtype)
        if self._normalize is None:
            return x
        channels = self._normalize[0].numel()
        if x.dim() < 2 or (channels > 1 and x.shape[1] != channels):
            raise ValueError(f"normalize has {channels} channels but the input has shape {tuple(x.shape)}; "
                             f"expected (N, {channels}, ...)")
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        key = (x.device, dtype)
        if key not in self._norm_cache:
            self._norm_cache[key] = tuple(t.to(device=x.device, dtype=dtype) for t in self._normalize)
        mean, std = self._norm_cache[key]
        shape = (1, mean.numel()) + (1,) * (x.dim() - 2)
        return (x - mean.view(shape)) / std.view(shape)
