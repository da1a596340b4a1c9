"""``Run``: the one loop that serves a configuration's batches and measures them, for trials, online candidates and
the epochs served by a decision; window, signal guard, pacing, rank agreement and cleanup are here and nowhere else.

# NOTE [ Trial timing ]
# What we want is the rate training will see once the pipeline is full, and three things distort a naive timing:
# 1. Start-up. ``iter()`` forks N workers and each imports/initialises before its first batch. That cost is paid once
#    per epoch (or once, with persistent workers) and is reported separately as ``startup_s`` (time to first batch).
# 2. The burst. While the main process waits for batch 0, the other workers keep producing: by the time batch 0
#    arrives, up to N * prefetch_factor batches sit ready in the queue and arrive at memory speed. Workers that started
#    together also finish together, so batches then come in waves of N. A window that starts at batch 0, or spans
#    less than a few waves, overstates the rate, by 2x and more.
#    So the window opens only after N * prefetch_factor + N batches (``LoaderConfig.burst_batches``: the queue drained plus
#    one more wave), and it must cover at least ``MIN_ROUNDS`` waves of N batches, ``MIN_BATCHES`` batches and
#    ``MIN_WINDOW_S`` seconds (window.py). The rate is the samples consumed in the window over its wall time, the
#    quantity an epoch's throughput is. The loop sits under the ``PrefetchLoader`` (trials and online alike), so it
#    times the consumer from the requests it gets: the time inside our ``next()`` is waiting for data, the time
#    between handing a batch out and the next request is the step (on that batch; with a side stream, on the batch
#    before: the prefetcher then reads one ahead).
# 3. Asynchronous devices. On CUDA the step only queues work, and so do pinned non_blocking copies: a host left alone
#    runs ahead of the GPU by as many steps as the launch queue holds, so the window would open (and the stall
#    fraction be read) at the host's pace while the GPU's is what training gets. So while measuring, the host may lead
#    by at most two steps (``Consumer.pace``: an event per request, waiting on the one from two requests back), the
#    device is synchronised when the window opens and when it closes, and once more in a trial's cleanup so a cut
#    trial's queued work is not charged to the next one. Copies, kernels and loading still overlap as in training.
# 4. A trial cut before the burst drained (a short limit at the end of the budget, or batches too slow for the limit)
#    has no such window. The fallback windows (after the first wave, else the first batch) still lie inside the burst,
#    whose batches were made while the other workers were being started, before anyone asked for them: measured here,
#    18 workers cut after 27 of their 54 burst batches read 3.6x the rate of their neighbours, and won the search. So
#    such a trial's rate is counted from the trial's start, start-up included: a lower bound, marked not steady.
# 5. The previous candidate's shutdown. Its workers are reaped in a helper thread (Cleanup, below) while the next
#    candidate runs, and a reaped worker's whole CPU time lands in this process's ``RUSAGE_CHILDREN`` at that moment,
#    which ``WorkerTracker`` reads as the new workers' (it must, for workers that exit during a trial). So the window
#    does not open before the previous run has settled (``Run.settled``: its workers gone, or ``SETTLE_S`` passed):
#    the burst is extended by a batch at a time until then.
# Modes. A trial (``mode="trial"``) runs over a sampler that never ends (trial.py) until its window is complete or its
# soft limit passed; an IterableDataset that runs out ends it early, ``steady=False``. A hard limit (``SignalGuard``:
# SIGALRM, plus the DataLoader's own ``timeout`` for workers) cuts a batch that never comes, raised only where it
# cannot leak a lock (NOTE [ Asynchronous exceptions ] in signals.py). An online candidate (``mode="candidate"``) is
# patient: a slow step never cuts it before its window holds a few batches; when measured, it yields ``Measured`` in
# place of a batch and is told whether to serve on (NOTE [ Online switching ] in tuning/online.py). ``mode="serve"``
# measures nothing but the epoch's steady rate and stall (``Tally``).
# Cleanup. However a run ends, its workers are stopped and reaped (NOTE [ Process cleanup ] in procs.py): a trial's in
# the loop's thread, before the next trial starts; an online candidate's in a helper thread (``procs.retire``) so the
# next candidate's start-up overlaps it, unless it failed (then at once). A run over a DataLoader it does not own (the
# plain loader of a decision, maybe with persistent workers) only lets go of its iterator, as a plain loop does.
"""
from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Generator, Iterator, List, Literal, Optional, Tuple

