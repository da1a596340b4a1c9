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
from .probe._pools import NativePool, limit_held
from .report import format_tune_result

Bottleneck = Literal["consumer", "cpu", "io", "ipc", "memory", "oversubscription"]
Source = Literal["tuned", "online", "cache", "fallback", "pending"]
TrialStatus = Literal["ok", "skipped", "failed"]

BOTTLENECKS: Tuple[str, ...] = ("consumer", "cpu", "io", "ipc", "memory", "oversubscription")
SOURCES: Tuple[str, ...] = ("tuned", "online", "cache", "fallback", "pending")
TRIAL_STATUSES: Tuple[str, ...] = ("ok", "skipped", "failed")


@dataclass(frozen=True)
class TrialResult:
    """What one candidate configuration measured, or why it did not run: one row of ``print(loader.tuning)``.

    A candidate is a trial before training, or online a slice of your own epoch. Rates are steady-state: start-up
    (``startup_s``) and the burst of batches the workers prefetched during it are left out (NOTE [ Trial timing ] in
    ``autoloader/measure/run.py``). Per-worker figures are None without workers or where the platform does not report
    them; a candidate that was skipped holds only its ``config``, ``status``, ``reason`` and ``footprint_bytes``.

    Attributes:
        config (LoaderConfig): The configuration measured.
        status (str): ``"ok"`` (measured), ``"skipped"`` (not started, or stopped at its first batch: it would not
            fit the memory budget, ``/dev/shm`` or what is left of the time budget) or ``"failed"`` (a worker died, it
            ran past its time limit, too few batches, too many open files...).
        reason (str): Why it was skipped or failed, in words (e.g. ``"memory: ... over the memory budget of ..."``,
            ``"worker killed (SIGKILL, usually the out-of-memory killer)"``); None when ok.
        samples_per_s (float): Samples per second over the timed window; None when nothing was measured.
        batches (int): Batches in the timed window.
        window_s (float): Seconds the timed window spanned.
        startup_s (float): Seconds from starting the DataLoader's iterator to its first batch (forking or spawning
            the workers, their first batch); None when no batch came.
        elapsed_s (float): Seconds the whole candidate took, start-up and window.
        stall_fraction (float): The share of the window the consumer spent waiting for data, 0 to 1.
        fetch_s_per_batch (float): Seconds per batch spent waiting inside ``next()``.
        fetch_cpu_s_per_batch (float): CPU seconds per batch the main process spent inside ``next()`` (without
            workers: the cost of loading a batch).
        fetch_delay_s_per_batch (float): Of ``fetch_s_per_batch``, the time the measuring thread waited for a CPU
            (run-queue wait, not waiting for data); None where the kernel does not say.
        consumer_s_per_batch (float): Seconds per batch the step took (the simulated or your real one).
        worker_cpu_util (float): How busy each worker kept a CPU, 0 to 1 (CPU time over wall time, per worker).
        worker_cpu_s_per_batch (float): The workers' CPU seconds per batch.
        main_cpu_util (float): How busy the main process kept a CPU during the window.
        read_bytes_per_batch (float): Bytes the workers read from storage per batch.
        worker_rss_bytes (int): The largest worker's resident memory at the window's end.
        worker_uss_bytes (int): The largest worker's private memory (USS) at the window's end.
        worker_uss_growth_bytes (int): The most one worker's USS grew from its first batch to the window's end
            (copy-on-read, PyTorch issue 13246).
        batch_bytes (int): Bytes of one batch's tensors.
        steady (bool): False when the window was cut short (inside the start-up burst, or too few batches): the rate
            is then a lower bound counted from the start, shown as "not steady".
        worker_uss_total_bytes (int): The workers' memory: the sum of their USS at the window's end.
        footprint_bytes (int): What the configuration takes of the memory budget (NOTE [ Memory budget ] in
            ``autoloader/search/budget.py``): from its own measurements when it ran, predicted when it was skipped;
            None when unknown.
        worker_copied_bytes (int): What one worker copied of the pages it shared with the main process, from its first
            batch to the window's end (copy-on-read: NOTE [ Copy-on-read forecast ] in
            ``autoloader/search/growth.py``); None with one worker, or where Linux's ``/proc/<pid>/pagemap`` could
            not be read.
        worker_copied_run_bytes (int): Of ``worker_copied_bytes``, the pages next to another copied one (what the
            worker wrote, such as new objects in inherited free space: they grow linearly, not up to a span).
        worker_copy_span_bytes (int): Of what that worker shared at its first batch, the bytes within the address span
            its copies fell in: the inherited objects its reads copy from, the most that copying can reach.
        worker_shared_bytes (int): What that worker shared with the main process at its first batch: the most it can
            ever copy.
        native_pools (tuple of NativePool): The native thread pools one of its workers found, and kept under
            ``config.native_threads`` (NOTE [ Native thread pools ] in ``autoloader/loader/native.py``); None
            without workers, or when unknown (no threadpoolctl).
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
    footprint_bytes: Optional[int] = None
    native_pools: Optional[Tuple[NativePool, ...]] = None
    worker_copied_bytes: Optional[int] = None
    worker_copied_run_bytes: Optional[int] = None
    worker_copy_span_bytes: Optional[int] = None
    worker_shared_bytes: Optional[int] = None

    @property
    def ok(self) -> bool:
        """True when it ran and measured a rate (``status == "ok"`` and ``samples_per_s`` is not None)."""
        return self.status == "ok" and self.samples_per_s is not None

    @property
    def native_limit_held(self) -> Optional[bool]:
        """Whether its workers' native pools were seen held to ``config.native_threads`` (``probe._pools.limit_held``):
        None without workers or without a limit; False when they were not (their pools unknown: threadpoolctl
        missing; or one kept more threads)."""
        return None if self.config.num_workers == 0 else limit_held(self.config.native_threads, self.native_pools)

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
        """The trial as plain JSON data.

        Returns:
            dict: One entry per field, ``config`` and ``native_pools`` as dicts; ``from_dict`` reads it back.
        """
        data = dataclasses.asdict(self)
        data["config"] = self.config.to_dict()
        data["native_pools"] = None if self.native_pools is None else [p.to_dict() for p in self.native_pools]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrialResult":
        """Rebuild a trial from what ``to_dict`` returned.

        Args:
            data: The mapping ``to_dict`` made, as JSON gives it back.

        Returns:
            TrialResult: The trial it holds.

        Raises:
            KeyError: ``data`` has no ``config``.
            ValueError: An unknown field, a bad ``status``, ``native_pools`` that is not a list, or a configuration
                value out of range.
            TypeError: A configuration flag that is not a bool, or a field of the wrong kind.
        """
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
    """The chosen DataLoader configuration, why it was chosen, and every candidate behind it: ``loader.tuning``.

    ``print(result)`` shows it as a report with one row per candidate (the chosen one marked ``*``). The knobs are
    ``config``'s, and the result answers them too: ``result.num_workers`` (any field of ``LoaderConfig``) reads
    ``result.config.num_workers``. Frozen; ``to_dict``/``from_dict`` round-trip it through plain JSON (the cache).

    Attributes:
        config (LoaderConfig): The chosen configuration: ``num_workers``, ``prefetch_factor``, ``pin_memory``,
            ``persistent_workers``, ``threads``, ``native_threads``, ``multiprocessing_context``.
        samples_per_s (float): Its measured rate in samples per second; None when nothing was measured (a
            fallback, or online before the first decision).
        bottleneck (str): What limits it: ``"consumer"`` (the training step: more workers would not help),
            ``"cpu"`` (the usable cores are busy loading), ``"io"`` (workers mostly wait on storage or network),
            ``"ipc"`` (handing batches between processes costs more than loading them), ``"memory"`` (more
            workers would not fit in the memory budget or ``/dev/shm``) or ``"oversubscription"`` (workers lost to
            loading in the main process because their native thread pools, BLAS or OpenMP, together ran more threads
            than there are CPUs); None when unknown.
        source (str): Where it came from: ``"tuned"`` (trials ran now), ``"online"`` (decided in the training loop),
            ``"cache"`` (a cached result, no trial ran now), ``"fallback"`` (nothing could be measured: a safe
            default, not cached) or ``"pending"`` (``make_loader``'s before its first ``iter()``, which looks up the
            cache and tunes: the configuration of the DataLoader that answers until then).
        trials (tuple of TrialResult): Every candidate, in the order measured (for a cached result, those of the
            tuning that made it).
        consumer_samples_per_s (float): The training step's own rate (``batch_size`` over its seconds per batch);
            no number of workers makes the loop faster. None when not measured.
        seconds (float): How long the tuning took (online: the seconds of the epochs its candidates served).
        reason (str): Why this configuration, in words (e.g. "fewest workers within 5% of the best measured rate
            ..."); under several nodes it starts with the node that decided.
        created (float): When it was tuned, seconds since the epoch; None when unknown.
        disk_ceiling_samples_per_s (float): With bottleneck ``"io"`` and a disk figure in the saved machine
            profile: the rate the disk's sequential read speed allows at ``read_bytes_per_sample``; None otherwise.
        read_bytes_per_sample (float): Bytes the chosen configuration's workers read per sample (given with the
            disk ceiling).
        memory_budget_bytes (int): The memory budget every candidate was kept under (None: unknown or not searched).
        memory_budget_from (str): How that budget was set, in words (e.g. "2,048 MiB (0.5 of 4,096 MiB, the
            available memory; the default)").
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
    read_bytes_per_sample: Optional[float] = None
    memory_budget_bytes: Optional[int] = None
    memory_budget_from: Optional[str] = None

    def __getattr__(self, name: str) -> Any:
        if name in RECORDED:  # only called for names that are not fields: the knobs, read off ``config``
            return getattr(self.config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def native_pools(self) -> Optional[Tuple[NativePool, ...]]:
        """The native thread pools (BLAS, OpenMP, OpenCV, numexpr) a worker of the chosen configuration found, and
        the threads each kept under its ``native_threads``; None when not measured (no workers, no threadpoolctl, a
        fallback)."""
        same = [t for t in self.trials if t.ok and t.config.same_candidate(self.config)]
        chosen = next((t for t in same if t.samples_per_s == self.samples_per_s), same[-1] if same else None)
        return chosen.native_pools if chosen is not None else None

    @property
    def native_limit_held(self) -> Optional[bool]:
        """Whether the chosen configuration's native limit was seen held in its workers (``probe._pools.limit_held``
        on ``native_pools``): None without workers or without a limit; False when it was not seen so."""
        return None if self.config.num_workers == 0 else limit_held(self.config.native_threads, self.native_pools)

    def with_source(self, source: Source) -> "TuneResult":
        """The same result from another source.

        Args:
            source: ``"tuned"``, ``"online"``, ``"cache"`` or ``"fallback"``.

        Returns:
            TuneResult: A copy with ``source`` replaced.
        """
        return dataclasses.replace(self, source=source)

    def to_dict(self) -> dict:
        """The result as plain JSON data (what a cache entry holds).

        Returns:
            dict: One entry per field, ``config`` and each of ``trials`` as dicts; ``from_dict`` reads it back.
        """
        data = dataclasses.asdict(self)
        data["config"] = self.config.to_dict()
        data["trials"] = [t.to_dict() for t in self.trials]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TuneResult":
        """Rebuild a result from what ``to_dict`` returned, checking every value (the cache reads entries so).

        Args:
            data: The mapping ``to_dict`` made, as JSON gives it back.

        Returns:
            TuneResult: The result it holds.

        Raises:
            ValueError: An unknown field, a ``config`` that is not a mapping or holds a value out of range, a rate
                that is not a finite number, a bad ``bottleneck`` or ``source``.
            TypeError: A configuration flag that is not a bool, or a field of the wrong kind.
            KeyError: A trial without its ``config``.
        """
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
    """One decision of a loader tuned online (an entry of ``loader.decisions``): the configuration that served from
    ``epoch`` on, and why.

    Attributes:
        epoch (int): The epoch whose search made it (the decision serves the rest of that epoch and the next ones).
        config (LoaderConfig): The configuration chosen.
        samples_per_s (float): The rate it measured, samples per second; None when unknown.
        stall_fraction (float): The share of its measured window the loop spent waiting for data, 0 to 1.
        why (str): Why its search ran: ``"no tuning for this dataset and machine yet"`` for the first, else the
            re-tune rule that fired after an epoch (the loop waited for data, the epoch ran slower or faster than
            the decision's rate, the loop hardly waited with several workers, or the candidates were measured in
            different epochs).
        candidates (int): Candidates measured for it, in the training loop itself.
        search_s (float): Seconds of your epochs those candidates served (not extra time).
        switch_s (float): Of ``search_s``, the seconds spent stopping one candidate's workers and starting the
            next's.
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
    """One epoch that searched online (an entry of ``loader.online_traces``): when each batch reached the loop, and
    each candidate's span; ``autoloader.cli.plot.plot_online_epoch`` draws it.

    Attributes:
        epoch (int): The epoch's number.
        start (float): When it started (``time.perf_counter()``).
        batches (list): ``(seconds since the epoch started, samples)`` for each batch handed to the loop.
        spans (list): ``(start s, end s, label, samples/s measured or None)`` for each candidate that served part
            of the epoch, the decision's last.
    """

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
