"""Which candidates to try, in what order, within what budget, and which one to choose.

The search is model-guided (each decision a pure function: ``policy.py``, ``threads_policy.py``, ``memory.py`` for
memory, ``verdict.py`` for what the result reports): one serial candidate (``num_workers=0``) measures
what a batch costs to load (wall and CPU time) and what the consumer costs; a first worker candidate measures what one
worker delivers and how busy it keeps a CPU; from these the worker count that meets the consumer or fills the CPUs is
predicted and tried, and a few more candidates climb or descend only while it pays. With ``threads=True`` and a
serial candidate that mostly waits, (processes, threads) candidates come first and the process-only climb is their
fallback; otherwise a few follow the process-only search (``thread_search.py``). An exhaustive sweep is a benchmark
baseline, never the method. The search measures nothing itself: a driver measures each candidate it yields (see
``Search``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..config import LoaderConfig, make_config
from ..coordination import Coordinator
from ..errors import TuningError, warn_user
from ..probe import MachineProfile, private_bytes
from ..request import Request
from .._text import mib
from ..results import TrialResult, TuneResult
from . import memory, native_policy, online_policy, policy, thread_bounds, threads_policy, verdict
from .bounds import worker_bounds
from .memory import MemoryCheck, budget_guard, footprint, forecast_guard, measured_batch_bytes, trial_footprint
from .memory import per_worker_bytes as worker_size
from .candidates import Candidate, Progress, Steps, admit, start_costs, trial_limit
from .settings import Findings, Settings
from .native_search import compare_native
from .thread_search import search_threads, search_threads_first

log = logging.getLogger("autoloader.tuner")

THREADS_SHARE_AT = 0.6
"""With ``threads=True`` and a finite budget, the first part of the search (threads first, or the process-only
search) starts no candidate past this share of it: the rest is for the other part (see ``thread_search.py``)."""

class Search:
    """The model-guided search (see the module docstring). ``steps()`` is a generator: it yields the next
    ``Candidate``, is sent back its ``Outcome``, and returns the ``TuneResult``. Trials (``tuning/trials.py``) and
    online tuning (``tuning/online.py``) drive it the same way; only how a candidate is measured differs."""

    def __init__(self, request: Request, profile: MachineProfile, *, budget: float,
                 coordinator: Optional[Coordinator] = None, progress: Optional[Progress] = None,
                 start: Optional[LoaderConfig] = None, descend: bool = False,
                 known: Sequence[TrialResult] = ()) -> None:
        """The search for ``request`` on the machine ``profile`` describes, within ``budget`` seconds (``math.inf``
        online); ``start``: search near this configuration (the one in force) instead of from the serial one;
        ``descend``: from ``start``, try only fewer workers (``policy.next_count_down``); ``known``: what the search
        that chose ``start`` measured. ``coordinator``: how the ranks of the node agree on each outcome
        (``Coordinator.outcome``)."""
        bounds = worker_bounds(profile, max_workers=request.max_workers, dataset=request.dataset)
        self.settings = Settings.of(request, profile, bounds=bounds, budget=budget, trial_limit=trial_limit(budget),
                                    tolerance=policy.DEFAULT_TOLERANCE, start=start, descend=descend)
        self.found = Findings()
        self.known = tuple(t for t in known if t.config.num_workers)
        """What the search that made the configuration in force measured of its workers (a re-tune's ``start``):
        their size and copying guard this search's candidates until its own measure them."""
        self.found.per_worker_bytes = worker_size(self.known)
        self.found.batch_bytes = measured_batch_bytes(known)
        self.coordinator = coordinator or Coordinator()
        self.progress = progress
        self.started = time.monotonic()
        self.clock = 0.0
        """The search's seconds as of the last outcome, agreed by every rank (its budget reads it)."""
        self.main_private: Optional[int] = None
        """The largest main process's private memory as of the last outcome (agreed, ``probe.private_bytes``): the
        most one worker could copy, its size until one is measured; None before the first outcome (read then)."""
        self.stop_at = budget
        """Seconds after which no candidate starts: the budget, less a share kept for thread candidates."""
        self.limited = start is None or start.num_workers == 0 or start.native_threads is not None
        """Candidates limit their workers' native pools, unless the configuration in force searched from does not."""

    # -- budget -------------------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        """The search's clock: every rank's seconds as of the last outcome (``Coordinator.outcome``): one budget."""
        return self.clock

    def config(self, n: int, prefetch: Optional[int] = None, pin: Optional[bool] = None,
               threads: Optional[int] = None, limited: Optional[bool] = None) -> LoaderConfig:
        """A candidate with ``n`` workers; ``limited``: their native pools limited (``native_policy.limit_for``;
        None: as ``self.limited``)."""
        return make_config(n, fixed=self.settings.fixed, prefetch_factor=prefetch or self.settings.prefetch,
                           pin_memory=self.settings.pin if pin is None else pin, persistent_workers=False,
                           threads=self.settings.threads if threads is None else threads,
                           native_threads=self.native_limit(n, limited))

    def native_limit(self, n: int, limited: Optional[bool] = None) -> Optional[int]:
        return native_policy.limit_for(self.settings.native_setting, usable_cpus=self.settings.usable, num_workers=n,
                                       limited=self.limited if limited is None else limited)

    # -- one candidate ------------------------------------------------------------------------------------------
    def guard(self, config: LoaderConfig, per_worker_bytes: Optional[int]) -> Optional[str]:
        """Why ``config`` would not fit in the memory budget or /dev/shm (``memory.budget_guard``), or by the end of
        an epoch, its workers copying as measured (``memory.forecast_guard``); None when it fits."""
        budget_bytes, batch_bytes = self.settings.memory_budget, self.found.batch_bytes
        return budget_guard(config, per_worker_bytes=per_worker_bytes, batch_bytes=batch_bytes,
                            budget_bytes=budget_bytes, shm_free_bytes=self.settings.shm_free) or \
            forecast_guard(config, trials=[*self.known, *self.found.trials], per_worker_bytes=per_worker_bytes,
                           batch_bytes=batch_bytes,
                           budget_bytes=budget_bytes, epoch_samples=self.settings.epoch_samples)

    def per_worker_estimate(self) -> Optional[int]:
        """One worker's memory for the checks before a candidate starts (``memory.per_worker_estimate``): as measured,
        else this process's private memory (agreed by the ranks at each outcome; before the first, this process's own
        when it is alone, else unknown)."""
        private = self.main_private
        if private is None and self.coordinator.size == 1:  # before the first outcome (ranks read theirs apart)
            private = private_bytes()
        return memory.per_worker_estimate(self.found.per_worker_bytes, main_private_bytes=private)

    def log_refusal(self, workers: int, fitting: int, *, unsized: bool = False, mode: str = "") -> None:
        """Log that the memory budget refused ``workers`` at the size known, and what starts instead: ``fitting``, or
        (``unsized``) one worker checked at its first batch."""
        instead = "one starts, checked at its first batch" if unsized else f"{fitting} do"
        log.info("%s%d workers would not fit the memory budget at %s each; %s", mode, workers,
                 mib(self.per_worker_estimate() or 0), instead)

    def most_that_fit(self, *, low: int, high: int) -> Optional[int]:
        """The most workers up to ``high`` that the memory budget admits (``guard``, at the size known: it grows with
        the count), ``high`` itself when it fits or is no more than ``low``; None when no count above ``low`` does."""
        estimate = self.per_worker_estimate()
        if high <= low or self.guard(self.config(high), estimate) is None:
            return high
        top, bottom = high, low  # top does not fit; bottom is measured (it fit)
        while top - bottom > 1:
            middle = (top + bottom) // 2
            if self.guard(self.config(middle), estimate) is None:
                bottom = middle
            else:
                top = middle
        return bottom if bottom > low else None

    def first_pool(self, n: int) -> Tuple[int, bool]:
        """(workers, unsized) of a search's first pool of up to ``n`` workers: the most that fit at the size known
        (``most_that_fit``); before any worker was measured and when not even one fits at this process's private
        size, one worker ``unsized`` (checked at its first batch: ``run``); (0, False) when none fits at a measured
        size. NOTE [ Memory budget ] in memory.py."""
        fitting = self.most_that_fit(low=0, high=n) if n > 0 else 0
        if fitting is None:
            return (1, True) if self.found.per_worker_bytes is None else (0, False)
        return fitting, False

    def fit_below_refusals(self) -> Steps[None]:
        """When a worker count the memory budget refused (stopped at its first batch, measured past the budget, or
        forecast past it by the epoch's end: ``refused``) was faster beyond the tolerance than every count measured
        that fits, measure the most workers that fit (``most_that_fit``, by the measured worker size and copy-on-read
        rate): the choice then falls back to what was measured to fit, never to no workers for want of a
        measurement (a 300,000-object list under 700 MiB measured 6-10 workers, all forecast past the budget, and
        served ``num_workers=0`` at 0.37x of the 3 workers that fit)."""
        refused = [n for n in self.refused() if n > 0]
        if not refused:
            return
        ceiling = min(refused)
        rates = self.rates()
        fitting = {n: r for n, r in rates.items() if r is not None and n < ceiling}
        refused_best = max((t.samples_per_s or 0.0 for c, t in self._counted() if c.num_workers in refused and t.ok),
                           default=0.0)
        if fitting and max(fitting.values()) * (1.0 + self.settings.tolerance) >= refused_best:
            return
        low = max((n for n in fitting if n > 0), default=0)
        workers = self.most_that_fit(low=low, high=ceiling - 1)
        if workers is not None and workers > low:
            log.info("%d workers are the most that fit the memory budget below the %d it refused", workers, ceiling)
            yield from self.run(self.config(workers))

    def memory_check(self, config: LoaderConfig) -> Optional[MemoryCheck]:
        """What ``config``'s workers are checked against at their first batch (``memory.memory_check``)."""
        return memory.memory_check(config, self.found.trials, budget_bytes=self.settings.memory_budget,
                                   main_private_bytes=self.main_private, batch_bytes=self.found.batch_bytes,
                                   explicit=self.settings.memory.source == "user" or self.settings.memory.user_fraction)

    def run(self, config: LoaderConfig, *, first: bool = False, again: bool = False, force: bool = False,
            probe: bool = False, gain: float = 0.0, unsized: bool = False) -> Steps[Optional[TrialResult]]:
        """Have one candidate measured (or skip it with a reason); None when it yields no rate. A candidate measured
        before is not measured again, unless ``again``; none starts past the budget, unless ``first`` or ``force``,
        and none whose predicted start-up and window do not fit in what is left (NOTE [ Candidate time limit ]).
        ``probe`` and ``gain``: see ``Candidate``. ``unsized``: before any worker was measured, its workers are not
        held to the conservative size (``per_worker_estimate``), only checked at their first batch: for the one
        worker a search starts when not even one fits at that size (NOTE [ Memory budget ])."""
        if config in self.found.by_config and not again and not self.refits(self.found.by_config[config]):
            return self.found.by_config[config] if self.found.by_config[config].ok else None
        elapsed = self.elapsed()
        if not (first or force) and elapsed >= self.stop_at:
            return None
        estimate = self.found.per_worker_bytes if unsized else self.per_worker_estimate()
        limit = self.guard(config, estimate) or admit(
            config, window_limit_s=self.settings.trial_limit, left_s=self.stop_at - elapsed,
            costs=start_costs(self.found.trials), usable_cpus=self.settings.usable, budget_s=self.settings.budget,
            forced=first or force)
        if isinstance(limit, str):  # why it is not started: memory, /dev/shm, or the time left
            predicted = footprint(config, per_worker_bytes=estimate, batch_bytes=self.found.batch_bytes)
            trial = TrialResult(config=config, status="skipped", reason=limit, footprint_bytes=predicted.total_bytes)
        else:
            outcome = yield Candidate(config, limit, first, self.memory_check(config), probe, gain)
            agreed = self.coordinator.outcome(outcome, elapsed_s=time.monotonic() - self.started,
                                              main_private_bytes=private_bytes())
            self.clock, self.main_private = agreed.elapsed_s, agreed.main_private_bytes
            if agreed.error is not None or agreed.trial is None:
                raise agreed.error or TuningError("autoloader failed on another rank")
            trial = online_policy.sustained(
                dataclasses.replace(agreed.trial, footprint_bytes=trial_footprint(agreed.trial)),
                serial=self.found.serial, usable_cpus=self.settings.usable)
        self.found.trials.append(trial)
        self.found.by_config[config] = trial
        if trial.batch_bytes is not None and self.found.batch_bytes is None:
            self.found.batch_bytes = trial.batch_bytes
        self.found.per_worker_bytes = memory.per_worker_bytes(self.found.trials) or self.found.per_worker_bytes
        elapsed = self.elapsed()
        online = not math.isfinite(self.settings.budget)
        log.info("%s %-34s %-24s %5.1f s%s", "candidate" if online else "trial", config.label(),
                 f"{trial.samples_per_s:,.0f} samples/s" if trial.ok else f"{trial.status}: {trial.reason}", elapsed,
                 " (online)" if online else f" of {self.settings.budget:.0f} s budget")
        if self.progress is not None:
            self.progress(trial, elapsed, self.settings.budget)
        return trial if trial.ok else None

    # -- the search ---------------------------------------------------------------------------------------------
    def refits(self, trial: TrialResult) -> bool:
        """A candidate skipped for memory while one worker's memory was only estimated (spawned workers: this
        process's RSS) that fits now that a worker was measured: no longer a ceiling, and measured when proposed
        again."""
        return memory.skipped_for_memory(trial) and self.found.per_worker_bytes is not None and \
            self.guard(trial.config, self.found.per_worker_bytes) is None

    def rates(self) -> Dict[int, Optional[float]]:
        """Each worker count's rate; None for one that failed, was skipped, or that the choice passes over for memory
        (``policy.over_budget``): a ceiling the search looks below."""
        return {c.num_workers: None if self._over_budget(t) else t.samples_per_s for c, t in self._counted()}

    def refused(self) -> List[int]:
        """Of ``rates``, the worker counts refused for memory, skipped or measured past the budget: ceilings the climb
        may go halfway to (``policy.next_worker_count``)."""
        return [c.num_workers for c, t in self._counted() if memory.skipped_for_memory(t) or self._over_budget(t)]

    def _counted(self) -> List[Tuple[LoaderConfig, TrialResult]]:
        settings = self.settings
        return [(c, t) for c, t in self.found.by_config.items()
                if c.threads == settings.threads and c.prefetch_factor in (None, settings.prefetch)
                and c.pin_memory == settings.pin and not self.refits(t)
                and c.native_threads == self.native_limit(c.num_workers)]

    def _over_budget(self, trial: TrialResult) -> bool:
        return policy.over_budget(trial, budget_bytes=self.settings.memory_budget,
                                  epoch_samples=self.settings.epoch_samples)

    def consumer(self, consumer_s: float) -> Optional[float]:
        """Note the consumer's measured seconds per batch: its own rate (``consumer_rate``), None when not measured."""
        self.found.consumer_rate = self.settings.batch_size / consumer_s if consumer_s > 0 else None
        return self.found.consumer_rate

    def search_workers(self, serial: Optional[TrialResult], consumer_s: float) -> Steps[None]:
        consumer_rate = self.consumer(consumer_s)
        self.found.ceiling = policy.rate_ceiling(serial, batch_size=self.settings.batch_size,
                                                 usable_cpus=self.settings.usable, consumer_samples_per_s=consumer_rate)
        first = policy.first_count(serial, consumer_samples_per_s=consumer_rate, consumer_s=consumer_s,
                                   usable_cpus=self.settings.usable, cap=self.settings.cap,
                                   tolerance=self.settings.tolerance)
        if first < 1:
            return
        fitting, unsized = self.first_pool(first)
        if fitting != first:
            self.log_refusal(first, fitting, unsized=unsized)
        if fitting < 1:
            return
        grow_to, first = first, fitting
        trial = yield from self.run(self.config(first), unsized=unsized)
        grown = self.most_that_fit(low=first, high=grow_to) if trial is not None and grow_to > first else None
        if grown is not None and grown > first:  # measured: the pool grows to what fits at the measured size
            trial = (yield from self.run(self.config(grown))) or trial
            first = grown
        if trial is not None:
            self.found.ceiling = policy.rate_ceiling(serial, batch_size=self.settings.batch_size,
                                                     usable_cpus=self.settings.usable,
                                                     consumer_samples_per_s=consumer_rate, pool=trial)
            serial_rate = threads_policy.rate(serial) if serial is not None and serial.ok else None
            second = policy.predict_from_workers(trial, batch_size=self.settings.batch_size, consumer_s=consumer_s,
                                                 usable_cpus=self.settings.usable, cap=self.settings.cap,
                                                 serial_samples_per_s=serial_rate, tolerance=self.settings.tolerance)
            if second is not None and second != first and second <= self.climb_cap():
                fits = self.most_that_fit(low=first, high=second)  # None: no count above the first pool fits
                if fits is not None and fits != second:
                    self.log_refusal(second, fits)
                if fits is not None:
                    yield from self.run(self.config(fits))
        yield from self.follow(policy.next_worker_count)
        skipped = self.found.by_config.get(self.config(first))
        if skipped is not None and self.refits(skipped):  # skipped on the RSS estimate; a measured worker fits it
            yield from self.run(self.config(first))
            yield from self.follow(policy.next_worker_count)

    def climb_cap(self) -> int:
        return policy.climb_cap(self.rates(), cap=self.settings.cap,
                                ceiling_samples_per_s=self.found.ceiling or self.found.consumer_rate,
                                tolerance=self.settings.tolerance)

    def follow(self, propose: Callable[..., Optional[int]]) -> Steps[None]:
        """Measure the worker counts ``propose`` names from the rates so far, until it names none or the budget is
        spent: ``policy.next_worker_count`` from the serial candidate, ``policy.next_count_near`` from the
        configuration in force (climb while more workers pay, halve while fewer keep up, then bisect)."""
        while self.elapsed() < self.stop_at:
            proposal = propose(self.rates(), cap=self.climb_cap(), tolerance=self.settings.tolerance,
                               refused=self.refused())
            if proposal is None:
                return
            yield from self.run(self.config(proposal))

    def steps(self) -> Steps[TuneResult]:
        if self.settings.tune_threads and math.isfinite(self.settings.budget):
            self.stop_at = THREADS_SHARE_AT * self.settings.budget
        consumer_s, threads_tried = yield from self.search_counts()
        yield from self.fit_below_refusals()
        consumer_rate = self.consumer(consumer_s)
        self.stop_at = self.settings.budget
        if self.settings.tune_threads and not threads_tried:
            base = [t for t in self.found.trials if t.ok and t.config.threads == self.settings.threads]
            chosen = policy.select(base, tolerance=self.settings.tolerance)
            if chosen is not None:
                yield from search_threads(self, chosen, consumer_rate)
        chosen = policy.select(self.found.trials, tolerance=self.settings.tolerance)
        if chosen is not None:
            yield from compare_native(self, chosen)
            chosen = policy.select(self.candidates(), tolerance=self.settings.tolerance)
        limited = chosen is None or chosen.config.native_threads is not None
        if chosen is not None and "prefetch_factor" not in self.settings.fixed and \
                policy.worth_more_prefetch(chosen, consumer_samples_per_s=consumer_rate):
            yield from self.run(self.config(chosen.config.num_workers, prefetch=2 * self.settings.prefetch,
                                            threads=chosen.config.threads, limited=limited))
        if chosen is not None and self.settings.device.type == "cuda" and "pin_memory" not in self.settings.fixed:
            yield from self.run(self.config(chosen.config.num_workers, chosen.config.prefetch_factor,
                                            pin=not self.settings.pin, threads=chosen.config.threads, limited=limited))
        return self.result(self.choose(), consumer_rate)

    def candidates(self) -> List[TrialResult]:
        """The trials the selection chooses among (``policy.contenders``)."""
        return policy.contenders(self.found.trials, tolerance=self.settings.tolerance)

    def choose(self) -> Optional[TrialResult]:
        """The selection among candidates that fit the memory budget, now and (copy-on-read growth forecast) by the
        end of an epoch; warns when the forecast made it choose fewer workers or still crosses the budget."""
        chosen, warning = policy.select_within_budget(self.candidates(), tolerance=self.settings.tolerance,
                                                      budget_bytes=self.settings.memory_budget,
                                                      epoch_samples=self.settings.epoch_samples)
        if warning is not None:
            self.found.memory_limited = True
            warn_user(warning)
        return chosen

    def search_counts(self) -> Steps[Tuple[float, bool]]:
        """The worker counts (and, threads first, the threads): from the configuration in force (online), the
        user's ``num_workers``, or the serial candidate. Returns the consumer's seconds per batch and whether the
        threads-first search ran (NOTE [ Processes x threads ]: the thread part after processes is then skipped)."""
        fixed_n = self.settings.fixed.get("num_workers")
        if self.settings.start is not None and self.settings.start.num_workers > 0 and fixed_n is None:
            threaded = self.settings.tune_threads and self.settings.start.threads > 1
            current = yield from self.run(self.config(self.settings.start.num_workers,
                                                      threads=self.settings.start.threads if threaded else None),
                                          first=True)
            consumer_s = (current.consumer_s_per_batch or 0.0) if current is not None else 0.0
            self.consumer(consumer_s)
            if threaded and current is not None:
                self.stop_at = self.settings.budget
                if (yield from search_threads_first(self, current, consumer_s, workers_needed=1.0)):
                    return consumer_s, True
                yield from self.run(self.config(self.settings.start.num_workers))
            yield from self.follow(policy.next_count_down if self.settings.descend else policy.next_count_near)
            return consumer_s, threaded
        if fixed_n is not None:
            serial = yield from self.run(self.config(fixed_n), first=True)
            return (serial.consumer_s_per_batch or 0.0) if serial is not None else 0.0, False
        serial = self.found.serial = yield from self.run(self.config(0), first=True)
        consumer_s = (serial.consumer_s_per_batch or 0.0) if serial is not None else 0.0
        if self.settings.cap <= 0:
            return consumer_s, False
        first = self.settings.tune_threads and serial is not None and threads_policy.waits(
            serial, max_threads=thread_bounds.max_threads_per_process(serial, batch_size=self.settings.batch_size))
        needed = policy.workers_needed(fetch_s=serial.fetch_s_per_batch or 0.0, consumer_s=consumer_s,
                                       fetch_cpu_s=serial.fetch_cpu_s_per_batch or 0.0,
                                       usable_cpus=self.settings.usable) if first and serial is not None else 1.0
        if first and serial is not None and \
                (yield from search_threads_first(self, serial, consumer_s, workers_needed=needed)):
            return consumer_s, True
        if first:
            self.stop_at = self.settings.budget  # the fallback: no thread part follows it
        yield from self.search_workers(serial, consumer_s)
        return consumer_s, first

    def result(self, chosen: Optional[TrialResult], consumer_rate: Optional[float]) -> TuneResult:
        """The search's ``TuneResult``: ``chosen``'s (``verdict.conclude``), else the fallback's
        (``verdict.unmeasured``)."""
        seconds = time.monotonic() - self.started
        if chosen is None:
            return verdict.unmeasured(self.settings, self.found.trials, consumer_rate=consumer_rate, seconds=seconds,
                                      native_threads=self.native_limit(int(self.settings.fixed.get("num_workers", 0))))
        return verdict.conclude(chosen, self.settings, self.found, consumer_rate=consumer_rate, seconds=seconds,
                                refits=self.refits)
