"""What ``PrefetchLoader`` does to the input tensor on the device: ``dtype`` then ``normalize=(mean, std)``."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from .batch import Batch, _is_namedtuple, rebuild_mapping

_EXAMPLE = "e.g. normalize=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))"


def check_normalize(normalize: Any) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(mean, std)`` as float64 CPU tensors, one value per channel; raises for anything else."""
    if normalize is None:
        return None
    if not isinstance(normalize, (tuple, list)) or len(normalize) != 2:
        raise TypeError(f"normalize must be a (mean, std) pair, got {normalize!r}; {_EXAMPLE}")
    parts: List[torch.Tensor] = []
    for name, value in zip(("mean", "std"), normalize):
        if isinstance(value, (str, bytes)):
            raise TypeError(f"normalize {name} must be numbers per channel, got {value!r}; {_EXAMPLE}")
        try:
            part = torch.as_tensor(value, dtype=torch.float64).detach().cpu().reshape(-1)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"normalize {name} must be numbers per channel, got {value!r}; {_EXAMPLE}") from exc
        if part.numel() == 0 or not bool(torch.isfinite(part).all()):
            raise ValueError(f"normalize {name} must be finite numbers, one per channel, got {value!r}; {_EXAMPLE}")
        parts.append(part)
    mean, std = parts
    if mean.numel() != std.numel():
        raise ValueError(f"normalize mean has {mean.numel()} channels but std has {std.numel()}; give one per channel")
    if bool((std == 0).any()):
        raise ValueError(f"normalize std must be non-zero, got {normalize[1]!r}")
    return mean, std


class InputTransform:
    """Converts and normalises the input tensor of a batch: the batch itself when it is a tensor, its first element
    when it is a tuple/list, ``batch[input_key]`` when it is a mapping. Other tensors pass through unchanged."""

    def __init__(self, *, normalize: Optional[Tuple[Sequence[float], Sequence[float]]],
                 dtype: Optional[torch.dtype], input_key: Optional[Hashable]) -> None:
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}; use e.g. dtype=torch.float32")
        self.normalize = check_normalize(normalize)
        if self.normalize is not None and dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} cannot hold normalised values; use a floating dtype such as torch.float32")
        self.dtype, self.input_key = dtype, input_key
        self._cache: Dict[Tuple[torch.device, torch.dtype], Tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def active(self) -> bool:
        return self.normalize is not None or self.dtype is not None

    def __call__(self, batch: Batch) -> Batch:
        if isinstance(batch, torch.Tensor):
            return self._convert(batch)
        if isinstance(batch, Mapping):
            if self.input_key is None:
                raise ValueError("the batches are mappings: pass input_key= to say which entry to normalise/convert")
            if self.input_key not in batch:
                raise ValueError(f"input_key={self.input_key!r} is not in the batch (keys: {list(batch)})")
            items = dict(batch)
            items[self.input_key] = self._convert(batch[self.input_key])
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
        if self.dtype is not None:
            x = x.to(self.dtype)
        if self.normalize is None:
            return x
        channels = self.normalize[0].numel()
        if x.dim() < 2 or (channels > 1 and x.shape[1] != channels):
            raise ValueError(f"normalize has {channels} channels but the input has shape {tuple(x.shape)}; "
                             f"expected (N, {channels}, ...)")
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        key = (x.device, dtype)
        if key not in self._cache:
            self._cache[key] = tuple(t.to(device=x.device, dtype=dtype) for t in self.normalize)  # type: ignore
        mean, std = self._cache[key]
        shape = (1, mean.numel()) + (1,) * (x.dim() - 2)
        return (x - mean.view(shape)) / std.view(shape)
