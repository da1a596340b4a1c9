"""One configuration serving the next slice of an epoch in the training loop: measured as a candidate until its
window is complete, or simply serving (see NOTE [ Online switching ] in online.py, which drives it)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Tuple

from . import _procs
from ._failures import failure_reason, thread_failure
from ._search import Alone, Candidate
from ._signals import SignalGuard
from ._window import Window, samples_in
from .errors import TuningError, quiet_worker_count_warning
from .results import LoaderConfig, TrialResult
from .slices import EpochSource

if TYPE_CHECKING:
    from .online import OnlineTuner

log = logging.getLogger("autoloader.online")

END = object()
MAX_ATTEMPTS = 2
"""Epochs a candidate may be cut short by the epoch's end before its window opened, before its partial measurement is
taken as it is (a window that opened and holds a few batches is taken at once, marked not steady)."""


@dataclass
class EpochTrace:
    """One epoch that searched: when each batch reached the loop, and each candidate's span (for ``plot``)."""

    epoch: int
    start: float
    batches: List[Tuple[float, int]] = field(default_factory=list)
    """(seconds since the epoch started, samples) per batch handed to the loop."""
    spans: List[Tuple[float, float, str, Optional[float]]] = field(default_factory=list)
    """(start s, end s, label, samples/s measured or None) per candidate, the decision's last."""


def serve(tuner: "OnlineTuner", source: EpochSource, config: LoaderConfig, candidate: Optional[Candidate],
          trace: EpochTrace, epoch: int) -> Iterator[Any]:
    """Serve batches from ``config`` over the rest of the epoch. A candidate serves until its window is measured:
    the search then takes the measurement at once and, when it decides on this very configuration, the same
    loader serves on to the epoch's end (no restart). Returns a measurement the caller must still hand to the
    search (a failure, a window cut short by the epoch's end), else None."""
    started = span_start = time.perf_counter()
    before = _procs.child_pids()
    part = source.take(None)
    with quiet_worker_count_warning(True):
        loader = tuner.slicer.loader(part, config.num_workers, config.prefetch_factor,
                                    pin_memory=config.pin_memory, dataset=tuner.dataset_for(config))
    tuner.in_force = loader
    window = Window(config, started=started, batch_size=tuner.batch_size, min_window_s=0.5, min_rounds=3,
                    min_batches=6)
    deadline = started + (candidate.limit_s if candidate is not None else float("inf"))
    alone = isinstance(tuner.agreement, Alone)
    measuring = candidate is not None
    delivered, error, ended, span_rate, handed = 0, None, False, None, False
    previous: Optional[Tuple[Any, float, float, float, float]] = None
    guard = SignalGuard(hold_worker_errors=True)
    with guard:
        try:
            with quiet_worker_count_warning(True):
                it = iter(loader)
            while True:
                t_ask, c_ask = time.perf_counter(), time.process_time()
                if measuring and previous is not None:
                    tuner.consumer.pace()
                    window.add(previous[0], t_ask=previous[1], c_ask=previous[2], t_got=previous[3],
                               c_got=previous[4], consumer=tuner.consumer)
                    t_ask, c_ask = time.perf_counter(), time.process_time()
                complete = measuring and window.complete(deadline=deadline, patient=True)
                if complete and alone:  # decided before fetching: no batch to re-issue
                    span_rate, continues = _measure(tuner, window, started, epoch, config)
                    handed = True
                    if not continues:
                        break
                    measuring, complete, span_start = False, False, _split_span(trace, span_start, config,
                                                                                      span_rate)
                failure: Optional[BaseException] = None
                batch: Any = END
                try:
                    batch = next(it, END)
                    guard.check()
                except BaseException as exc:  # noqa: B036 - classified below, re-raised if not ours
                    failure = exc
                if measuring and not alone:  # ranks agree on stopping before anyone hands the batch out
                    stop, failed_elsewhere = _agree(tuner.agreement, complete=complete, failed=failure is not None)
                    if failed_elsewhere and failure is None:
                        failure = TuningError("a candidate failed on another rank")
                    if stop and failure is None:
                        span_rate, continues = _measure(tuner, window, started, epoch, config)
                        handed = True
                        if not continues:
                            break  # the batch just fetched is not handed out: re-issued
                        measuring, span_start = False, _split_span(trace, span_start, config, span_rate)
                if failure is not None:
                    raise failure
                if batch is END:
                    ended = True
                    break
                t_got, c_got = time.perf_counter(), time.process_time()
                if window.startup_s is None:
                    window.first_batch(batch, t_got, workers=_procs.new_children(before) if measuring else (),
                                       memory=False)
                    tuner.switch_s += t_got - started
                delivered += 1
                trace.batches.append((t_got - trace.start, samples_in(batch, tuner.batch_size)))
                previous = (batch, t_ask, c_ask, t_got, c_got)
                yield batch
            if measuring:
                tuner.consumer.synchronize()
                window.close()
        except BaseException as exc:  # noqa: B036 - the loop's own errors, GeneratorExit, Ctrl-C: re-raised
            error = exc
        finally:
            stopping = time.perf_counter()
            with guard.shield():
                previous = batch = None
                workers = _procs.new_children(before)
                tuner.in_force = tuner.plain
                references = [it, loader]
                it = loader = None  # noqa: F841 - the only references left are in ``references``
                if error is None:
                    _procs.retire(references, workers)
                else:
                    _procs.terminate(workers)
                    _procs.drop(references)
                    _procs.reap(workers)
                part.delivered(delivered)
            ended_at = time.perf_counter()
            tuner.switch_s += ended_at - stopping
            tuner.search_s += ended_at - started
    result = _outcome(tuner, config, None if handed else candidate, window, error, ended, ended_at - started)
    if result is not None and result.ok:
        span_rate = result.samples_per_s
    trace.spans.append((span_start - trace.start, ended_at - trace.start, config.label(), span_rate))
    return result


