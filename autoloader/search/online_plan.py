"""The order of an online search (NOTE [ Online convergence ] in online_policy.py): the first batches probed, the
prior's workers measured, at most ``MAX_JUMPS`` jumps where the model points, then the choice, the fewest workers
within the tolerance; the native-threads, prefetch and pinning comparisons of the trials' search follow it. A search
that starts from the configuration in force (a re-tune) measures it first and jumps from it, only down when told so.
Like ``Search.steps`` (which online tuning still follows with ``threads=True``), it measures nothing itself: the
online epoch scheduler measures each candidate it yields."""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from .._text import mib
from ..results import TrialResult, TuneResult
from . import memory, online_policy, policy, switching
from .candidates import Steps
from .capacity import step_cpus
from .native_search import compare_native
from .search import Search

__all__ = ["online_cap", "online_steps", "settled"]

log = logging.getLogger("autoloader.tuner")


def online_steps(search: Search, *, serial: Optional[TrialResult] = None) -> Steps[TuneResult]:
    """The online search's generator over ``search`` (its settings, findings, ``run`` and result); ``serial``: the
    first batches' costs a previous search measured (a re-tune starts from the configuration in force and has no
    probe of its own)."""
    settings = search.settings
    if settings.start is None:
        yield from search.run(search.config(0), first=True, probe=True)
        probe = search.found.by_config.get(search.config(0))
        if probe is None or probe.fetch_s_per_batch is None:
            return search.result(search.choose(), None)
        serial = search.found.serial = probe
        workers = _prior(search, serial, consumer_s=probe.consumer_s_per_batch)
        if workers == 0:
            serial = (yield from search.run(search.config(0), again=True)) or serial
            workers = _prior(search, serial, consumer_s=serial.consumer_s_per_batch)
            if workers:
                log.info("serial loading takes %.1f ms a batch beside a %.1f ms step: trying %d workers",
                         1e3 * (serial.fetch_s_per_batch or 0.0), 1e3 * (serial.consumer_s_per_batch or 0.0), workers)
        yield from _prior_pool(search, serial, workers)
    else:
        yield from search.run(search.config(settings.start.num_workers), first=True)
    yield from _jumps(search, serial)
    yield from search.fit_below_refusals()
    chosen = search.choose()
    serial_now = search.found.by_config.get(search.config(0))
    if chosen is None or (chosen.config.num_workers == 0 and serial_now is not None and not serial_now.steady) or \
            online_policy.serial_in_doubt(chosen, serial=serial_now or serial, trials=search.found.trials,
                                          batch_size=settings.batch_size):
        # the probe's estimate won, or it may beat the workers, or nothing ran: serial serving, measured
        yield from search.run(search.config(0), again=True)
        chosen = search.choose()
    return (yield from _finish(search, chosen))


def _prior_pool(search: Search, serial: TrialResult, prior: int) -> Steps[None]:
    """The prior's pool, held to what is known to fit the memory budget (NOTE [ Memory budget ] in memory.py): the
    most of ``prior`` workers that fit at the size known (measured, else this process's private memory); then, once
    its workers were measured, grown to the most of ``prior`` that fit at their measured size. When not one worker fits
    at the conservative size, one starts, checked at its first batch."""
    workers = prior
    while workers:
        fitting, unsized = search.first_pool(workers)
        if fitting != workers:
            search.log_refusal(workers, fitting, unsized=unsized, mode="online: ")
        workers = fitting
        if not workers:
            return
        yield from search.run(search.config(workers), gain=_gain(serial, workers), unsized=unsized)
        last = search.found.trials[-1]
        if last.status != "skipped":
            break
        workers = workers - 1 if memory.skipped_for_memory(last) else workers // 2  # its workers' size is known
    if workers and workers < prior and search.found.per_worker_bytes is not None:
        grown = search.most_that_fit(low=workers, high=prior)
        if grown is not None and grown > workers:
            log.info("online: %d workers measured %s each; %d fit the memory budget", workers,
                     mib(search.found.per_worker_bytes), grown)
            yield from search.run(search.config(grown), gain=_gain(serial, grown))


def _gain(serial: TrialResult, workers: int) -> float:
    return online_policy.prior_gain(fetch_s=serial.fetch_s_per_batch or 0.0, consumer_s=serial.consumer_s_per_batch,
                                    workers=workers)


def _prior(search: Search, serial: TrialResult, *, consumer_s: Optional[float]) -> int:
    settings = search.settings
    return online_policy.prior_workers(fetch_s=serial.fetch_s_per_batch or 0.0,
                                       fetch_cpu_s=serial.fetch_cpu_s_per_batch or 0.0,
                                       fetch_delay_s=serial.fetch_delay_s_per_batch, consumer_s=consumer_s,
                                       usable_cpus=settings.usable, cap=online_cap(search),
                                       busy_cpus=step_cpus(serial, usable_cpus=settings.usable))


