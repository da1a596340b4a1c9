"""``Run``: a configuration's batches, served (``serving.Serving``) and observed: the one place a trial, an online
candidate and an epoch served by a decision are timed. A driver asks for each batch in two steps, ``request()`` (the
loop is back: the previous batch's step is over) and ``fetch()``, and reads ``complete()``/``measure()`` in between;
the window (``window.Window``) or the epoch's tally (``tally.Tally``) observes both steps, nothing measured travels in
the batch stream. Drivers: ``served()`` (trials, served epochs) and the online epoch scheduler (tuning/scheduler.py).

# NOTE [ Trial timing ]
# What we want is the rate training will see once the pipeline is full, and three things distort a naive timing:
# 1. Start-up. ``iter()`` forks N workers and each imports/initialises before its first batch. That cost is paid once
#    per epoch (or once, with persistent workers) and is reported separately as ``startup_s`` (time to first batch).
# 2. The burst. While the main process waits for batch 0, the other workers keep producing: by the time batch 0
#    arrives, up to N * prefetch_factor batches sit ready in the queue and arrive at memory speed. Workers that started
#    together also finish together, so batches then come in waves of N. A window that starts at batch 0, or spans
#    less than a few waves, overstates the rate, by 2x and more.
#    So a trial's window opens only after N * prefetch_factor + N batches (``LoaderConfig.burst_batches``: the queue
#    drained plus one more wave), and it must cover at least ``MIN_ROUNDS`` waves of N batches, ``MIN_BATCHES`` batches
#    and ``MIN_WINDOW_S`` seconds (window.py). An online candidate's window may open sooner, once the loop waited
#    after the batches in flight, and closes in whole waves when its rate is known or at its bound (window_rule.py). The rate is the samples consumed in the window over its wall time, the
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
#    does not open before the previous run has settled (``Serving.settled``: its workers gone, or ``SETTLE_S`` passed):
#    the burst is extended by a batch at a time until then.
# 6. The epoch's end. A pool's batches in flight are loaded together: when the loop gets one, the others are part
#    made, and the loader draws the next batch for the worker that made it. Once it drew the last batch of the epoch
#    (its slice: ``BatchSlice.drawn_all``), nothing refills the pipeline, and the batches after that come from work
#    begun before the window opened: a window that counts them to the epoch's end overstates the pool's rate by as
#    much as the work in flight is to the window (a quarter and more for pools that hold a third of an epoch). So an
#    online candidate's window ends at the batch upon which the last was drawn (``Window.last_drawn``), at a whole wave
#    when one fits; one not opened by then is cut (not steady) and goes on next epoch, and no candidate holds more
#    batches in flight than a third of the epoch (``online_policy.measurable_cap``: the burst, a window and this tail).
# Modes. A trial (``mode="trial"``) runs over a sampler that never ends (trial.py) until its window is complete or its
# soft limit passed; an IterableDataset that runs out ends it early, ``steady=False``. A hard limit (``SignalGuard``:
# SIGALRM, plus the DataLoader's own ``timeout`` for workers) cuts a batch that never comes, raised only where it
# cannot leak a lock (NOTE [ Asynchronous exceptions ] in signals.py). An online candidate (``mode="candidate"``) is
# patient: a slow step never cuts it before its window holds a few batches; its driver reads ``complete()`` before each
# fetch and asks the search what next (NOTE [ Online epoch scheduler ] in tuning/phases.py). ``mode="serve"``
# measures nothing but the epoch's steady rate and stall (``Tally``).
# Cleanup. However a run ends, its workers are stopped and reaped (NOTE [ Process cleanup ] in procs.py): a trial's in
# the loop's thread, before the next trial starts; an online candidate's in a helper thread (``procs.retire``) so the
# next candidate's start-up overlaps it, unless it failed (then at once). A run over a DataLoader it does not own (the
# plain loader of a decision, maybe with persistent workers) only lets go of its iterator, as a plain loop does.
"""
from __future__ import annotations

import math
import time
from typing import Any, Iterator, Literal, Optional, Tuple

from torch.utils.data import IterableDataset

from ..config import LoaderConfig
from ..consumer import Consumer
from ..errors import TrialTimeout, TuningError
from ..loader.source import BatchError, consumed
from ..results import TrialResult
from ..supervise import procs as _procs
from ..supervise.serving import END, Record, Serving
from ..supervise.signals import SignalGuard
from . import advice as _advice
from .cpuclock import cpu_and_delay
from .failures import HARD_LIMIT_GRACE_S
from .tally import Tally
from .window import Clocks, Window, WindowSpec

__all__ = ["END", "Mode", "Run", "served"]

Mode = Literal["trial", "candidate", "serve"]
_UNREAD: Clocks = (0.0, None)


