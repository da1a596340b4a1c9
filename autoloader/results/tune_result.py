"""The tuning's record (``TuneResult``: the chosen configuration, why, and every candidate behind it), round-tripped
through plain JSON, and its text (``print(result)``; the facts' words from their values: results/tune_words.py)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Tuple

from .._text import UNKNOWN, grid, mib, rate, when
from ..config import RECORDED, LoaderConfig, check_knobs
from ..probe._pools import NativePool, limit_held
from .trial_result import TrialResult, trial_row
from .tune_words import bottleneck_words, disk_words, limit_words, load_words

Bottleneck = Literal["consumer", "consumer-cpu", "cpu", "io", "ipc", "memory", "oversubscription"]
Source = Literal["tuned", "online", "cache", "fallback", "pending"]

BOTTLENECKS: Tuple[str, ...] = ("consumer", "consumer-cpu", "cpu", "io", "ipc", "memory", "oversubscription")
SOURCES: Tuple[str, ...] = ("tuned", "online", "cache", "fallback", "pending")


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


# ---------------------------------------------------------------- the text

def config_kwargs(result: TuneResult) -> str:
    """The chosen knobs as the DataLoader keywords a user would type (those that apply to ``num_workers``), the
    threads per process (``make_loader``'s ``threads=``) when more than one, and the limit of each worker's native
    thread pools (``native_threads=``) when there is one."""
    config = result.config
    text = ", ".join(f"{k}={v}" for k, v in config.loader_kwargs().items())
    text += f"; threads={config.threads} per process" if config.threads > 1 else ""
    if not config.native_threads:
        return text
    return text + f"; native_threads={config.native_threads} per worker" + (
        " (not seen applied)" if result.native_limit_held is False else "")


def _source_words(result: TuneResult) -> str:
    tried = f"{len(result.trials)} trial{'s' if len(result.trials) != 1 else ''}"
    if result.source == "tuned":
        return f"tuned in {result.seconds:.1f} s ({tried})"
    if result.source == "cache":
        return f"from the cache: no trial ran now (tuned {when(result.created)} in {result.seconds:.1f} s, {tried})"
    if result.source == "online":
        if result.samples_per_s is None and not result.trials:
            return f"online: {result.reason or 'not decided yet'}"
        candidates = f"{len(result.trials)} candidate{'s' if len(result.trials) != 1 else ''}"
        return f"tuned online, in the training loop ({candidates} over {result.seconds:.1f} s of its epochs)"
    if result.source == "pending":
        return f"pending: {result.reason}"
    return f"fallback, not tuned: {result.reason or 'no reason recorded'}"


def _is_chosen(trial: TrialResult, result: TuneResult) -> bool:
    return trial.ok and trial.config.same_candidate(result.config) and \
        (result.samples_per_s is None or trial.samples_per_s == result.samples_per_s)  # measured twice: the one chosen


def native_words(result: TuneResult) -> Optional[str]:
    """The native thread pools a worker of the chosen configuration found and the limit chosen, with the measurement
    without it when the search made one (NOTE [ Native thread pools ] in loader/native.py); None without workers."""
    config = result.config
    if config.num_workers == 0:
        return None
    pools = result.native_pools
    found = UNKNOWN + " (not measured, or threadpoolctl is not installed)" if pools is None else \
        (", ".join(p.label() for p in pools) or "none")
    limit = limit_words(config.native_threads, pools, result.native_limit_held)
    text = f"native thread pools per worker: {found}; {limit}"
    sides = {}
    for trial in result.trials:
        if trial.ok and trial.config.num_workers == config.num_workers and trial.config.threads == config.threads \
                and trial.config.prefetch_factor == config.prefetch_factor and \
                trial.config.pin_memory == config.pin_memory:
            sides[trial.config.native_threads is None] = trial.samples_per_s
    if len(sides) == 2:
        text += f" (measured without a limit: {rate(sides[True])} samples/s, with it: {rate(sides[False])})"
    return text


def _budget_words(result: TuneResult) -> Optional[str]:
    """The memory budget the search kept to, and the chosen configuration's footprint in it."""
    if result.memory_budget_bytes is None:
        return None
    chosen = next((t for t in result.trials if _is_chosen(t, result)), None)
    used = chosen.footprint_bytes if chosen is not None else None
    return (f"memory budget {result.memory_budget_from or mib(result.memory_budget_bytes)}; the chosen configuration "
            f"takes {UNKNOWN if used is None else mib(used)} of it")


def format_tune_result(result: TuneResult) -> str:
    """The chosen configuration, its rate, bottleneck and source, then one row per trial (the chosen one marked
    ``*``); a cached or fallback result without trials says so instead of a table."""
    lines = [f"Chosen: {config_kwargs(result)}",
             f"  {rate(result.samples_per_s)} samples/s; bottleneck: {bottleneck_words(result.bottleneck)}",
             f"  {_source_words(result)}"]
    if result.consumer_samples_per_s:
        lines.append(f"  the training step alone takes {rate(result.consumer_samples_per_s)} samples/s")
    disk = disk_words(result.disk_ceiling_samples_per_s, result.read_bytes_per_sample, result.samples_per_s)
    if disk is not None:
        lines.append(f"  {disk}")
    if result.reason and result.source not in ("fallback", "pending") and not (result.source == "online"
                                                                                 and not result.trials):
        lines.append(f"  why: {result.reason}")
    for words in (_budget_words(result), native_words(result), load_words([t.other_cpus for t in result.trials])):
        if words is not None:
            lines.append(f"  {words}")
    if not result.trials:
        lines.append("  (no trials recorded)")
        return "\n".join(lines)
    rates = [t.samples_per_s for t in result.trials if t.ok and t.samples_per_s is not None]  # ok: measured
    best = max(rates) if rates else None
    marked = False
    rows = []
    threads = any(t.config.threads > 1 for t in result.trials)
    native = any(t.config.num_workers > 0 for t in result.trials)
    memory = any(t.ok and t.config.num_workers and t.worker_memory_bytes is not None for t in result.trials)
    footprint = any(t.footprint_bytes is not None for t in result.trials)
    for trial in result.trials:
        chosen = not marked and _is_chosen(trial, result)
        marked = marked or chosen
        rows.append(trial_row(trial, best, chosen, threads=threads, native=native, memory=memory,
                               footprint=footprint))
    headers = ["", "workers", *(["threads"] if threads else []), "prefetch", "pin", *(["native"] if native else []),
               "samples/s", "vs best",
               "startup s", "stall %", "worker CPU %", *(["worker MiB"] if memory else []),
               *(["footprint MiB"] if footprint else []), "status"]
    lines.append("")
    lines += ["  " + line for line in grid(headers, rows, left=(0, len(headers) - 1))]
    return "\n".join(lines)
