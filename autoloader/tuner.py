"""Which candidates to try, in what order, within what budget; the result of tuning.

The search is model-guided (see ``policy.py`` for each decision): one serial trial (``num_workers=0``) measures what a
batch costs to load (wall and CPU time) and what the consumer costs; a first worker trial measures what one worker
delivers and how busy it keeps a CPU; from these the worker count that meets the consumer or fills the CPUs is
predicted and tried, and a few more trials climb or descend only while it pays. An exhaustive sweep is a benchmark
baseline, never the method.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import numpy as np
import psutil
import torch

from . import policy
from .errors import TuningError, warn_user
from ._consumer import Consumer, Step
from .results import LoaderConfig, TrialResult, TuneResult
from ._validate import check_dataset, check_loader_kwargs, check_tuning_arguments
from .prefetch import resolve_device
from .probe import MachineProfile, open_files_limit, probe_machine
from .trial import run_trial

log = logging.getLogger("autoloader.tuner")

DEFAULT_BUDGET_S = 30.0
TUNED_KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
Progress = Callable[[TrialResult, float, float], None]


class Agreement(Protocol):
    """How several processes agree on one decision (see ``distributed.py``); one process agrees with itself."""

    def reduce_min(self, values: Sequence[float]) -> List[float]:
        ...


class _Alone:
    def reduce_min(self, values: Sequence[float]) -> List[float]:
        return list(values)


def trial_limit(budget: Optional[float]) -> float:
    """Each trial's soft wall-clock limit: a fifth of the budget, between 1.5 and 8 seconds."""
    return min(8.0, max(1.5, (DEFAULT_BUDGET_S if budget is None else budget) / 5.0))


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Trials draw from the global RNGs (worker seeds, augmentations); put them back so tuning is invisible."""
    torch_state = torch.random.get_rng_state()
    py_state = random.getstate()
    np_state = np.random.get_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(py_state)
        np.random.set_state(np_state)


# Fields a decision reads that ranks must agree on, each the largest cost (the rate is agreed as the slowest).
_AGREED_MAX = ("fetch_s_per_batch", "fetch_cpu_s_per_batch", "consumer_s_per_batch", "worker_cpu_util",
               "main_cpu_util", "stall_fraction", "worker_uss_bytes", "worker_uss_growth_bytes", "worker_rss_bytes",
               "batch_bytes")


class _Search:
    def __init__(self, *, dataset: Any, batch_size: int, consumer: Consumer, shuffle: bool,
                 loader_kwargs: Mapping[str, Any], fixed: Mapping[str, Any], transform: Mapping[str, Any],
                 budget: float, cap: int, usable_cpus: int, memory_budget: Optional[int],
                 shm_free: Optional[int], tolerance: float, agreement: Agreement,
                 progress: Optional[Progress]) -> None:
        self.dataset, self.batch_size, self.consumer = dataset, batch_size, consumer
        self.shuffle, self.loader_kwargs, self.fixed = shuffle, loader_kwargs, fixed
        self.transform = transform
        self.budget, self.cap, self.usable = budget, cap, usable_cpus
        self.memory_budget, self.shm_free = memory_budget, shm_free
        self.tolerance, self.agreement, self.progress = tolerance, agreement, progress
        self.trial_limit = trial_limit(budget)
        self.started = time.monotonic()
        self.trials: List[TrialResult] = []
        self.by_config: Dict[LoaderConfig, TrialResult] = {}
        self.memory_limited = False
        self.batch_bytes: Optional[int] = None
        self.per_worker_bytes: Optional[int] = None
        self.pin = bool(fixed.get("pin_memory", consumer.device.type == "cuda"))
        self.prefetch = int(fixed.get("prefetch_factor") or 2)

    # -- budget -------------------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return -self.agreement.reduce_min([-(time.monotonic() - self.started)])[0]

    def config(self, n: int, prefetch: Optional[int] = None, pin: Optional[bool] = None) -> LoaderConfig:
        return LoaderConfig(n, (prefetch or self.prefetch) if n else None, self.pin if pin is None else pin, False)

    # -- one candidate ------------------------------------------------------------------------------------------
    def guard(self, config: LoaderConfig) -> Optional[str]:
        return policy.memory_guard(config.num_workers, per_worker_bytes=self.per_worker_estimate(),
                                   budget_bytes=self.memory_budget) or \
            policy.shm_guard(config.num_workers, config.prefetch_factor, batch_bytes=self.batch_bytes,
                             shm_free_bytes=self.shm_free)

    def per_worker_estimate(self) -> Optional[int]:
        """Measured worker USS (plus its growth) once a worker trial ran; before that the main process's RSS, which
        a forked worker starts out sharing (an upper bound)."""
        if self.per_worker_bytes is not None:
            return self.per_worker_bytes
        return -int(self.agreement.reduce_min([-float(psutil.Process().memory_info().rss)])[0])

    def run(self, config: LoaderConfig, *, first: bool = False) -> Optional[TrialResult]:
        """Run (or skip with a reason) one candidate; None when it yields no rate."""
        if config in self.by_config:
            return self.by_config[config] if self.by_config[config].ok else None
        elapsed = self.elapsed()
        if not first and elapsed >= self.budget:
            return None
        reason = self.guard(config)
        if reason is not None:
            self.memory_limited = True
            trial = TrialResult(config=config, status="skipped", reason=reason)
        else:
            limit = self.trial_limit if first else max(1.0, min(self.trial_limit, self.budget - elapsed))
            broken: Optional[TuningError] = None
            try:
                trial = run_trial(self.dataset, self.batch_size, config, consumer=self.consumer,
                                  shuffle=self.shuffle, loader_kwargs=self.loader_kwargs, time_limit=limit,
                                  measure_consumer=first, **self.transform)
            except TuningError as err:
                broken = err
            if not isinstance(self.agreement, _Alone) and self.agreement.reduce_min([0.0 if broken else 1.0])[0] == 0:
                raise broken or TuningError("autoloader failed on another rank")
            if broken is not None:
                raise broken
            trial = self.agree(trial)
        self.trials.append(trial)
        self.by_config[config] = trial
        if trial.batch_bytes is not None and self.batch_bytes is None:
            self.batch_bytes = trial.batch_bytes
        self.per_worker_bytes = policy.per_worker_bytes(self.trials)
        elapsed = self.elapsed()
        log.info("trial %-26s %-24s %5.1f s of %.0f s budget", config.label(),
                 f"{trial.samples_per_s:,.0f} samples/s" if trial.ok else f"{trial.status}: {trial.reason}",
                 elapsed, self.budget)
        if self.progress is not None:
            self.progress(trial, elapsed, self.budget)
        return trial if trial.ok else None

    def agree(self, trial: TrialResult) -> TrialResult:
        """Make every decision-relevant figure identical on all ranks (see Agreement)."""
        if isinstance(self.agreement, _Alone):
            return trial
        values = [-1.0 if not trial.ok else float(trial.samples_per_s)]
        for name in _AGREED_MAX:
            value = getattr(trial, name)
            values.append(math.inf if value is None else -float(value))
        agreed = self.agreement.reduce_min(values)
        update: Dict[str, Any] = {}
        for name, value in zip(_AGREED_MAX, agreed[1:]):
            if math.isinf(value):
                update[name] = None
            else:
                update[name] = int(-value) if name.endswith("bytes") else -value
        if agreed[0] < 0:
            update.update(samples_per_s=None, status="failed",
                          reason=trial.reason if not trial.ok else "failed on another rank")
        else:
            update["samples_per_s"] = agreed[0]
        return dataclasses.replace(trial, **update)

    # -- the search ---------------------------------------------------------------------------------------------
    def rates(self) -> Dict[int, Optional[float]]:
        return {c.num_workers: t.samples_per_s for c, t in self.by_config.items()
                if c.prefetch_factor in (None, self.prefetch) and c.pin_memory == self.pin}

    def search_workers(self, serial: Optional[TrialResult], consumer_s: float) -> None:
        consumer_rate = self.batch_size / consumer_s if consumer_s > 0 else None
        if serial is not None and consumer_rate and serial.samples_per_s >= (1 - self.tolerance) * consumer_rate:
            return
        if serial is not None:
            first = policy.predict_from_serial(fetch_s=serial.fetch_s_per_batch or 0.0,
                                               fetch_cpu_s=serial.fetch_cpu_s_per_batch or 0.0,
                                               consumer_s=consumer_s, usable_cpus=self.usable, cap=self.cap)
        else:
            first = min(self.usable, self.cap)
        if first < 1:
            return
        trial = self.run(self.config(first))
        if trial is not None:
            second = policy.predict_from_workers(trial, batch_size=self.batch_size, consumer_s=consumer_s,
                                                 usable_cpus=self.usable, cap=self.cap)
            if second is not None and second != first:
                self.run(self.config(second))
        while self.elapsed() < self.budget:
            proposal = policy.next_worker_count(self.rates(), cap=self.cap, tolerance=self.tolerance)
            if proposal is None:
                return
            self.run(self.config(proposal))

    def tune(self) -> TuneResult:
        fixed_n = self.fixed.get("num_workers")
        if fixed_n is not None:
            serial = self.run(self.config(fixed_n), first=True)
            consumer_s = serial.consumer_s_per_batch if serial is not None else 0.0
        else:
            serial = self.run(self.config(0), first=True)
            consumer_s = (serial.consumer_s_per_batch or 0.0) if serial is not None else 0.0
            if self.cap > 0:
                self.search_workers(serial, consumer_s)
        consumer_rate = self.batch_size / consumer_s if consumer_s else None
        chosen = policy.select(self.trials, tolerance=self.tolerance)
        if chosen is not None and "prefetch_factor" not in self.fixed and \
                policy.worth_more_prefetch(chosen, consumer_samples_per_s=consumer_rate):
            self.run(self.config(chosen.config.num_workers, prefetch=2 * self.prefetch))
        if chosen is not None and self.consumer.device.type == "cuda" and "pin_memory" not in self.fixed:
            self.run(self.config(chosen.config.num_workers, chosen.config.prefetch_factor, pin=not self.pin))
        return self.result(policy.select(self.trials, tolerance=self.tolerance), consumer_rate)

    def result(self, chosen: Optional[TrialResult], consumer_rate: Optional[float]) -> TuneResult:
        seconds = time.monotonic() - self.started
        worker_failures = [t for t in self.trials if t.status == "failed" and t.config.num_workers > 0]
        if chosen is None:
            reasons = "; ".join(sorted({t.reason or t.status for t in self.trials})) or "no trial ran"
            fallback = fallback_result(self.fixed, device=self.consumer.device,
                                       reason=f"no trial measured a rate: {reasons}")
            warn_user(f"autoloader could not measure any configuration ({reasons}); using "
                      f"num_workers={fallback.num_workers}")
            return dataclasses.replace(fallback, trials=tuple(self.trials), consumer_samples_per_s=consumer_rate,
                                       seconds=seconds)
        n = chosen.config.num_workers
        if n == 0 and worker_failures and not any(t.ok and t.config.num_workers for t in self.trials):
            warn_user(f"every worker count failed ({worker_failures[0].reason}); using num_workers=0")
        persistent = self.fixed.get("persistent_workers")
        if persistent is None:
            persistent = policy.keep_workers_alive(n, per_worker_bytes=self.per_worker_bytes,
                                                   budget_bytes=self.memory_budget)
        neck = policy.bottleneck(chosen, self.trials, consumer_samples_per_s=consumer_rate,
                                 usable_cpus=self.usable, memory_limited=self.memory_limited)
        best = max(t.samples_per_s for t in self.trials if t.ok)
        why = (f"fewest workers within {self.tolerance:.0%} of the best measured rate ({best:,.0f} samples/s) "
               f"in {len(self.trials)} trials")
        return TuneResult(n, chosen.config.prefetch_factor, chosen.config.pin_memory, bool(persistent and n > 0),
                          chosen.samples_per_s, neck, "tuned", tuple(self.trials), consumer_rate, seconds, why,
                          created=time.time())


def fallback_result(fixed: Mapping[str, Any], *, device: torch.device, reason: str) -> TuneResult:
    """The safe configuration when tuning cannot run: the user's knobs, else no workers (nothing to go wrong)."""
    n = int(fixed.get("num_workers", 0))
    prefetch = fixed.get("prefetch_factor", 2) if n else None
    return TuneResult(n, prefetch, bool(fixed.get("pin_memory", device.type == "cuda")),
                      bool(fixed.get("persistent_workers", False)) and n > 0, None, None, "fallback",
                      reason=reason, created=time.time())


