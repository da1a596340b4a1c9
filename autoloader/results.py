"""The frozen records autoloader produces: a loader configuration, one trial's measurements, a tuning result.

They carry facts and decisions, never behaviour, and round-trip through plain JSON (``to_dict``/``from_dict``) so
the cache stores them without pickle.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Tuple

from .report import format_tune_result

Bottleneck = Literal["consumer", "cpu", "io", "ipc", "memory"]
Source = Literal["tuned", "online", "cache", "fallback"]
TrialStatus = Literal["ok", "skipped", "failed"]

BOTTLENECKS: Tuple[str, ...] = ("consumer", "cpu", "io", "ipc", "memory")
SOURCES: Tuple[str, ...] = ("tuned", "online", "cache", "fallback")
TRIAL_STATUSES: Tuple[str, ...] = ("ok", "skipped", "failed")


WORKER_ONLY = ("multiprocessing_context", "timeout", "persistent_workers", "prefetch_factor")
"""DataLoader keywords that only mean something with workers; DataLoader rejects some of them at num_workers=0."""


def without_worker_only(kwargs: Mapping[str, Any]) -> dict:
    """``kwargs`` less the keywords that need workers (for a configuration with ``num_workers=0``)."""
    return {k: v for k, v in kwargs.items() if k not in WORKER_ONLY}


@dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader knobs autoloader tunes. ``prefetch_factor`` is None when ``num_workers == 0``."""

    num_workers: int
    prefetch_factor: Optional[int] = None
    pin_memory: bool = False
    persistent_workers: bool = False
    threads: int = 1
    """Threads fetching a batch's samples inside each process (see ``autoloader.threads``); 1: none."""

    def __post_init__(self) -> None:
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ValueError("prefetch_factor and persistent_workers need num_workers > 0")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def loader_kwargs(self) -> dict:
        """The keywords to pass to ``torch.utils.data.DataLoader`` for this configuration (with no workers, drop
        the user's ``WORKER_ONLY`` keywords first: ``without_worker_only``)."""
        kwargs: dict = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["persistent_workers"] = self.persistent_workers
        return kwargs

    def same_candidate(self, other: "LoaderConfig") -> bool:
        """The same candidate as ``other`` whatever their ``persistent_workers`` (candidates are measured without it;
        a decision sets it afterwards)."""
        return (self.num_workers, self.prefetch_factor, self.pin_memory, self.threads) == \
            (other.num_workers, other.prefetch_factor, other.pin_memory, other.threads)

    def label(self) -> str:
        text = f"workers={self.num_workers}"
        if self.num_workers > 0:
            text += f" prefetch={self.prefetch_factor}"
        if self.threads > 1:
            text += f" threads={self.threads}"
        if self.pin_memory:
            text += " pin"
        return text


