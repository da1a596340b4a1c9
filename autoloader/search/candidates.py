"""What a search asks a driver to measure (``Candidate``), what it gets back (``Outcome``, made identical on every rank
of a node by ``Coordinator.outcome``), and the budget rules both trials and online tuning follow. No measuring here:
``measure/`` does that, ``search.py`` decides."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Mapping, Optional, TypeVar, Union

import torch

from ..config import LoaderConfig, default_pin, make_config
from ..errors import TuningError
from ..results import TrialResult, TuneResult

DEFAULT_BUDGET_S = 30.0
Progress = Callable[[TrialResult, float, float], None]
"""Called after every trial with (the trial, seconds elapsed, the budget)."""


@dataclass(frozen=True)
class Candidate:
    """What the search asks to have measured next: a configuration, the soft time limit of its measurement, and
    whether to time the consumer step alone too (the first, serial candidate). Online only: ``probe``, the first
    batches' costs are all it needs (NOTE [ Online convergence ] in online_policy.py); ``gain``, the share by which it
    is predicted to beat the best measured so far (whether switching to it repays itself: ``online_policy.repays``)."""

    config: LoaderConfig
    limit_s: float
    first: bool = False
    probe: bool = False
    gain: float = 0.0


Outcome = Union[TrialResult, TuningError]
"""What a driver sends back for a candidate: its measurement, or the ``TuningError`` that stopped it."""
T = TypeVar("T")
Steps = Generator[Candidate, Outcome, T]


def trial_limit(budget: Any) -> float:
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