def online_cap(search: Search) -> int:
    """The most workers the online search measures: the search's climb cap, no more than an epoch can measure
    (``online_policy.measurable_cap``), and, spawned, no more than start in a quarter of an epoch served serially
    (``switching.spawn_cap``, from the serial probe)."""
    settings = search.settings
    epoch_batches = -(-settings.epoch_samples // settings.batch_size) if settings.epoch_samples else None
    caps = [search.climb_cap(), online_policy.measurable_cap(epoch_batches=epoch_batches,
                                                             prefetch_factor=settings.prefetch)]
    serial = search.found.serial
    if settings.spawned and serial is not None and serial.fetch_s_per_batch is not None and epoch_batches:
        per_batch = serial.fetch_s_per_batch + (serial.consumer_s_per_batch or 0.0)
        caps.append(switching.spawn_cap(epoch_serial_s=epoch_batches * per_batch, usable_cpus=settings.usable))
    return min(c for c in caps if c is not None)


def _jumps(search: Search, serial: Optional[TrialResult]) -> Steps[None]:
    """Jump where ``online_policy.jump`` points, at most ``MAX_JUMPS`` times; a search told to go down takes only the
    jumps to fewer workers."""
    settings = search.settings
    for _ in range(online_policy.MAX_JUMPS):
        trials = [t for t in search.found.trials if t.config.same_candidate(search.config(t.config.num_workers))]
        below = _below_a_refusal(search, trials)
        if below is not None:
            search.log_refusal(trials[-1].config.num_workers, below, mode="online: ")
            yield from search.run(search.config(below))
            continue
        last = next((t for t in reversed(trials) if t.ok), None)
        move = online_policy.jump(trials, serial=serial,
                                  consumer_s=last.consumer_s_per_batch if last is not None else None,
                                  batch_size=settings.batch_size, usable_cpus=settings.usable, cap=online_cap(search),
                                  tolerance=settings.tolerance,
                                  busy_cpus=step_cpus(last or serial, usable_cpus=settings.usable))
        if move is None or (settings.descend and last is not None and move.workers > last.config.num_workers):
            return
        workers = search.most_that_fit(low=last.config.num_workers if last is not None else 0, high=move.workers)
        if workers is None:
            return
        log.info("online: %s%s", move.why, "" if workers == move.workers else
                 f"; {workers} fit the memory budget")
        yield from search.run(search.config(workers), gain=move.gain)


def _below_a_refusal(search: Search, trials: Sequence[TrialResult]) -> Optional[int]:
    """After a jump the memory budget refused as it measured it (stopped at its first batch, or measured past the
    budget: ``Search.refused``), the most workers below it that fit by what it measured, as after a prior stopped so;
    None after any other candidate, or when no count fits between it and the most measured that fit (a jump up had
    ended the search there: 7 workers served a waiting-bound epoch under 380 MiB where 12 fit and 13 were stopped)."""
    refused = search.refused()
    if not trials or trials[-1].config.num_workers not in refused:
        return None
    high = trials[-1].config.num_workers - 1
    low = max((t.config.num_workers for t in trials if t.ok and t.config.num_workers <= high
               and t.config.num_workers not in refused), default=0)
    workers = search.most_that_fit(low=low, high=high)
    return workers if workers is not None and workers > low else None


def _finish(search: Search, chosen: Optional[TrialResult]) -> Steps[TuneResult]:
    """The trials' comparisons after the worker count (native threads, a deeper prefetch, pinning), then the
    result."""
    settings = search.settings
    consumer_rate = _consumer_rate(search, chosen)
    if chosen is not None:
        yield from compare_native(search, chosen)
        chosen = search.choose()
    limited = chosen is None or chosen.config.native_threads is not None
    if chosen is not None and "prefetch_factor" not in settings.fixed and not online_policy.keeps_up(chosen) and \
            policy.worth_more_prefetch(chosen, consumer_samples_per_s=consumer_rate):
        yield from search.run(search.config(chosen.config.num_workers, prefetch=2 * settings.prefetch,
                                            threads=chosen.config.threads, limited=limited))
        chosen = search.choose()
    if chosen is not None and settings.device.type == "cuda" and "pin_memory" not in settings.fixed:
        yield from search.run(search.config(chosen.config.num_workers, chosen.config.prefetch_factor,
                                            pin=not settings.pin, threads=chosen.config.threads, limited=limited))
        chosen = search.choose()
    return search.result(chosen, consumer_rate)


def settled(search: Search) -> TuneResult:
    """The result of a search ended before its generator finished (``OnlineSearch.settle``: the next candidate would
    not repay its start even over a whole epoch): its choice among what it measured, with the consumer's rate as
    ``_finish`` gives it; the comparisons after the worker count (native threads, prefetch, pinning), each a start
    of its own, are not measured."""
    chosen = search.choose()
    return search.result(chosen, _consumer_rate(search, chosen))


def _consumer_rate(search: Search, chosen: Optional[TrialResult]) -> Optional[float]:
    """The consumer's own rate, from the step as ``chosen`` timed it (else as the search last noted it)."""
    consumer = chosen.consumer_s_per_batch if chosen is not None else None
    return search.consumer(consumer) if consumer else search.found.consumer_rate