@dataclass(frozen=True)
class TrialResult:
    """What one candidate configuration measured (or why it did not run).

    Rates are steady-state: ``samples_per_s`` excludes start-up (``startup_s``, the time to the first batch) and the
    burst of prefetched batches (see NOTE [ Trial timing ] in ``trial.py``). Per-worker figures are None for
    ``num_workers == 0`` or when the platform does not report them.
    """

    config: LoaderConfig
    status: TrialStatus = "ok"
    reason: Optional[str] = None
    samples_per_s: Optional[float] = None
    batches: int = 0
    window_s: float = 0.0
    startup_s: Optional[float] = None
    elapsed_s: float = 0.0
    stall_fraction: Optional[float] = None
    fetch_s_per_batch: Optional[float] = None
    fetch_cpu_s_per_batch: Optional[float] = None
    consumer_s_per_batch: Optional[float] = None
    worker_cpu_util: Optional[float] = None
    worker_cpu_s_per_batch: Optional[float] = None
    main_cpu_util: Optional[float] = None
    read_bytes_per_batch: Optional[float] = None
    worker_rss_bytes: Optional[int] = None
    worker_uss_bytes: Optional[int] = None
    worker_uss_growth_bytes: Optional[int] = None
    batch_bytes: Optional[int] = None
    steady: bool = True
    worker_uss_total_bytes: Optional[int] = None
    """The workers' memory: the sum of their USS at the window's end (``worker_uss_bytes`` is the largest one)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.samples_per_s is not None

    @property
    def worker_memory_bytes(self) -> Optional[int]:
        """The workers' memory: the sum of their USS (0 without worker processes: threads of the main process have
        none of their own); None when not measured."""
        if self.config.num_workers == 0:
            return 0
        if self.worker_uss_total_bytes is not None:
            return self.worker_uss_total_bytes
        return None if self.worker_uss_bytes is None else self.worker_uss_bytes * self.config.num_workers

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["config"] = dataclasses.asdict(self.config)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrialResult":
        data = dict(data)
        data["config"] = LoaderConfig(**data["config"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown TrialResult fields {sorted(unknown)}")
        if data.get("status", "ok") not in TRIAL_STATUSES:
            raise ValueError(f"bad trial status {data.get('status')!r}")
        return cls(**data)


@dataclass(frozen=True)
class TuneResult:
    """The chosen DataLoader configuration, why it was chosen, and every trial behind it."""

    num_workers: int
    prefetch_factor: Optional[int]
    pin_memory: bool
    persistent_workers: bool
    samples_per_s: Optional[float]
    bottleneck: Optional[Bottleneck]
    source: Source
    trials: Tuple[TrialResult, ...] = ()
    consumer_samples_per_s: Optional[float] = None
    seconds: float = 0.0
    reason: str = ""
    created: Optional[float] = field(default=None, compare=False)
    threads: int = 1
    disk_ceiling_samples_per_s: Optional[float] = None
    """When loading waits on reads (bottleneck "io"): the rate the disk's sequential read speed (the saved machine
    profile's) allows at ``read_bytes_per_sample``; None when unknown or not I/O-bound."""
    read_bytes_per_sample: Optional[float] = None
    """Bytes the chosen configuration's workers read per sample (measured with the disk ceiling)."""

    @property
    def config(self) -> LoaderConfig:
        return LoaderConfig(self.num_workers, self.prefetch_factor, self.pin_memory, self.persistent_workers,
                            self.threads)

    def with_source(self, source: Source) -> "TuneResult":
        return dataclasses.replace(self, source=source)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["trials"] = [t.to_dict() for t in self.trials]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TuneResult":
        """Rebuild from ``to_dict`` output; raises ``ValueError``/``TypeError``/``KeyError`` on malformed data."""
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown TuneResult fields {sorted(unknown)}")
        data["trials"] = tuple(TrialResult.from_dict(t) for t in data.get("trials", ()))
        result = cls(**data)
        _check_types(result)
        return result

    def __str__(self) -> str:
        return format_tune_result(self)


@dataclass(frozen=True)
class Decision:
    """One decision of a loader tuned online: the configuration that served from ``epoch`` on, and why.

    ``candidates`` were measured in the training loop itself for it, serving ``search_s`` seconds of the epoch (not
    extra time), of which ``switch_s`` went to stopping one candidate's workers and starting the next's.
    """

    epoch: int
    config: LoaderConfig
    samples_per_s: Optional[float]
    stall_fraction: Optional[float]
    why: str
    candidates: int = 0
    search_s: float = 0.0
    switch_s: float = 0.0


def _check_types(result: TuneResult) -> None:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not is_int(result.num_workers) or result.num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {result.num_workers!r}")
    if result.prefetch_factor is not None and (not is_int(result.prefetch_factor) or result.prefetch_factor < 1):
        raise ValueError(f"prefetch_factor must be None or an int >= 1, got {result.prefetch_factor!r}")
    if (result.num_workers == 0) != (result.prefetch_factor is None):
        raise ValueError("prefetch_factor must be None exactly when num_workers == 0")
    for name in ("pin_memory", "persistent_workers"):
        if not isinstance(getattr(result, name), bool):
            raise TypeError(f"{name} must be a bool")
    if not is_int(result.threads) or result.threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {result.threads!r}")
    for name in ("samples_per_s", "disk_ceiling_samples_per_s", "read_bytes_per_sample"):
        value = getattr(result, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if result.bottleneck is not None and result.bottleneck not in BOTTLENECKS:
        raise ValueError(f"bottleneck must be one of {BOTTLENECKS}, got {result.bottleneck!r}")
    if result.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {result.source!r}")
