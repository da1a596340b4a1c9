"""Time one candidate DataLoader configuration against the consumer step.

# NOTE [ Trial timing ]
# What we want is the rate training will see once the pipeline is full, and three things distort a naive timing:
# 1. Start-up. ``iter()`` forks N workers and each imports/initialises before its first batch. That cost is paid once
#    per epoch (or once, with persistent workers) and is reported separately as ``startup_s`` (time to first batch).
# 2. The burst. While the main process waits for batch 0, the other workers keep producing: by the time batch 0
#    arrives, up to N * prefetch_factor batches sit ready in the queue and arrive at memory speed. Workers that started
#    together also finish together, so batches then come in waves of N. A window that starts at batch 0, or spans
#    less than a few waves, overstates the rate, by 2x and more.
#    So the window starts only after N * prefetch_factor + N batches (the queue drained plus one more wave), and it
#    must cover at least ``min_rounds`` waves of N batches and ``min_window_s`` seconds. The rate is the number of
#    samples consumed in the window over its wall time, the same quantity an epoch's throughput is.
# 3. Asynchronous devices. On CUDA the step only queues work, and so do pinned non_blocking copies: a host left alone
#    runs ahead of the GPU by as many steps as the launch queue holds, so the window would open (and the stall
#    fraction be read) at the host's pace while the GPU's is what training gets. So the host may lead by at most two
#    steps (``Consumer.pace``: an event per step, waiting on the one from two steps back), the device is synchronised
#    when the window opens and when it closes, and once more in the cleanup so a cut trial's queued work is not
#    charged to the next one. Copies, kernels and loading still overlap as they will in training.
# 4. A trial cut before the burst drained (a short limit at the end of the budget, or batches too slow for the limit)
#    has no such window. The fallback windows (after the first wave, else the first batch) still lie inside the burst,
#    whose batches were made while the other workers were being started, before anyone asked for them: measured here,
#    18 workers cut after 27 of their 54 burst batches read 3.6x the rate of their neighbours, and won the search. So
#    such a trial's rate is counted from the trial's start, start-up included: a lower bound, marked not steady.
# Trials never reach the end of an epoch: the sampler is cycled (``_Cycle``) so a small dataset still gives a steady
# window; an IterableDataset that runs out ends the trial early and the result is marked ``steady=False``.
# Each trial has a wall-clock limit: a soft one checked after every batch, and a hard one (``SignalGuard``: SIGALRM in
# the main thread, plus the DataLoader's own ``timeout`` for workers) that cuts a batch that never comes, raised only
# where it cannot leak a lock (NOTE [ Asynchronous exceptions ] in _signals.py). However a trial ends, its workers are
# stopped and reaped before it returns (NOTE [ Process cleanup ] in _procs.py).
# While it runs, a trial also watches for two mistakes in the dataset (see _advice.py): workers repeating an unsharded
# IterableDataset (``_advice.RepeatCheck``) and copy-on-read memory growth (worker USS from the first batch to the end).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
import traceback
from typing import Any, Iterator, Mapping, Optional, Set

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from . import _procs, _advice
from ._signals import SignalGuard
from ._window import Window
from ._consumer import Consumer
from ._failures import HARD_LIMIT_GRACE_S, failure_reason
from .errors import TrialTimeout, TuningError, quiet_worker_count_warning
from .prefetch import PrefetchLoader
from .probe import start_method
from .results import LoaderConfig, TrialResult, without_worker_only
from .threads import loader_dataset

log = logging.getLogger("autoloader.trial")

_TRIAL_SEED = 0x5EED
SPAWN_STARTUP_S = 15.0
"""Allowed on top of a trial's limit when its workers are spawned (spawn, forkserver): each imports torch before its
first batch, seconds on a busy machine, and that start-up is reported apart, never the candidate's fault."""
_END = object()


