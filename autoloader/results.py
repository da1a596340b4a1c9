"""The records autoloader produces: one trial's measurements, a tuning result, an online decision and the trace of an
epoch that searched online.

They carry facts and decisions, never behaviour, and round-trip through plain JSON (``to_dict``/``from_dict``) so
the cache stores them without pickle.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, List, Literal, Mapping, Optional, Tuple

from .config import RECORDED, LoaderConfig, check_knobs
from .probe._pools import NativePool
from .report import format_tune_result

Bottleneck = Literal["consumer", "cpu", "io", "ipc", "memory"]
Source = Literal["tuned", "online", "cache", "fallback"]
TrialStatus = Literal["ok", "skipped", "failed"]

BOTTLENECKS: Tuple[str, ...] = ("consumer", "cpu", "io", "ipc", "memory")
SOURCES: Tuple[str, ...] = ("tuned", "online", "cache", "fallback")
TRIAL_STATUSES: Tuple[str, ...] = ("ok", "skipped", "failed")


@dataclass(frozen=True)
class TrialResult:
    """What one candidate configuration measured (or why it did not run).

    Rates are steady-state: ``samples_per_s`` excludes start-up (``startup_s``, the time to the first batch) and the
    burst of prefetched batches (see NOTE [ Trial timing ] in ``measure/run.py``). Per-worker figures are None for
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
    fetch_delay_s_per_batch: Optional[float] = None
    """Of ``fetch_s_per_batch``, the time the measuring thread waited for a CPU (``measure/cpuclock.py``): not
    waiting for data. None where the kernel does not say."""
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
    footprint_bytes: Optional[int] = None
    """What the configuration takes of the memory budget (NOTE [ Memory budget ] in search/budget.py): from its own
    measurements when it ran, predicted when it was skipped; None when unknown."""
    native_pools: Optional[Tuple[NativePool, ...]] = None
    """The native thread pools one of its workers found, and kept under ``config.native_threads`` (NOTE [ Native
    thread pools ] in loader/native.py); None without workers, or when unknown (no threadpoolctl)."""

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
        data["config"] = self.config.to_dict()
        data["native_pools"] = None if self.native_pools is None else [p.to_dict() for p in self.native_pools]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrialResult":
        data = dict(data)
        data["config"] = LoaderConfig.from_dict(data["config"])
        if data.get("native_pools") is not None:
            if not isinstance(data["native_pools"], (list, tuple)):
                raise ValueError(f"native_pools must be a list of pools, got {data['native_pools']!r}")
            data["native_pools"] = tuple(NativePool.from_dict(p) for p in data["native_pools"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown TrialResult fields {sorted(unknown)}")
        if data.get("status", "ok") not in TRIAL_STATUSES:
            raise ValueError(f"bad trial status {data.get('status')!r}")
        return cls(**data)


@dataclass(frozen=True)
class TuneResult:
    """The chosen DataLoader configuration, why it was chosen, and every trial behind it.

    The knobs are ``config``'s; ``result.num_workers`` (any knob of ``LoaderConfig``) reads ``result.config``'s.
    """

    config: LoaderConfig
    samples_per_s: Optional[float]
    bottleneck: Optional[Bottleneck]
    source: Source
    trials: Tuple[TrialResult, ...] = ()
    consumer_samples_per_s: Optional[float] = None
    seconds: float = 0.0
    reason: str = ""
    created: Optional[float] = field(default=None, compare=False)
    disk_ceiling_samples_per_s: Optional[float] = None
    """When loading waits on reads (bottleneck "io"): the rate the disk's sequential read speed (the saved machine
    profile's) allows at ``read_bytes_per_sample``; None when unknown or not I/O-bound."""
    read_bytes_per_sample: Optional[float] = None
    """Bytes the chosen configuration's workers read per sample (measured with the disk ceiling)."""
    memory_budget_bytes: Optional[int] = None
    """The memory budget the search kept every candidate under (None: unknown or not searched)."""
    memory_budget_from: Optional[str] = None
    """How that budget was set, in words (``MemoryBudget.describe``)."""

    def __getattr__(self, name: str) -> Any:
        if name in RECORDED:  # only called for names that are not fields: the knobs, read off ``config``
            return getattr(self.config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def native_pools(self) -> Optional[Tuple[NativePool, ...]]:
        """The native thread pools a worker of the chosen configuration found, and kept under its
        ``native_threads``; None when not measured (no workers, no threadpoolctl, a fallback)."""
        same = [t for t in self.trials if t.ok and t.config.same_candidate(self.config)]
        chosen = next((t for t in same if t.samples_per_s == self.samples_per_s), same[-1] if same else None)
        return chosen.native_pools if chosen is not None else None

    def with_source(self, source: Source) -> "TuneResult":
        return dataclasses.replace(self, source=source)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["config"] = self.config.to_dict()
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
        if not isinstance(data.get("config"), Mapping):
            raise ValueError("config must be an object of LoaderConfig fields")
        _check_config(data["config"])
        data["config"] = LoaderConfig.from_dict(data["config"])
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


@dataclass
class EpochTrace:
    """One epoch that searched: when each batch reached the loop, and each candidate's span (for ``plot``)."""

    epoch: int
    start: float
    batches: List[Tuple[float, int]] = field(default_factory=list)
    """(seconds since the epoch started, samples) per batch handed to the loop."""
    spans: List[Tuple[float, float, str, Optional[float]]] = field(default_factory=list)
    """(start s, end s, label, samples/s measured or None) per candidate, the decision's last."""

    def span(self, start: float, config: LoaderConfig, rate: Optional[float]) -> float:
        """Close the span of ``config`` that began at ``start`` (perf_counter); returns now."""
        now = time.perf_counter()
        self.spans.append((start - self.start, now - self.start, config.label(), rate))
        return now


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_config(config: Mapping[str, Any]) -> None:
    """A stored configuration's values (``config.check_knobs``), prefetch_factor set exactly with workers."""
    check_knobs(config)
    if (config.get("num_workers") == 0) != (config.get("prefetch_factor") is None):
        raise ValueError("prefetch_factor must be None exactly when num_workers == 0")


def _check_types(result: TuneResult) -> None:
    for name in ("samples_per_s", "disk_ceiling_samples_per_s", "read_bytes_per_sample"):
        value = getattr(result, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if result.memory_budget_bytes is not None and (not _is_int(result.memory_budget_bytes)
                                                   or result.memory_budget_bytes < 0):
        raise ValueError(f"memory_budget_bytes must be an int >= 0, got {result.memory_budget_bytes!r}")
    if result.memory_budget_from is not None and not isinstance(result.memory_budget_from, str):
        raise ValueError(f"memory_budget_from must be a string, got {result.memory_budget_from!r}")
    if result.bottleneck is not None and result.bottleneck not in BOTTLENECKS:
        raise ValueError(f"bottleneck must be one of {BOTTLENECKS}, got {result.bottleneck!r}")
    if result.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {result.source!r}")
