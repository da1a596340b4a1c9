"""The built-in demo that bare ``autotune`` tunes: a synthetic image dataset with a real per-sample cost, and the
comparison of the tuned configuration against the two usual guesses (no workers; one worker per core but one).

Nothing is downloaded: every image is generated from its index, so the dataset is the same on every machine.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import LoaderConfig, make_config
from ..consumer import Consumer
from ..measure.trial import run_trial
from .._text import grid, rate
from ..request import Request
from ..results import TrialResult, TuneResult

__all__ = ["DemoImages", "Baseline", "cores_rule_workers", "baselines"]

_STORED = 96
_MEAN = np.array([123.7, 116.3, 103.5], dtype=np.float32).reshape(3, 1, 1)
_STD = np.array([58.4, 57.1, 57.4], dtype=np.float32).reshape(3, 1, 1)


def _stored_image(seed: int) -> np.ndarray:
    """A smooth, slightly noisy uint8 3x96x96 image determined by ``seed`` (it compresses like a photo, roughly)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:_STORED, 0:_STORED].astype(np.float32) / _STORED
    image = np.empty((3, _STORED, _STORED), dtype=np.float32)
    for channel in range(3):
        fx, fy, phase = rng.uniform(1.0, 6.0, 3)
        image[channel] = 127.0 + 100.0 * np.sin(2.0 * np.pi * (fx * x + fy * y) + phase)
    image += rng.normal(0.0, 4.0, image.shape)
    return (np.clip(image, 0, 255).astype(np.uint8) // 4) * 4


class DemoImages(Dataset):
    """Synthetic labelled images, decoded and augmented per sample like a real image pipeline.

    Each ``dataset[i]`` zlib-decompresses a stored 3x96x96 uint8 image, takes a random-resized crop to
    ``size`` x ``size`` (bilinear), flips, jitters brightness/contrast/saturation/gamma, blurs ``work`` times and
    normalises: about 1-2 ms of one core, all numpy, no threads. Randomness is seeded by the index, so a sample is
    the same every time. Returns ``(float32 tensor 3 x size x size, label)``.
    """

    def __init__(self, length: int = 2048, *, size: int = 64, distinct: int = 32, work: int = 10,
                 seed: int = 0) -> None:
        for name, value, low in (("length", length, 1), ("size", size, 8), ("distinct", distinct, 1),
                                 ("work", work, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if size > _STORED:
            raise ValueError(f"size must be at most {_STORED}, got {size}")
        self.length, self.size, self.work, self.seed = length, size, work, seed
        self.blobs = [zlib.compress(_stored_image(seed * 100_003 + i).tobytes(), 9) for i in range(distinct)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} out of range for DemoImages of length {self.length}")
        index %= self.length
        raw = np.frombuffer(zlib.decompress(self.blobs[index % len(self.blobs)]), dtype=np.uint8)
        raw = raw.reshape(3, _STORED, _STORED)
        rng = np.random.default_rng((self.seed, index))
        image = self._resized_crop(raw, rng)
        if rng.random() < 0.5:
            image = image[:, :, ::-1]
        brightness, contrast, saturation = (float(v) for v in rng.uniform(0.8, 1.2, 3))
        image = image * brightness
        mean = float(image.mean())
        image = (image - mean) * contrast + mean
        gray = image.mean(axis=0, keepdims=True)
        image = (image - gray) * saturation + gray
        image = 255.0 * np.power(np.clip(image, 0.0, 255.0) / 255.0, float(rng.uniform(0.8, 1.25)))
        for _ in range(self.work):
            pad = np.pad(image, ((0, 0), (1, 1), (1, 1)), mode="edge")
            image = (pad[:, :-2, 1:-1] + pad[:, 2:, 1:-1] + pad[:, 1:-1, :-2] + pad[:, 1:-1, 2:]
                     + 4.0 * pad[:, 1:-1, 1:-1]) / 8.0
        image = (image - _MEAN) / _STD
        return torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)), index % 10

    def _resized_crop(self, raw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        side = int(rng.integers(self.size * 3 // 4, _STORED + 1))
        top, left = (int(v) for v in rng.integers(0, _STORED - side + 1, 2))
        crop = raw[:, top:top + side, left:left + side].astype(np.float32)
        coords = (np.arange(self.size, dtype=np.float32) + 0.5) * (side / self.size) - 0.5
        lo = np.clip(np.floor(coords).astype(np.int64), 0, side - 1)
        hi = np.minimum(lo + 1, side - 1)
        w = np.clip(coords - lo, 0.0, 1.0).astype(np.float32)
        rows = crop[:, lo, :] * (1.0 - w)[None, :, None] + crop[:, hi, :] * w[None, :, None]
        return rows[:, :, lo] * (1.0 - w) + rows[:, :, hi] * w


def cores_rule_workers(usable_cpus: Optional[int]) -> int:
    """The common rule of thumb: one worker per usable CPU, leaving one for the main process; at least one."""
    return max(1, (usable_cpus or 1) - 1)


@dataclass(frozen=True)
class Baseline:
    """A configuration the tuned one is compared with, and what it measured (``trial`` None: not measured)."""

    name: str
    config: LoaderConfig
    trial: Optional[TrialResult]
    measured_by_tuner: bool
    description: str = ""
    """How the configuration was derived, in words (the cores rule's arithmetic); the config's label otherwise."""

    @property
    def samples_per_s(self) -> Optional[float]:
        return self.trial.samples_per_s if self.trial is not None and self.trial.ok else None

    def to_dict(self) -> dict:
        return {"name": self.name, "config": self.config.loader_kwargs(), "samples_per_s": self.samples_per_s,
                "measured_by_tuner": self.measured_by_tuner,
                "status": None if self.trial is None else self.trial.status,
                "reason": None if self.trial is None else self.trial.reason}


def _tried(result: TuneResult, config: LoaderConfig) -> Optional[TrialResult]:
    for trial in result.trials:
        if trial.config == config and trial.ok:
            return trial
    return None


def baselines(request: Request, result: TuneResult, *, usable_cpus: Optional[int],
              time_limit: float = 4.0) -> List[Baseline]:
    """``num_workers=0`` and the cores rule (same prefetch/pin defaults as the tuner), each taken from the tuner's
    trials when it tried that configuration, else timed now with one extra trial against the same consumer (never
    above ``max_workers``: such a baseline is left unmeasured)."""
    pin = result.config.pin_memory
    rule = cores_rule_workers(usable_cpus)
    wanted = [("num_workers=0", make_config(0, fixed={}, pin_memory=pin), ""),
              ("cores rule", make_config(rule, fixed={}, pin_memory=pin),
               f"max(1, {usable_cpus if usable_cpus is not None else '?'} usable CPUs - 1) = "
               f"{rule} worker{'s' if rule != 1 else ''}")]
    consumer: Optional[Consumer] = None
    found = []
    for name, config, description in wanted:
        trial = _tried(result, config)
        by_tuner = trial is not None
        if trial is None and (request.max_workers is None or config.num_workers <= request.max_workers):
            consumer = consumer or Consumer(request.step, request.device)
            trial = run_trial(request, config, consumer=consumer, limit_s=time_limit)
        found.append(Baseline(name, config, trial, by_tuner, description))
    return found


def format_comparison(result: TuneResult, baselines: Sequence[Baseline]) -> str:
    """The tuned rate against each baseline, with how each figure was obtained."""
    rows = [["tuned", result.config.label(), rate(result.samples_per_s), "", "chosen by the tuner"]]
    for base in baselines:
        measured = base.samples_per_s
        ratio = f"tuned is {result.samples_per_s / measured:.2f}x" if measured and result.samples_per_s else "-"
        if base.trial is None:
            how = "not run: more workers than --max-workers allows"
        elif not base.trial.ok:
            how = f"{base.trial.status}: {base.trial.reason}"
        else:
            how = "measured by the tuner" if base.measured_by_tuner else "one extra trial"
        rows.append([base.name, base.description or base.config.label(), rate(measured), ratio, how])
    headers = ["", "config", "samples/s", "", "figure from"]
    return "Against the usual guesses (same consumer, same trial method)\n" + "\n".join(
        "  " + line for line in grid(headers, rows, left=(0, 1, 3)))
