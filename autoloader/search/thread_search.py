"""The thread part of the search (NOTE [ Processes x threads ] in ``threads_policy.py``; the decisions are there,
their bounds in ``thread_bounds.py``): threads first when the serial trial shows loading that waits
(``search_threads_first``, the process-only climb only its fallback), else a few (processes, threads) candidates
after the process-only search (``search_threads``)."""
from __future__ import annotations

import functools
import logging
from typing import List, Optional, Protocol

from ..config import LoaderConfig
from ..results import TrialResult
from . import thread_bounds, threads_policy as policy
from .candidates import Steps
from .settings import Findings, Settings


class Searching(Protocol):
    """What the thread part reads and calls of the ``search.Search`` running it."""

    found: Findings
    """Its trials, by_config."""
    settings: Settings
    """Its tolerance, batch_size, fixed, cap, usable, threads, trial_limit, budget."""
    stop_at: float

    def elapsed(self) -> float:
        ...

    def config(self, n: int, prefetch: Optional[int] = None, pin: Optional[bool] = None,
               threads: Optional[int] = None) -> LoaderConfig:
        ...

    def run(self, config: LoaderConfig, *, first: bool = False, again: bool = False,
            force: bool = False) -> Steps[Optional[TrialResult]]:
        ...

log = logging.getLogger("autoloader.tuner")


def search_threads(search: Searching, chosen: TrialResult, consumer_rate: Optional[float]) -> Steps[None]:
    """Try threads per process against ``chosen``, the process-only configuration ``search`` selected: at most
    ``MAX_THREAD_TRIALS`` candidates (controls included, and one more control at most), within the search's budget
    (one control may end past it)."""
    settings = search.settings
    reference = max(policy.rate(t) for t in search.found.trials if t.ok and t.config.threads == settings.threads)
    max_threads = thread_bounds.max_threads_per_process(chosen, batch_size=settings.batch_size)
    processes = thread_bounds.thread_processes(chosen.config.num_workers,
                                               fixed_workers=settings.fixed.get("num_workers"), cap=settings.cap,
                                               usable_cpus=settings.usable, max_threads=max_threads)
    proposal = policy.first_thread_config(chosen, processes=processes, max_threads=max_threads,
                                          consumer_samples_per_s=consumer_rate, tolerance=search.settings.tolerance)
    busy = policy.busy_fraction(chosen)
    if proposal is None:
        log.info("threads: not tried; %s keeps a CPU %s busy per process", chosen.config.label(),
                 "?" if busy is None else f"{busy:.0%}")
        return
    log.info("threads: %s keeps a CPU %.0f%% busy per process; trying %d processes x %d threads", chosen.config.label(),
             100 * (busy or 0.0), *proposal)
    tried: List[TrialResult] = []
    while proposal is not None:
        # One thread is the control of a thread candidate that kept up: the same processes measured again, side by
        # side, always (past the budget or the count of candidates, by one trial at most), so that no thread
        # candidate is chosen without it. Any other candidate starts only while a whole trial's limit is left.
        control = proposal[1] == 1
        if not control and (len(tried) >= policy.MAX_THREAD_TRIALS or
                            search.elapsed() + search.settings.trial_limit > search.settings.budget):
            return
        config = search.config(proposal[0], threads=proposal[1])
        yield from search.run(config, again=True, force=control)
        trial = search.found.by_config.get(config)
        if trial is None:
            return
        tried.append(trial)
        proposal = policy.next_thread_config(tried, reference=reference, processes=processes,
                                             max_threads=max_threads, tolerance=search.settings.tolerance)


def search_threads_first(search: Searching, opening: TrialResult, consumer_s: float, *,
                         workers_needed: float) -> Steps[bool]:
    """Processes x threads before any process-only climb (NOTE [ Processes x threads ], threads first), from
    ``opening``: the serial trial, or (online) the configuration in force when it has threads. At most
    ``THREADS_FIRST_TRIALS`` candidates, none started past ``search.stop_at`` but the control of the choice, which
    always runs, then one process-only reference (``process_reference``); ``workers_needed``:
    ``policy.workers_needed`` from the serial trial, which sizes the first. True when threads won (a choice with
    threads, faster than its control beside it and within the tolerance of the reference); False: the caller falls
    back to the process-only search."""
    max_threads = thread_bounds.max_threads_per_process(opening, batch_size=search.settings.batch_size)
    processes = thread_bounds.threads_first_processes(cap=search.settings.cap, usable_cpus=search.settings.usable,
                                                      max_threads=max_threads)
    consumer_rate = search.settings.batch_size / consumer_s if consumer_s > 0 else None
    decide = functools.partial(policy.next_threads_first, processes=processes, max_threads=max_threads,
                               tolerance=search.settings.tolerance, consumer_samples_per_s=consumer_rate)
    tried: List[TrialResult] = []
    if opening.config.threads > 1:
        tried.append(opening)
        proposal = decide(tried)
    else:
        proposal = policy.first_threads_first(opening, workers_needed=workers_needed, processes=processes,
                                              max_threads=max_threads, usable_cpus=search.settings.usable)
        log.info("threads first: the serial trial keeps a CPU %.0f%% busy; trying %s processes x threads",
                 100 * (policy.busy_fraction(opening) or 0.0), "no" if proposal is None else "%d x %d" % proposal)
    while proposal is not None and len(tried) < policy.THREADS_FIRST_TRIALS:
        trial = yield from measure(search, proposal, control=proposal[1] == 1)
        if trial is None:
            break
        tried.append(trial)
        proposal = decide(tried)
    chosen = next(iter(policy.fewest_near(tried, tolerance=search.settings.tolerance)), None)
    if chosen is None or chosen.config.threads == 1:
        log.info("threads first: threads did not pay (%s); searching processes", "no rate" if chosen is None else
                 f"{chosen.config.label()} kept up without them")
        return False
    control = (chosen.config.num_workers, 1)
    if not any((t.config.num_workers, t.config.threads) == control for t in tried):
        trial = yield from measure(search, control, control=True)
        if trial is not None:
            tried.append(trial)
    chosen = next(iter(policy.fewest_near(tried, tolerance=search.settings.tolerance)), chosen)
    reference = thread_bounds.process_reference(chosen, cap=search.settings.cap) if chosen.config.threads > 1 else None
    if reference is not None:
        trial = yield from measure(search, (reference, 1), control=False)
        if trial is not None:
            tried.append(trial)
    won = any(t.config.threads > 1 for t in policy.fewest_near(tried, tolerance=search.settings.tolerance))
    log.info("threads first: %s", "threads kept" if won else "processes were faster; searching processes")
    return won


def measure(search: Searching, proposal: policy.ThreadConfig, *, control: bool) -> Steps[Optional[TrialResult]]:
    """Have ``proposal`` measured (again, if it was before); a control (one thread) always, past ``stop_at`` too.
    None when it was not measured (the budget is spent)."""
    config = search.config(proposal[0], threads=proposal[1])
    before = len(search.found.trials)
    yield from search.run(config, again=True, force=control)
    return search.found.by_config.get(config) if len(search.found.trials) > before else None