def tune(
    dataset: Any,
    batch_size: int = 1,
    *,
    step: Step = None,
    device: Union[str, torch.device, None] = None,
    shuffle: bool = False,
    normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
    dtype: Optional[torch.dtype] = None,
    input_key: Any = None,
    budget: Optional[float] = None,
    max_workers: Optional[int] = None,
    **dataloader_kwargs: Any,
) -> TuneResult:
    """Find the DataLoader configuration that feeds ``step`` fastest with the fewest workers, as ``make_loader``
    would, without building the loader or touching the cache.

    Takes ``make_loader``'s arguments: every other keyword goes to each trial's ``DataLoader`` unchanged, and a
    ``num_workers``, ``prefetch_factor``, ``pin_memory`` or ``persistent_workers`` given explicitly is never tuned.
    ``budget`` is in seconds (default 30); the result is the best found when it runs out, at most one trial's limit
    later. The global RNG states are left as they were. Raises ``TuningError`` when autoloader itself fails.
    """
    check_tuning_arguments(batch_size=batch_size, step=step, budget=budget, max_workers=max_workers)
    check_dataset(dataset)
    check_loader_kwargs(dataset, batch_size=batch_size, shuffle=shuffle, kwargs=dataloader_kwargs)
    kwargs = dict(dataloader_kwargs)
    fixed = {k: kwargs.pop(k) for k in TUNED_KNOBS if k in kwargs}
    return tune_with(dataset, batch_size, step=step, device=resolve_device(device), shuffle=shuffle,
                     normalize=normalize, dtype=dtype, input_key=input_key, budget=budget, max_workers=max_workers,
                     loader_kwargs=kwargs, fixed=fixed)