def _measure(tuner: "OnlineTuner", window: Window, started: float, epoch: int,
             config: LoaderConfig) -> Tuple[Optional[float], bool]:
    """The candidate's window is complete: hand its measurement to the search now. Returns its rate, and whether the
    search decided on this very configuration (then the candidate in force serves on)."""
    tuner.consumer.synchronize()
    window.close()
    result = window.result(time.perf_counter() - started)
    return (result.samples_per_s if result.ok else None), tuner.measured(result, epoch=epoch, config=config)


def _split_span(trace: EpochTrace, start: float, config: LoaderConfig, rate: Optional[float]) -> float:
    now = time.perf_counter()
    trace.spans.append((start - trace.start, now - trace.start, config.label(), rate))
    return now


def _outcome(tuner: "OnlineTuner", config: LoaderConfig, candidate: Optional[Candidate], window: Window,
             error: Optional[BaseException], ended: bool, elapsed: float) -> Optional[TrialResult]:
    """What the search must still be told after a slice: a candidate's failure, or a window the epoch's end cut
    short; None when there is nothing (no candidate, or already handed over)."""
    if error is not None and candidate is None:
        raise error  # the configuration in force, measured no more: its errors reach the loop as a DataLoader's do
    if error is not None:
        reason = failure_reason(error, workers=config.num_workers) if not isinstance(error, TuningError) \
            else str(error)
        if reason is None and candidate is not None and tuner.tuning_threads and config.threads > 1 \
                and isinstance(error, Exception):
            return thread_failure(config, error)  # its undelivered batches were re-issued: nothing is lost
        if reason is None or isinstance(error, (GeneratorExit, KeyboardInterrupt, SystemExit)):
            raise error
        log.info("online candidate %s failed: %s", config.label(), reason)
        return TrialResult(config=config, status="failed", reason=reason, startup_s=window.startup_s,
                           elapsed_s=elapsed, batch_bytes=window.batch_bytes)
    if candidate is None:
        return None
    if ended and len(window.marks) - window.skip < 3:  # the window never really opened: measure it again
        tuner.attempts += 1
        if tuner.attempts < MAX_ATTEMPTS:
            return None
    return window.result(elapsed)


def _agree(agreement: Any, *, complete: bool, failed: bool) -> Tuple[bool, bool]:
    """(stop, failed on another rank): stop when every rank's window is complete or any rank's candidate failed."""
    if isinstance(agreement, Alone):
        return complete, False
    all_complete, none_failed = agreement.reduce_min([1.0 if complete else 0.0, 0.0 if failed else 1.0])
    anyone_failed = none_failed == 0.0
    return bool(all_complete) or anyone_failed, anyone_failed and not failed