class _Cycle:
    """Repeats a sampler (or batch sampler) forever, so trials never hit an epoch boundary."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def __iter__(self) -> Iterator[Any]:
        while True:
            empty = True
            for item in self.base:
                empty = False
                yield item
            if empty:
                return


def _private_generator(generator: Optional[torch.Generator]) -> torch.Generator:
    """A copy of the user's generator (or a fixed-seed one): trials must not advance the user's RNG state."""
    copy = torch.Generator()
    if generator is not None:
        copy.set_state(generator.get_state())
    else:
        copy.manual_seed(_TRIAL_SEED)
    return copy


def build_trial_loader(
    dataset: Any,
    batch_size: int,
    config: LoaderConfig,
    *,
    shuffle: bool,
    loader_kwargs: Mapping[str, Any],
    timeout: float,
) -> DataLoader:
    """The DataLoader a trial iterates: the user's arguments, the candidate's knobs (its threads per process through
    ``loader_dataset``), and a sampler that never ends."""
    kwargs = dict(loader_kwargs) if config.num_workers else without_worker_only(loader_kwargs)
    kwargs.update(config.loader_kwargs())
    if config.num_workers:
        kwargs["persistent_workers"] = False
    generator = _private_generator(kwargs.get("generator"))
    kwargs["generator"] = generator
    if config.num_workers > 0 and not kwargs.get("timeout"):
        kwargs["timeout"] = max(1.0, timeout)
    data = loader_dataset(dataset, config)
    if isinstance(dataset, IterableDataset):
        return DataLoader(data, batch_size=batch_size, **kwargs)
    batch_sampler = kwargs.pop("batch_sampler", None)
    if batch_sampler is not None:
        kwargs.pop("drop_last", None)
        kwargs.pop("sampler", None)
        return DataLoader(data, batch_sampler=_Cycle(batch_sampler), **kwargs)
    sampler = kwargs.pop("sampler", None)
    if sampler is None:
        sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
    return DataLoader(data, batch_size=batch_size, sampler=_Cycle(sampler), **kwargs)


@contextlib.contextmanager
def _quiet_half_built_iterators() -> Iterator[None]:
    """Log, rather than print, the AttributeError torch's DataLoader iterator raises from ``__del__`` when its
    ``__init__`` failed part-way (e.g. out of file descriptors while starting workers): the trial already reports why
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


class _Blame:
    """Whose code raised: inside ``user_code()`` it is the dataset's, the collate_fn's or the step's (re-raised
    unchanged); elsewhere autoloader's own. A block that raises leaves the blame where it was."""

    def __init__(self) -> None:
        self.user = False

    @contextlib.contextmanager
    def user_code(self) -> Iterator[None]:
        self.user = True
        yield
        self.user = False