class Run:
    """``loader``'s batches for ``config``, observed as ``mode`` says (see NOTE [ Trial timing ]).

    ``limit_s``: the soft limit of a trial or candidate (a trial's hard limit follows it by ``HARD_LIMIT_GRACE_S``);
    ``window``: how its window opens and closes (None: as its ``mode`` says, ``WindowSpec``);
    ``owned``: the run stops the loader's workers when it ends (else it only drops its iterator; ``serving.adopt``:
    a DataLoader whose persistent workers run already). ``follows(run)``:
    the window waits for the previous run's workers to be reaped (NOTE [ Trial timing ], 5.). ``serving.record``:
    batches handed out, whether the loader ran out, whose code failed, start-up and what the loop waited for.
    """

    def __init__(self, loader: Any, config: LoaderConfig, *, mode: Mode, consumer: Consumer, batch_size: int,
                 limit_s: float = math.inf, owned: bool = True, window: Optional[WindowSpec] = None) -> None:
        self.config, self.mode, self.consumer, self.batch_size = config, mode, consumer, batch_size
        hard = limit_s + HARD_LIMIT_GRACE_S if mode == "trial" else None
        guard = SignalGuard(limit_s=hard, make_timeout=lambda: TrialTimeout(_cut_message(limit_s)),
                            hold_worker_errors=mode != "trial")
        self.serving = Serving(loader, guard=guard, owned=owned, retire=mode != "trial",
                               before_stop=lambda: _synchronize_quietly(consumer))
        self.deadline = self.serving.started + limit_s
        spec = window or WindowSpec("trial" if mode == "trial" else "candidate")
        self.window = Window(config, started=self.serving.started, batch_size=batch_size, spec=spec)
        self.tally = Tally(config, batch_size)
        stream = isinstance(getattr(loader, "dataset", None), IterableDataset)
        self.repeats = _advice.RepeatCheck(self.window.skip) \
            if mode == "trial" and stream and config.num_workers >= 2 else None
        self.measuring = mode != "serve"
        self.result: Optional[TrialResult] = None
        """The measurement, once ``measure()`` made it (or the loader ran out while measuring)."""
        self._asked: Tuple[float, Clocks] = (0.0, _UNREAD)
        self._previous: Optional[Tuple[Any, float, Clocks, float, Clocks]] = None

    # -- what drivers call --------------------------------------------------------------------------------------------
    @property
    def record(self) -> Record:
        return self.serving.record

    @property
    def guard(self) -> SignalGuard:
        return self.serving.guard

    def start(self) -> None:
        self.serving.start()

    def guarded(self) -> "_entered":
        """The run's signal guard, entered unless a driver holds it already."""
        return _entered(self.guard)

    def follows(self, previous: "Run") -> None:
        """This run serves right after ``previous``: its window opens once ``previous`` settled."""
        self.window.settled = previous.serving.settled

    def request(self) -> None:
        """The loop asked for the next batch: the previous one's step is over. While measuring, the host is paced to
        the device and the previous batch is marked in the window (NOTE [ Trial timing ], 2.-3.)."""
        t_ask, c_ask = time.perf_counter(), cpu_and_delay() if self.measuring else _UNREAD
        if self.measuring and self._previous is not None:
            c_done = c_ask
            self.consumer.pace()
            batch, t_prev, c_prev, t_got, c_got = self._previous
            self.window.add(batch, t_ask=t_prev, c_ask=c_prev, t_got=t_got, c_got=c_got, consumer=self.consumer,
                            c_done=c_done)
            t_ask, c_ask = time.perf_counter(), cpu_and_delay()
        self._asked = (t_ask, c_ask)

    def complete(self) -> bool:
        """The window holds enough (a candidate is patient with a slow step: NOTE [ Trial timing ], Modes)."""
        return self.measuring and self.window.complete(deadline=self.deadline, patient=self.mode == "candidate")

    def measure(self) -> TrialResult:
        """The window is complete: the device catches up, the counters are read, the result is made; measuring
        ends (the run may serve on, unmeasured)."""
        self.consumer.synchronize()
        self.window.close()
        self.result = self.window.result(time.perf_counter() - self.serving.started)
        self.measuring = False
        return self.result

    def measure_again(self, *, bound_s: float) -> None:
        """Measure on, from the next batch, in a new candidate window (the search named this very configuration
        again: the serial one after its probe); the run serves on without a restart."""
        previous = self.window
        self.window = Window(self.config, started=time.perf_counter(), batch_size=self.batch_size,
                             spec=WindowSpec("candidate", bound_s))
        self.window.settled = previous.settled
        self.window.startup_s, self.window.batch_bytes = previous.startup_s, previous.batch_bytes
        self.measuring, self.result, self._previous = True, None, None

    def fetch(self) -> Tuple[Any, Optional[BaseException]]:
        """The batch asked for (``END`` when the loader ran out), or the exception that came instead."""
        batch, failure = self.serving.next()
        if failure is not None or batch is END:
            if batch is END and failure is None:
                self.window.exhausted = self.mode == "trial"
            return batch, failure
        t_got = time.perf_counter()
        c_got = cpu_and_delay() if self.measuring else _UNREAD
        t_ask, c_ask = self._asked
        if self.record.startup_s is None:
            self.record.first_wait_s = t_got - t_ask
            self._first(batch, t_got)
        if self.repeats is not None:
            self.repeats.see(batch)
        self.record.delivered += 1
        self.tally.add(batch, wait_s=t_got - t_ask, t_got=t_got)
        self._previous = (batch, t_ask, c_ask, t_got, c_got) if self.measuring else None
        return batch, None

    def passed(self, error: Exception) -> BatchError:
        """The batch asked for raised ``error`` from the dataset or ``collate_fn``, and the DataLoader's iterator goes
        on (NOTE [ A batch that raises ] in loader/source.py): the batch used its place in the order (the slice does not
        re-issue it), nothing of it is measured, and it goes to the loop as a ``BatchError``."""
        self.record.delivered += 1
        self._previous = None
        return BatchError(error)

    def give_back(self) -> None:
        """The batch ``fetch()`` returned last is not handed out (a switch that cannot be hidden stops at it): it does
        not count as delivered, so the run's slice re-issues it to the next run."""
        if self.record.delivered <= 0:
            raise RuntimeError("give_back(): no batch was fetched to give back")
        self.record.delivered -= 1

    def finish(self) -> None:
        """The loader ran out: what was measured is the result; the epoch's rate and stall are final."""
        if self.measuring:
            self.measure()

    @property
    def rate_and_stall(self) -> Tuple[Optional[float], Optional[float]]:
        return self.tally.rate_and_stall(time.perf_counter() if not self.serving.stopped else
                                         self.serving.processes.stopped_at)

    def stop(self, error: Optional[BaseException] = None) -> None:
        self.serving.stop(error)

    def _first(self, batch: Any, t_got: float) -> None:
        self.record.startup_s = t_got - self.serving.started
        if self.measuring:
            workers = self.serving.processes.current() if self.config.num_workers else ()
            self.window.first_batch(batch, t_got, workers=workers, memory=True)


