"""Whether each worker's native thread pools are limited, and to what, as pure functions of measurements (what the
limit does: NOTE [ Native thread pools ] in loader/native.py; ``native_search.py`` measures what these ask for).

The rule: every configuration with workers is limited to each worker's share of the CPUs (``share``), unless the user
chose (``native_threads=N`` or ``False``). When the serial trial ran native threads (its loading CPU time above its
wall time) and the limit changes a pool of the chosen configuration's workers, that configuration is measured without
the limit too, and the limit is kept only when measured at least as fast (``keep_limit``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..config import LoaderConfig
from ..probe._pools import NativePool
from ..results import TrialResult

__all__ = ["NATIVE_CPU_LEVEL", "decision_words", "fallback_limit", "keep_limit", "limit_changes", "limit_for",
           "native_in_use", "pair", "share", "without_losers", "worth_comparing"]

Setting = Union[None, bool, int]
"""``make_loader(native_threads=)`` as ``_validate.check_native_threads`` returns it."""

NATIVE_CPU_LEVEL = 1.2
"""A serial trial whose loading took this much more CPU time than wall time ran native threads: one thread cannot pass
1.0, and the margin covers the process's other threads (the prefetcher, garbage collection), which are no pool."""


def share(usable_cpus: int, num_workers: int) -> Optional[int]:
    """The default limit: each worker's share of the usable CPUs less one for the main process,
    ``max(1, (usable - 1) // workers)``; None without workers.

    The main process is busy the whole time workers are (it runs the training step and receives, collates and pins
    every batch), so its CPU is not the workers' to share: the workers' pools and the main process then hold no more
    threads than there are CPUs, the rule torch keeps for its own pool in workers (1 thread) and Lightning for the
    worker count (cores - 1). Few workers doing BLAS still use the other CPUs (1 worker on 8 CPUs keeps 7 threads,
    where a fixed 1 would leave 6 idle). Rounded down, never up, and at least 1. On this project's 2-CPU machine it is
    1 for any worker count: there, under load, numpy's OpenBLAS ran 256x256 matmuls 2-20x slower with 2 threads
    than with 1 (tests/benchmarks/results/native_threads.md), where ``usable // workers`` would have kept 2 threads for
    1 worker."""
    if num_workers <= 0:
        return None
    return max(1, (max(1, usable_cpus) - 1) // num_workers)


def limit_for(setting: Setting, *, usable_cpus: int, num_workers: int, limited: bool = True) -> Optional[int]:
    """A configuration's ``native_threads``: the user's int; None for ``False``, without workers, or when measured
    without the limit (``limited=False``, only when autoloader decides); else ``share``."""
    if num_workers <= 0 or setting is False:
        return None
    if isinstance(setting, int) and not isinstance(setting, bool):
        return int(setting)
    return share(usable_cpus, num_workers) if limited else None


def fallback_limit(request: Any, *, usable_cpus: int) -> Optional[int]:
    """``limit_for`` the workers a fallback keeps (the user's ``num_workers``, else none) of a ``Request`` (typed
    loosely: this module does not import it)."""
    return limit_for(request.native_threads, usable_cpus=usable_cpus,
                     num_workers=int(request.fixed.get("num_workers", 0)))


def native_in_use(serial: Optional[TrialResult], *, level: float = NATIVE_CPU_LEVEL) -> bool:
    """The serial trial's loading ran native threads: its CPU time per batch above ``level`` x its wall time."""
    if serial is None or not serial.ok or not serial.fetch_s_per_batch or serial.fetch_cpu_s_per_batch is None:
        return False
    return serial.fetch_cpu_s_per_batch > level * serial.fetch_s_per_batch


def limit_changes(pools: Optional[Sequence[NativePool]], limit: Optional[int]) -> bool:
    """The limit would change a pool: one was found above it, or the pools are unknown (None: no threadpoolctl)."""
    if limit is None:
        return False
    return pools is None or any(p.found > limit for p in pools)


def worth_comparing(serial: Optional[TrialResult], chosen: TrialResult, *, setting: Setting) -> bool:
    """Measure ``chosen`` without its limit too, by the figures every rank agrees on: autoloader decides (``setting``
    None), ``chosen`` has workers and a limit, and the serial trial ran native threads (``native_in_use``); then only
    if the limit changes a pool its workers found (``limit_changes``, rank-local: the search agrees on it). Without a
    serial trial (the user fixed ``num_workers``, or an online re-tune from the configuration in force) nothing says
    threads are in use: the limit stays, unmeasured."""
    return setting is None and chosen.ok and chosen.config.num_workers > 0 and \
        chosen.config.native_threads is not None and native_in_use(serial)


def keep_limit(limited: TrialResult, unlimited: TrialResult, *, tolerance: float) -> bool:
    """Keep the limit when it measured at least as fast as without it: within ``tolerance`` of the unlimited rate,
    the tie rule of every other choice (fewer threads win a tie, as fewer workers do), or when the unlimited one
    failed. Dropped when only the unlimited one measured a rate, or it is faster by more than the tolerance."""
    if not unlimited.ok:
        return True
    if not limited.ok:
        return False
    return (limited.samples_per_s or 0.0) >= (1.0 - tolerance) * (unlimited.samples_per_s or 0.0)


def without_losers(trials: Sequence[TrialResult], *, tolerance: float) -> List[TrialResult]:
    """``trials`` less the losing side of every configuration measured both with and without the limit
    (``keep_limit`` on the latest measurement of each side, ``pair``): what the selection chooses among."""
    def loses(trial: TrialResult) -> bool:
        measured = pair(trials, trial.config) if trial.config.num_workers > 0 else None
        if measured is None:
            return False
        return (trial.config.native_threads is None) == keep_limit(*measured, tolerance=tolerance)

    return [t for t in trials if not loses(t)]


def pair(trials: Sequence[TrialResult], config: LoaderConfig) -> Optional[Tuple[TrialResult, TrialResult]]:
    """The latest (limited, unlimited) measurements of ``config`` with and without its native limit; None unless
    both sides were measured."""
    base = dataclasses.replace(config, native_threads=None)
    sides: Dict[bool, TrialResult] = {}
    for trial in trials:
        if trial.config.num_workers > 0 and dataclasses.replace(trial.config, native_threads=None) == base:
            sides[trial.config.native_threads is None] = trial
    return (sides[False], sides[True]) if len(sides) == 2 else None


def decision_words(trials: Sequence[TrialResult], config: LoaderConfig, *, tolerance: float) -> Optional[str]:
    """Why ``config`` keeps (or drops) its native limit, when it was measured both ways; None otherwise."""
    measured = pair(trials, config)
    if measured is None:
        return None
    limited, unlimited = measured
    if keep_limit(limited, unlimited, tolerance=tolerance):
        if limited.native_limit_held is False:  # never claim a limit its workers were not seen held to
            return (f"native pools: a limit of {limited.config.native_threads} thread(s) per worker kept, measured at "
                    f"least as fast as without (within {tolerance:.0%}), but not seen applied to every pool")
        return (f"native pools limited to {limited.config.native_threads} thread(s) per worker: measured at least as "
                f"fast as without (within {tolerance:.0%})")
    return f"native pools not limited: faster without than limited to {limited.config.native_threads} per worker"