from torch.utils.data import DataLoader, IterableDataset

from ..config import LoaderConfig
from ..agreement import Agreement, Alone
from ..errors import TrialTimeout, TuningError, quiet_worker_count_warning
from ..loader.epochs import epoch_iter
from ..results import TrialResult
from . import advice as _advice
from . import procs as _procs
from .consumer import Consumer
from .cpuclock import cpu_and_delay
from .failures import HARD_LIMIT_GRACE_S
from .signals import SignalGuard, cleanup
from .window import Clocks, Tally, Window

log = logging.getLogger("autoloader.trial")

Mode = Literal["trial", "candidate", "serve"]
END = object()
SETTLE_S = 2.0
"""The next candidate's window waits at most this long after a run stopped for its workers to be reaped (NOTE [ Trial
timing ], 5.): a worker stuck past it is reaped later, and its CPU time may then count for the next candidate."""


@dataclass(frozen=True)
class Measured:
    """Yielded by a candidate's run, in place of a batch, when its window is complete: send back True to serve on
    with the same workers (the search chose this very configuration), False to stop it here."""

    result: TrialResult


class Run:
    """One DataLoader serving batches for ``config``, measured as ``mode`` says (see NOTE [ Trial timing ]).

    Iterate it once. ``limit_s``: the soft limit of a trial or candidate (a trial's hard limit follows it
    by ``HARD_LIMIT_GRACE_S``); ``agreement``: a candidate's ranks stop together; ``owned``: the run stops the
    loader's workers when it ends (else it only drops its iterator). ``follows(run)``: the window waits for the
    previous run's workers to be reaped (NOTE [ Trial timing ], 5.). After the loop: ``result`` (a trial's or a
    candidate's measurement, when not handed out as ``Measured``), ``delivered`` (batches handed out), ``ended`` (the
    loader ran out), ``user`` (the error came from the user's code), ``startup_s``, ``stop_s``, ``rate_and_stall``,
    ``switch_s`` (what the loop waited for while it started and stopped).
    """

    def __init__(self, loader: DataLoader, config: LoaderConfig, *, mode: Mode, consumer: Consumer,
                 batch_size: int, limit_s: float = math.inf, agreement: Optional[Agreement] = None,
                 owned: bool = True) -> None:
        self.loader, self.config, self.mode, self.consumer = loader, config, mode, consumer
        self.owned = owned
        self.agreement: Agreement = agreement or Alone()
        self.started = time.perf_counter()
        self.deadline = self.started + limit_s
        self.before = _procs.child_pids()
        self.window = Window(config, started=self.started, batch_size=batch_size)
        self.tally = Tally(config, batch_size)
        stream = isinstance(loader.dataset, IterableDataset)
        self.repeats = _advice.RepeatCheck(self.window.skip) \
            if mode == "trial" and stream and config.num_workers >= 2 else None
        hard = limit_s + HARD_LIMIT_GRACE_S if mode == "trial" else None
        self.guard = SignalGuard(limit_s=hard, make_timeout=lambda: TrialTimeout(_cut_message(limit_s)),
                                 hold_worker_errors=mode != "trial")
        self._it: Optional[Iterator[Any]] = None
        self._start_error: Optional[Exception] = None
        self._workers: Optional[List[Any]] = None
        self._retiring: Optional[threading.Thread] = None
        self._stopped = False
        self._stopped_at = math.inf
        self.result: Optional[TrialResult] = None
        self.delivered, self.ended, self.user = 0, False, False
        self.startup_s: Optional[float] = None
        self.start_s = self.first_wait_s = self.stop_s = self.elapsed = 0.0
        self.rate_and_stall: Tuple[Optional[float], Optional[float]] = (None, None)

    def __iter__(self) -> Generator[Any, Optional[bool], None]:
        """The loader's batches (and, for a candidate, one ``Measured``). The workers are stopped when it ends,
        except at a trial's normal end: its driver still runs the step on the last batch, then calls ``stop()``.
        The signal guard is the driver's when it entered it (a trial's hard limit then covers every step)."""
        error: Optional[BaseException] = None
        with contextlib.nullcontext() if self.guard.active else self.guard:
            try:
                yield from self._loop()
            except BaseException as exc:  # noqa: B036 - re-raised: the caller classifies (failures.classify)
                error = exc
                raise
            finally:
                if error is not None or self.mode != "trial":
                    self.stop(error)

    def start(self) -> None:
        """Start the loader's iterator (and its workers) now, before the run is iterated: the next candidate of a
        hidden switch (NOTE [ Hidden switch ] in tuning/handover.py). An error raised doing so is the run's, raised when
        it is iterated. Once; iterating the run calls it too."""
        if self._it is not None or self._start_error is not None:
            return
        began = time.perf_counter()
        try:
            with quiet_worker_count_warning(True):
                self._it = epoch_iter(self.loader)  # NOTE [ One base seed per epoch ]
        except Exception as exc:  # noqa: BLE001 - the run's own failure, raised (and classified) when it is iterated
            self._start_error = exc
        finally:
            self.start_s = time.perf_counter() - began

    def follows(self, previous: "Run") -> None:
        """This run serves right after ``previous``: its window opens once ``previous`` settled."""
        self.window.settled = previous.settled

    def keep_workers(self) -> None:
        """Fix the set of workers this run stops as those running now: another run is about to start its own."""
        self._workers = _procs.new_children(self.before) if self.config.num_workers else []

    def settled(self) -> bool:
        """This run stopped and its workers are reaped, or ``SETTLE_S`` passed since it stopped (NOTE [ Trial
        timing ], 5.)."""
        if not self._stopped:
            return False
        done = self._retiring is None or not self._retiring.is_alive()
        return done or time.perf_counter() - self._stopped_at >= SETTLE_S

    def _loop(self) -> Generator[Any, Optional[bool], None]:
        measuring = self.mode != "serve"
        self.start()
        if self._start_error is not None:
            self.user = True
            raise self._start_error
        previous: Optional[Tuple[Any, float, Clocks, float, Clocks]] = None
        cpu, unread = cpu_and_delay, (0.0, None)
        while True:
            t_ask, c_ask = time.perf_counter(), cpu() if measuring else unread  # served: no CPU figures, less per batch
            if measuring and previous is not None:
                self.consumer.pace()
                self.window.add(previous[0], t_ask=previous[1], c_ask=previous[2], t_got=previous[3],
                                c_got=previous[4], consumer=self.consumer)
                t_ask, c_ask = time.perf_counter(), cpu()
            complete = measuring and self.window.complete(deadline=self.deadline, patient=self.mode == "candidate")
            if complete and self.mode == "trial":
                break
            if complete and isinstance(self.agreement, Alone):  # decided before fetching: no batch to re-issue
                if not (yield Measured(self._measure())):
                    return
                measuring = False
            batch, failure = self._next()
            if measuring and self.mode == "candidate" and not isinstance(self.agreement, Alone):
                stop, failure = self._agree(complete, failure)
                if stop and failure is None:
                    if not (yield Measured(self._measure())):
                        return  # the batch just fetched is not handed out: it is re-issued to the next slice
                    measuring = False
            if failure is not None:
                raise failure
            if batch is END:
                self.ended, self.window.exhausted = True, self.mode == "trial"
                break
            t_got, c_got = time.perf_counter(), cpu() if measuring else unread
            if self.startup_s is None:
                self.first_wait_s = t_got - t_ask
                self._first(batch, t_got, measuring)
            if self.repeats is not None:
                self.repeats.see(batch)
            self.delivered += 1
            self.tally.add(batch, wait_s=t_got - t_ask, t_got=t_got)
            previous = (batch, t_ask, c_ask, t_got, c_got) if measuring else None
            yield batch
        if measuring:
            self.result = self._measure()
        self.rate_and_stall = self.tally.rate_and_stall(time.perf_counter())

    def _next(self) -> Tuple[Any, Optional[BaseException]]:
        """The loader's next batch (``END`` when it ran out), or the exception that came instead."""
        self.user = True
        try:
            batch = next(self._it, END)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: B036 - the caller agrees with the other ranks, then raises it
            return END, exc
        self.user = False
        try:
            self.guard.check()
        except BaseException as exc:  # noqa: B036 - a worker's death held by the guard
            return END, exc
        return batch, None

    def _first(self, batch: Any, t_got: float, measuring: bool) -> None:
        self.startup_s = t_got - self.started
        if measuring:
            workers = _procs.new_children(self.before) if self.config.num_workers else ()
            self.window.first_batch(batch, t_got, workers=workers, memory=self.mode == "trial")

    def _measure(self) -> TrialResult:
        """The window is complete: the device catches up, the counters are read, the result is made."""
        self.consumer.synchronize()
        self.window.close()
        return self.window.result(time.perf_counter() - self.started)

    def _stop_workers(self, error: Optional[BaseException]) -> None:
        references = [self._it, self.loader]
        self._it = self.loader = None  # type: ignore[assignment]
        workers = self._workers if self._workers is not None else _procs.new_children(self.before)
        if self.mode == "trial":
            _synchronize_quietly(self.consumer)
        if error is None and self.mode != "trial":
            self._retiring = _procs.retire(references, workers)
            return
        if error is not None:
            _procs.terminate(workers)
        with _quiet_half_built_iterators():
            _procs.drop(references)
        _procs.reap(workers)

    def _agree(self, complete: bool, failure: Optional[BaseException]) -> Tuple[bool, Optional[BaseException]]:
        """(stop, failure): every rank stops when all windows are complete or any rank's candidate failed."""
        all_complete, none_failed = self.agreement.reduce_min([1.0 if complete else 0.0,
                                                               0.0 if failure is not None else 1.0])
        if none_failed == 0.0 and failure is None:
            failure = TuningError("a candidate failed on another rank")
        return bool(all_complete) or none_failed == 0.0, failure

    @cleanup
    def stop(self, error: Optional[BaseException] = None) -> None:
        """NOTE [ Process cleanup ]: the device's queued work, then this run's workers, as its mode says; once. A
        signal landing as it starts waits until it is done (``signals.cleanup``)."""
        with self.guard.shield():
            if self._stopped:
                return
            self._stopped = True
            stopping = self._stopped_at = time.perf_counter()
            if error is not None and error.__traceback__ is not None:
                with _quiet_half_built_iterators():  # a frame may hold the only reference to one (Ctrl-C in iter())
                    traceback.clear_frames(error.__traceback__)
            if not self.owned:  # the DataLoader's own iterator: dropping it is what a plain loop does
                self._it = None
            else:
                self._stop_workers(error)
        self.stop_s = time.perf_counter() - stopping
        self.elapsed = time.perf_counter() - self.started

    @property
    def switch_s(self) -> float:
        """What the loop waited for while this run started and stopped: starting its iterator (forking workers), its
        first batch, stopping it (its workers' shutdown runs in a helper thread, NOTE [ Process cleanup ])."""
        return self.start_s + self.first_wait_s + self.stop_s


def _synchronize_quietly(consumer: Consumer) -> None:
    try:
        consumer.synchronize()
    except RuntimeError as err:  # a CUDA error in the step: the run's own error says more
        log.debug("synchronising after the run failed: %r", err)


def _cut_message(limit_s: float) -> str:
    return (f"trial exceeded its time limit of {limit_s:.1f} s and was cut after {limit_s + HARD_LIMIT_GRACE_S:.1f} "
            f"s: a batch or a step never finished (does the dataset or the step block?)")


@contextlib.contextmanager
def _quiet_half_built_iterators() -> Iterator[None]:
    """Log, rather than print, the AttributeError torch's DataLoader iterator raises from ``__del__`` when its
    ``__init__`` failed part-way (e.g. out of file descriptors while starting workers): the run already reports why
    the candidate failed, and "Exception ignored in ..." on stderr would only confuse."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, AttributeError) and "DataLoaderIter" in repr(unraisable.object):
            log.debug("ignored while discarding a half-built DataLoader iterator: %r", unraisable.exc_value)
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