def tune_with(
    dataset: Any,
    batch_size: int,
    *,
    step: Step,
    device: torch.device,
    shuffle: bool,
    normalize: Any,
    dtype: Optional[torch.dtype],
    input_key: Any,
    budget: Optional[float],
    max_workers: Optional[int],
    loader_kwargs: Mapping[str, Any],
    fixed: Mapping[str, Any],
    profile: Optional[MachineProfile] = None,
    agreement: Optional[Agreement] = None,
    progress: Optional[Progress] = None,
    tolerance: float = policy.DEFAULT_TOLERANCE,
) -> TuneResult:
    """``tune`` with its plumbing, for ``make_loader`` and the CLI: arguments already checked, the knobs the user
    ``fixed`` apart from the other ``loader_kwargs``, the machine ``profile`` (probed when None), how ranks agree,
    and a ``progress`` callback per trial."""
    unknown = set(fixed) - set(TUNED_KNOBS)
    if unknown:
        raise ValueError(f"fixed may only hold {TUNED_KNOBS}, got {sorted(unknown)}")
    budget = DEFAULT_BUDGET_S if budget is None else float(budget)
    profile = profile if profile is not None else probe_machine(disk=False, gpus=False)
    usable = profile.cpu.usable or profile.cpu.logical or 1
    nofile = open_files_limit()[0]
    cap = policy.default_max_workers(usable_cpus=usable, nofile=nofile)
    bound_by_nofile = cap < policy.default_max_workers(usable_cpus=usable, nofile=None)
    if max_workers is not None:
        cap, bound_by_nofile = max_workers, False
    search = _Search(dataset=dataset, batch_size=batch_size, consumer=Consumer(step, device), shuffle=shuffle,
                     loader_kwargs=dict(loader_kwargs), fixed=dict(fixed),
                     transform=dict(normalize=normalize, dtype=dtype, input_key=input_key),
                     budget=budget, cap=cap, usable_cpus=usable, memory_budget=profile.memory.budget_bytes,
                     shm_free=profile.shm.free_bytes, tolerance=tolerance, agreement=agreement or _Alone(),
                     progress=progress)
    with preserved_rng():
        result = search.tune()
    if bound_by_nofile and cap > 0 and result.num_workers >= cap:
        warn_user(f"num_workers={cap} is the most the open-files limit allows (`ulimit -n` is {nofile}; each worker "
                  f"needs about 32 descriptors) and more workers might load faster: raise it, e.g. `ulimit -n 4096` "
                  f"in the shell that starts training (LimitNOFILE= for a systemd service)")
    log.info("tuned %s in %.1f s: %s", type(dataset).__name__, result.seconds, result.config.label())
    return result