def served(run: Run, *, until_complete: bool) -> Iterator[Any]:
    """The driver of a trial (``until_complete``: it ends when the window is complete) and of an epoch served by the
    decision (until the loader runs out): every batch, under the run's signal guard unless its caller entered it.
    A served epoch's workers are stopped when it ends; a trial's by its caller, after the step on the last batch. A
    served epoch's batch that raised goes on as a ``BatchError`` (NOTE [ A batch that raises ] in loader/source.py); a
    trial's failure is raised (its caller classifies it)."""
    error: Optional[BaseException] = None
    with run.guarded():
        try:
            while True:
                run.request()
                if until_complete and run.complete():
                    run.measure()
                    return
                batch, failure = run.fetch()
                if isinstance(failure, Exception) and not until_complete and of_a_batch(failure):
                    yield run.passed(failure)
                    continue
                if failure is not None:
                    raise failure
                if batch is END:
                    run.finish()
                    return
                yield batch
        except BaseException as exc:  # noqa: B036 - re-raised: the caller classifies (failures.classify)
            error = exc
            raise
        finally:
            if error is not None or run.mode != "trial":
                run.stop(error)
            error = None  # its traceback holds this frame, which holds the run and its workers: no cycle


def of_a_batch(error: BaseException) -> bool:
    """Whether ``error``, raised while fetching a batch, is that batch's own (the dataset's or ``collate_fn``'s: the
    DataLoader's iterator goes on) rather than the DataLoader's (a worker's death, a timeout) or autoloader's
    (``source.consumed``)."""
    return isinstance(error, Exception) and not isinstance(error, TuningError) and consumed(error)


class _entered:
    """``guard``'s context, unless it is active already (a trial's driver holds it across every step)."""

    def __init__(self, guard: SignalGuard) -> None:
        self.guard, self.entered = guard, False

    def __enter__(self) -> None:
        if not self.guard.active:
            self.guard.__enter__()
            self.entered = True

    def __exit__(self, *exc_info: Any) -> None:
        if self.entered:
            self.guard.__exit__(*exc_info)


def _synchronize_quietly(consumer: Consumer) -> None:
    try:
        consumer.synchronize()
    except RuntimeError as err:  # a CUDA error in the step: the run's own error says more
        _procs.log.debug("synchronising after the run failed: %r", err)


def _cut_message(limit_s: float) -> str:
    return (f"trial exceeded its time limit of {limit_s:.1f} s and was cut after {limit_s + HARD_LIMIT_GRACE_S:.1f} "
            f"s: a batch or a step never finished (does the dataset or the step block?)")
