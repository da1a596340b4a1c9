"""The Ray engine's records: a configuration of the Ray pool (``RayConfig``), what one trial of it measured
(``RayTrial``) and the decision in force (``RayTuning``, what ``loader.tuning`` answers). Facts and decisions, no
behaviour; plain JSON both ways (``to_dict``/``from_dict``), so the cache stores them without pickle."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Literal, Mapping, Optional, Tuple

from .._text import grid, rate

RaySource = Literal["tuned", "cache", "fixed"]
RAY_SOURCES: Tuple[str, ...] = ("tuned", "cache", "fixed")


@dataclass(frozen=True)
class RayConfig:
    """How Ray Data loads the batches: ``tasks`` map tasks at once (Ray Data's ``concurrency``), each asking
    ``cpus`` CPUs (fractional allowed: 0.5 runs two per CPU) and loading ``batches_per_task`` consecutive batches
    (its block: the first batch of an epoch waits for one whole block), and ``prefetch`` blocks the driver reads
    ahead (``iter_batches(prefetch_batches=...)``).

    Attributes:
        tasks (int): Map tasks running at once, >= 1.
        cpus (float): CPUs each task asks of the cluster, in (0, 64].
        batches_per_task (int): Batches one task loads and collates (the block), >= 1.
        prefetch (int): Blocks the driver reads ahead, >= 1.

    Raises:
        ValueError: A field out of range.
    """

    tasks: int
    cpus: float = 1.0
    batches_per_task: int = 1
    prefetch: int = 1

    def __post_init__(self) -> None:
        for name in ("tasks", "batches_per_task", "prefetch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RayConfig.{name}={value!r} must be an int >= 1")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, (int, float)) or not 0 < self.cpus <= 64:
            raise ValueError(f"RayConfig.cpus={self.cpus!r} must be a number of CPUs in (0, 64]")

    @property
    def cluster_cpus(self) -> float:
        """CPUs the pool holds of the cluster at most: ``tasks * cpus``."""
        return self.tasks * self.cpus

    def label(self) -> str:
        """The configuration as short text, e.g. ``"ray tasks=4 cpus=1 block=2 prefetch=4"``.

        Returns:
            str: Every field, in that order.
        """
        return f"ray tasks={self.tasks} cpus={self.cpus:g} block={self.batches_per_task} prefetch={self.prefetch}"

    def to_dict(self) -> Dict[str, Any]:
        """The configuration as plain JSON data.

        Returns:
            dict: One entry per field.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RayConfig":
        """Rebuild a configuration from ``to_dict``'s mapping.

        Args:
            data: The mapping.

        Returns:
            RayConfig: The configuration.

        Raises:
            ValueError: An unknown field or a value out of range.
            TypeError: A missing field.
        """
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown RayConfig fields {sorted(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class RayTrial:
    """One candidate measured against the step (a row of ``print(loader.tuning)``).

    Attributes:
        config (RayConfig): The candidate.
        samples_per_s (float): Steady rate through the step, samples per second; None when it failed.
        first_batch_s (float): Seconds from starting the pipeline to its first batch; None when none came.
        stall_fraction (float): Share of the timed window the step waited for data; None when it failed.
        batches (int): Batches in the timed window.
        reason (str): Why it failed; None when it measured.
    """

    config: RayConfig
    samples_per_s: Optional[float] = None
    first_batch_s: Optional[float] = None
    stall_fraction: Optional[float] = None
    batches: int = 0
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when it measured a rate."""
        return self.samples_per_s is not None

    def to_dict(self) -> Dict[str, Any]:
        """The trial as plain JSON data.

        Returns:
            dict: One entry per field, ``config`` as a dict.
        """
        return dict(dataclasses.asdict(self), config=self.config.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RayTrial":
        """Rebuild a trial from ``to_dict``'s mapping.

        Args:
            data: The mapping.

        Returns:
            RayTrial: The trial.

        Raises:
            ValueError: An unknown field, or a configuration out of range.
            TypeError: A missing field.
        """
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown RayTrial fields {sorted(unknown)}")
        return cls(**dict(data, config=RayConfig.from_dict(data["config"])))


@dataclass(frozen=True)
class RayTuning:
    """The Ray pool in force, why, and the trials behind it: ``loader.tuning`` of a ``make_loader(...,
    engine="ray")`` loader. ``print`` it for the table.

    Attributes:
        config (RayConfig): The configuration chosen.
        samples_per_s (float): Its measured rate; None when not measured (``source="fixed"``).
        source (str): ``"tuned"`` (trials ran now), ``"cache"`` (a cached decision for this cluster shape) or
            ``"fixed"`` (no trial could run: the guard's safe pool).
        cluster (dict): The cluster's shape the decision is for (nodes, CPUs, GPUs, other resources).
        trials (tuple of RayTrial): Every candidate, in the order measured.
        reason (str): Why this configuration, in words.
        seconds (float): How long tuning took.
        consumer_samples_per_s (float): The step's own rate, when measured.
        serial_s_per_batch (float): Seconds one batch took to load in the driver (the cost the pool is sized by).
        startup_s (float): Seconds the warm-up run took before the trials: the largest pool's workers starting,
            importing torch and the dataset (not counted in any trial's rate nor in the budget); None when not run.
    """

    config: RayConfig
    samples_per_s: Optional[float]
    source: RaySource
    cluster: Dict[str, Any]
    trials: Tuple[RayTrial, ...] = ()
    reason: str = ""
    seconds: float = 0.0
    consumer_samples_per_s: Optional[float] = None
    serial_s_per_batch: Optional[float] = None
    startup_s: Optional[float] = None

    @property
    def bottleneck(self) -> Optional[str]:
        """``"consumer"`` when the step is slower than loading, else ``"cpu"`` (the pool); None when unknown."""
        if self.samples_per_s is None or self.consumer_samples_per_s is None:
            return None
        return "consumer" if self.samples_per_s >= 0.95 * self.consumer_samples_per_s else "cpu"

    def with_source(self, source: RaySource) -> "RayTuning":
        """The same decision from another source.

        Args:
            source: ``"tuned"``, ``"cache"`` or ``"fixed"``.

        Returns:
            RayTuning: A copy with ``source`` replaced.
        """
        return dataclasses.replace(self, source=source)

    def to_dict(self) -> Dict[str, Any]:
        """The decision as plain JSON data (a cache entry).

        Returns:
            dict: One entry per field, nested records as dicts.
        """
        return dict(dataclasses.asdict(self), config=self.config.to_dict(), trials=[t.to_dict() for t in self.trials])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RayTuning":
        """Rebuild a decision from ``to_dict``'s mapping, checking every value.

        Args:
            data: The mapping.

        Returns:
            RayTuning: The decision.

        Raises:
            ValueError: An unknown field, a bad source, a rate that is not a finite number, a bad configuration.
            TypeError: A missing field.
        """
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown RayTuning fields {sorted(unknown)}")
        if data.get("source") not in RAY_SOURCES:
            raise ValueError(f"source must be one of {RAY_SOURCES}, got {data.get('source')!r}")
        if not isinstance(data.get("cluster"), dict):
            raise ValueError("cluster must be an object (the cluster's shape)")
        for name in ("samples_per_s", "consumer_samples_per_s", "serial_s_per_batch", "startup_s"):
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number or None, got {value!r}")
        return cls(**dict(data, config=RayConfig.from_dict(data["config"]),
                          trials=tuple(RayTrial.from_dict(t) for t in data.get("trials", ()))))

    def __str__(self) -> str:
        head = [f"Chosen: {self.config.label()} ({self.source}), {rate(self.samples_per_s)} samples/s",
                f"  why: {self.reason or 'n/a'}",
                f"  cluster: {self.cluster.get('nodes')} node(s), {self.cluster.get('cpus')} CPUs"]
        if self.consumer_samples_per_s is not None:
            head.append(f"  step alone: {rate(self.consumer_samples_per_s)} samples/s")
        if self.startup_s is not None:
            head.append(f"  start-up: {self.startup_s:.2f} s warming the pool up before the trials (not in their "
                        f"rates)")
        rows = [["*" if t.config == self.config and t.ok else " ", t.config.label(), rate(t.samples_per_s),
                 "-" if t.first_batch_s is None else f"{t.first_batch_s:.2f} s",
                 "-" if t.stall_fraction is None else f"{100 * t.stall_fraction:.0f}%", t.reason or ""]
                for t in self.trials]
        if rows:
            head += grid(["", "candidate", "samples/s", "first batch", "stall", "note"], rows, left=(1, 5))
        return "\n".join(head)