def run_trial(
    dataset: Any,
    batch_size: int,
    config: LoaderConfig,
    *,
    consumer: Consumer,
    shuffle: bool = False,
    loader_kwargs: Optional[Mapping[str, Any]] = None,
    normalize: Any = None,
    dtype: Optional[torch.dtype] = None,
    input_key: Any = None,
    time_limit: float = 5.0,
    min_window_s: float = 0.5,
    min_rounds: int = 3,
    min_batches: int = 6,
    measure_consumer: bool = False,
) -> TrialResult:
    """Time ``config`` against ``consumer`` (see NOTE [ Trial timing ]); workers are always reaped.

    Returns a ``TrialResult`` with ``status="failed"`` and the reason when the candidate itself fails (worker killed,
    timeout, file descriptors); re-raises the user's own exceptions from the dataset or the step unchanged, and
    ``KeyboardInterrupt``. With ``measure_consumer``, ``consumer_s_per_batch`` is the step alone timed on the last
    batch (see ``Consumer.seconds_per_batch``); otherwise it is the host time spent in the step during the window.
    """
    started = time.perf_counter()
    before = _procs.child_pids()
    loader_kwargs = loader_kwargs or {}
    spawned = config.num_workers > 0 and start_method(loader_kwargs.get("multiprocessing_context")) != "fork"
    time_limit += SPAWN_STARTUP_S if spawned else 0.0
    window = Window(config, started=started, batch_size=batch_size, min_window_s=min_window_s,
                    min_rounds=min_rounds, min_batches=min_batches)
    with quiet_worker_count_warning(True):
        loader = build_trial_loader(dataset, batch_size, config, shuffle=shuffle, loader_kwargs=loader_kwargs,
                                    timeout=time_limit)
    prefetcher = PrefetchLoader(loader, device=consumer.device, normalize=normalize, dtype=dtype,
                                input_key=input_key)
    repeats = _advice.RepeatCheck(window.skip) if config.num_workers >= 2 and isinstance(dataset, IterableDataset) \
        else None
    blame = _Blame()
    error: Optional[BaseException] = None
    it: Any = None
    guard = SignalGuard(limit_s=time_limit + HARD_LIMIT_GRACE_S,
                        make_timeout=lambda: TrialTimeout(_cut_message(time_limit)))
    with guard:
        try:
            with quiet_worker_count_warning(True):
                with blame.user_code():
                    it = iter(prefetcher)
                while not window.complete(deadline=started + time_limit):
                    t_ask, c_ask = time.perf_counter(), time.process_time()
                    with blame.user_code():
                        batch = next(it, _END)
                    if batch is _END:
                        window.exhausted = True
                        break
                    t_got, c_got = time.perf_counter(), time.process_time()
                    if window.startup_s is None:
                        window.first_batch(batch, t_got, workers=_procs.new_children(before))
                    if repeats is not None:
                        repeats.see(batch)
                    with blame.user_code():
                        consumer(batch)
                    consumer.pace()
                    window.add(batch, t_ask=t_ask, c_ask=c_ask, t_got=t_got, c_got=c_got, consumer=consumer)
                    guard.check()
                    window.last_batch = batch
                consumer.synchronize()
                window.close()
                if measure_consumer and window.last_batch is not None:
                    with blame.user_code():
                        window.consumer_s = consumer.seconds_per_batch(window.last_batch, seconds=0.25)
                guard.check()
        except BaseException as exc:  # noqa: B036 - classified below; the user's errors are re-raised unchanged
            error = exc
        finally:
            with guard.shield():
                window.last_batch = None
                _clean_up(consumer, before, failed=error is not None)
                with _quiet_half_built_iterators():
                    if error is not None and error.__traceback__ is not None:
                        traceback.clear_frames(error.__traceback__)
                    references = [it, prefetcher, loader]
                    it = prefetcher = loader = batch = None  # noqa: F841 - drops the iterator: its workers shut down
                    _procs.drop(references)
                _procs.reap(_procs.new_children(before))
    elapsed = time.perf_counter() - started
    if error is not None:
        reason = failure_reason(error, workers=config.num_workers, stream=isinstance(dataset, IterableDataset))
        if isinstance(error, (KeyboardInterrupt, SystemExit)) or (reason is None and blame.user):
            raise error
        if reason is None:
            raise TuningError(f"trial {config.label()} failed inside autoloader: {error!r}") from error
        log.info("trial %s failed: %s", config.label(), reason)
        return TrialResult(config=config, status="failed", reason=reason, startup_s=window.startup_s,
                           elapsed_s=elapsed, batch_bytes=window.batch_bytes)
    if repeats is not None and repeats.repeated:
        _advice.warn_once(dataset, "repeated-stream", _advice.repeated_stream_advice(dataset, config.num_workers))
    result = window.result(elapsed)
    copy_on_read = _advice.copy_on_read_advice(result, dataset_name=type(dataset).__name__)
    if copy_on_read is not None:
        _advice.warn_once(dataset, "copy-on-read", copy_on_read)
    return result


def _cut_message(time_limit: float) -> str:
    return (f"trial exceeded its time limit of {time_limit:.1f} s and was cut after "
            f"{time_limit + HARD_LIMIT_GRACE_S:.1f} s: a batch or a step never finished (does the dataset or the step "
            f"block?)")


def _clean_up(consumer: Consumer, before: Set[int], *, failed: bool) -> None:
    """The first steps of NOTE [ Process cleanup ]: the device's queued work, then a failed trial's workers."""
    try:
        consumer.synchronize()
    except RuntimeError as err:  # a CUDA error in the step: the trial's own error says more
        log.debug("synchronising after the trial failed: %r", err)
    if failed:
        _procs.terminate(_procs.new_children(before))
