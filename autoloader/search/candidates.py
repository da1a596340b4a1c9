"""What a search asks a driver to measure (``Candidate``), what it gets back (``Outcome``, made identical on every rank
of a node by ``Coordinator.outcome``), and the budget rules both trials and online tuning follow. No measuring here:
``measure/`` does that, ``search.py`` decides.

# NOTE [ Candidate time limit ]
# A candidate's soft limit (``limit_s``) must cover its start-up, its start-up burst and its window (NOTE [ Trial
# timing ] in measure/run.py). The window's share is ``trial_limit`` (a fifth of the budget, 1.5-8 s); the start-up
# grows with the workers: ``predict_start`` is the workers forked one after the other (``StartCosts.worker_s`` each,
# measured as a worker candidate's start-up less one batch, over its workers; ``PRIOR_WORKER_START_S`` before one ran)
# plus the burst (``LoaderConfig.burst_batches``) at the serial candidate's cost per batch: each worker makes its share
# one batch after the other, and all of them share the usable CPUs. On the H200 a 32-worker candidate of 0.33 s batches
# took 2.7 s to start, and with a flat 3 s limit it "failed: only 1 batch". The limit is ``trial_limit`` + that
# prediction. The budget still holds: a candidate whose predicted start-up and least window (``MIN_LIMIT_S``) do not
# fit in what is left of it is not started, and is recorded as skipped with the budget named (``admit``: recorded, so
# that the search proposes another); one that fits is started with its window's share cut to what is left, as before.
# So when the budget (``make_loader``'s ``budget=``, default 30 s) runs out, the best found so far is chosen at most
# one candidate's limit later. The hard limit is ``SIGALRM`` (measure/run.py): from a thread other than the main one,
# or under a ``SIGALRM`` handler of the user's, a blocking ``num_workers=0`` trial cannot be cut. Online tuning has no
# limit of its own: a dataset that blocks, blocks the user's loop.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Mapping, Optional, Sequence, TypeVar, Union

import torch

from ..config import LoaderConfig, default_pin, make_config
from ..errors import TuningError
from ..results import TrialResult, TuneResult
from .memory import MemoryCheck

DEFAULT_BUDGET_S = 30.0
PRIOR_WORKER_START_S = 0.1
"""Seconds to start one worker before a worker candidate measured it (fork copies this process's page tables; the
worker then sets itself up): measured 0.02-0.045 s on a 2-core VM (a 220-380 MiB process), 0.084 s on an H200 host (a
CUDA process: 32 workers took 2.7 s)."""
MIN_LIMIT_S = 1.0
"""The least a started candidate's window gets, however little of the budget is left (NOTE [ Candidate time limit ])."""
Progress = Callable[[TrialResult, float, float], None]
"""Called after every trial with (the trial, seconds elapsed, the budget)."""


@dataclass(frozen=True)
class Candidate:
    """What the search asks to have measured next: a configuration, the soft time limit of its measurement (NOTE
    [ Candidate time limit ]), whether to time the consumer step alone too (the first, serial candidate), and the
    memory check its workers face at their first batch (a ``memory.MemoryCheck``; None: nothing to check). Online
    only: ``probe``, the first batches' costs are all it needs (NOTE [ Online convergence ] in online_policy.py);
    ``gain``, the share by which it is predicted to beat the best measured so far (whether switching to it repays
    itself: ``switching.repays``)."""

    config: LoaderConfig
    limit_s: float
    first: bool = False
    memory: Optional[MemoryCheck] = None
    probe: bool = False
    gain: float = 0.0


@dataclass(frozen=True)
class StartCosts:
    """What starting a candidate costs, as measured so far (None: not yet): one worker's start (``worker_s``), and a
    batch made by one process, wall and CPU seconds (the serial candidate's)."""

    worker_s: Optional[float] = None
    batch_s: Optional[float] = None
    batch_cpu_s: Optional[float] = None


