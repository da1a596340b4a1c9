"""The thread part of the search: after the process-only one, a few (processes, threads) candidates, chosen and
ended by the measurements (NOTE [ Processes x threads ] in ``threads_policy.py``; the decisions are there)."""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Protocol

from ..config import LoaderConfig
from ..results import TrialResult
from . import threads_policy as policy
from .candidates import Steps


class Searching(Protocol):
    """What the thread part reads and calls of the ``search.Search`` running it."""

    trials: List[TrialResult]
    by_config: Dict[LoaderConfig, TrialResult]
    tolerance: float
    batch_size: int
    fixed: Mapping[str, Any]
    cap: int
    usable: int
    threads: int
    trial_limit: float
    budget: float

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
    reference = max(t.samples_per_s for t in search.trials if t.ok and t.config.threads == search.threads)
    max_threads = policy.max_threads_per_process(chosen, batch_size=search.batch_size)
    processes = policy.thread_processes(chosen.config.num_workers, fixed_workers=search.fixed.get("num_workers"),
                                        cap=search.cap, usable_cpus=search.usable, max_threads=max_threads)
    proposal = policy.first_thread_config(chosen, processes=processes, max_threads=max_threads,
                                          consumer_samples_per_s=consumer_rate, tolerance=search.tolerance)
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
                            search.elapsed() + search.trial_limit > search.budget):
            return
        config = search.config(proposal[0], threads=proposal[1])
        yield from search.run(config, again=True, force=control)
        trial = search.by_config.get(config)
        if trial is None:
            return
        tried.append(trial)
        proposal = policy.next_thread_config(tried, reference=reference, processes=processes,
                                             max_threads=max_threads, tolerance=search.tolerance)