def start_costs(trials: Sequence[TrialResult]) -> StartCosts:
    """The costs the ``trials`` measured: a batch from the serial one (``fetch_s_per_batch``, its CPU), and one
    worker's start from every worker candidate that got a batch: its start-up less one batch, over its workers (the
    largest: forks are serial, so it is what the next one pays per worker). Pure."""
    serial = next((t for t in trials if t.ok and t.config.num_workers == 0 and t.fetch_s_per_batch), None)
    batch_s = serial.fetch_s_per_batch if serial is not None else None
    per_worker = [max(0.0, t.startup_s - (batch_s or 0.0)) / t.config.num_workers
                  for t in trials if t.config.num_workers > 0 and t.startup_s is not None]
    return StartCosts(max(per_worker, default=None), batch_s, serial.fetch_cpu_s_per_batch if serial else None)


def predict_start(config: LoaderConfig, costs: StartCosts, *, usable_cpus: int) -> float:
    """Seconds from starting ``config`` to the end of its start-up burst: its workers forked one after the other, then
    the burst (``LoaderConfig.burst_batches``), each worker making its share one batch after the other while all of
    them share ``usable_cpus`` (NOTE [ Candidate time limit ]). 0 without workers. Pure."""
    n = config.num_workers
    if n == 0:
        return 0.0
    worker_s = PRIOR_WORKER_START_S if costs.worker_s is None else costs.worker_s
    burst = config.burst_batches()
    by_worker = math.ceil(burst / n) * (costs.batch_s or 0.0)
    by_cpu = burst * (costs.batch_cpu_s or 0.0) / max(1, usable_cpus)
    return n * worker_s + max(by_worker, by_cpu)


def admit(config: LoaderConfig, *, window_limit_s: float, left_s: float, costs: StartCosts, usable_cpus: int,
          budget_s: float, forced: bool = False) -> Union[float, str]:
    """The soft limit to measure ``config`` with: ``window_limit_s`` (``trial_limit``) plus its predicted start-up
    (``predict_start``). With ``left_s`` of the budget left, the window's share is cut to what is left, never below
    ``MIN_LIMIT_S``; when even the start-up and that least share do not fit, why it is not started (a str naming the
    budget). ``forced`` (the first candidate, a control): the full limit. Pure (NOTE [ Candidate time limit ])."""
    start = predict_start(config, costs, usable_cpus=usable_cpus)
    if forced or math.isinf(left_s):
        return start + window_limit_s
    if start + MIN_LIMIT_S > left_s:
        what = f"{config.num_workers} workers" if config.num_workers else "the candidate"
        return (f"budget: {what} would take about {start + MIN_LIMIT_S:.1f} s to start and be measured ({start:.1f} "
                f"s to start them and make their first {config.burst_batches()} batches), and "
                f"{max(0.0, left_s):.1f} s of the budget of {budget_s:g} s are left; pass budget= (seconds) to "
                f"measure more")
    return start + max(MIN_LIMIT_S, min(window_limit_s, left_s - start))


Outcome = Union[TrialResult, TuningError]
"""What a driver sends back for a candidate: its measurement, or the ``TuningError`` that stopped it."""
T = TypeVar("T")
Steps = Generator[Candidate, Outcome, T]


def trial_limit(budget: Optional[float]) -> float:
    """Each candidate's soft wall-clock limit: a fifth of the budget, between 1.5 and 8 seconds."""
    return min(8.0, max(1.5, (DEFAULT_BUDGET_S if budget is None else budget) / 5.0))


def fallback_result(fixed: Mapping[str, Any], *, device: torch.device, reason: str, threads: int = 1,
                    native_threads: Optional[int] = None) -> TuneResult:
    """The safe configuration when tuning cannot run: the user's knobs (and ``threads``, when they fixed it), else no
    workers (nothing to go wrong); with workers, their native pools limited to ``native_threads``
    (``native_policy.limit_for``)."""
    n = int(fixed.get("num_workers", 0))
    config = make_config(n, fixed=fixed, pin_memory=default_pin(fixed, device.type), threads=threads,
                         native_threads=native_threads if n > 0 else None)
    return TuneResult(config, None, None, "fallback", reason=reason, created=time.time())
