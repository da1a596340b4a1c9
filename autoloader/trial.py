"""Time one candidate DataLoader configuration against the consumer step.

# NOTE [ Trial timing ]
# What we want is the rate training will see once the pipeline is full, and three things distort a naive timing:
# 1. Start-up. ``iter()`` forks N workers and each imports/initialises before its first batch. That cost is paid once
#    per epoch (or once, with persistent workers) and is reported separately as ``startup_s`` (time to first batch).
# 2. The burst. While the main process waits for batch 0, the other workers keep producing: by the time batch 0
#    arrives, up to N * prefetch_factor batches sit ready in the queue and arrive at memory speed. Workers that started
#    together also finish together, so batches then come in waves of N. A window that starts at batch 0, or spans
#    less than a few waves, overstates the rate by up to 2x.
#    So the window starts only after N * prefetch_factor + N batches (the queue drained plus one more wave), and it
#    must cover at least ``min_rounds`` waves of N batches and ``min_window_s`` seconds. The rate is the number of
#    samples consumed in the window over its wall time, the same quantity an epoch's throughput is.
# 3. Asynchronous devices. On CUDA the step only queues work. We synchronise at the end of the window, not per batch,
#    so copies, kernels and loading overlap exactly as they will in training, and the window still pays for every
#    queued kernel.
# Trials never reach the end of an epoch: the sampler is cycled (``_Cycle``) so a small dataset still gives a steady
# window; an IterableDataset that runs out ends the trial early and the result is marked ``steady=False``.
# Each trial has a wall-clock limit: a soft one checked after every batch, and a hard one (SIGALRM in the main thread,
# plus the DataLoader's own ``timeout`` for workers) that cuts a batch that never comes. A trial cut that way leaves
# its workers stuck in the dataset; they are terminated before the DataLoader shuts down (see NOTE [ Process cleanup ]
# in _procs.py), which would otherwise wait 5 s for each of them.
# While it runs, a trial also watches for two mistakes in the dataset (see advice.py): workers repeating an unsharded
# IterableDataset (``advice.RepeatCheck``) and copy-on-read memory growth (worker USS from the first batch to the end).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import sys
import time
import traceback
from typing import Any, Iterator, List, Mapping, Optional, Tuple

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from . import _procs, advice
from ._batch import batch_nbytes, iter_tensors
from .consumer import Consumer
from .failures import HARD_LIMIT_GRACE_S, TuningError, failure_reason, hard_limit, timed_out
from .prefetch import PrefetchLoader, quiet_worker_count_warning
from .results import LoaderConfig, TrialResult

log = logging.getLogger("autoloader.trial")

_TRIAL_SEED = 0x5EED


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
    """The DataLoader a trial iterates: the user's arguments, the candidate's knobs, and a sampler that never ends."""
    kwargs = dict(loader_kwargs)
    kwargs.update(config.loader_kwargs())
    kwargs["persistent_workers"] = False
    generator = _private_generator(kwargs.get("generator"))
    kwargs["generator"] = generator
    if config.num_workers > 0 and not kwargs.get("timeout"):
        kwargs["timeout"] = max(1.0, timeout)
    if isinstance(dataset, IterableDataset):
        return DataLoader(dataset, batch_size=batch_size, **kwargs)
    batch_sampler = kwargs.pop("batch_sampler", None)
    if batch_sampler is not None:
        kwargs.pop("drop_last", None)
        kwargs.pop("sampler", None)
        return DataLoader(dataset, batch_sampler=_Cycle(batch_sampler), **kwargs)
    sampler = kwargs.pop("sampler", None)
    if sampler is None:
        sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
    return DataLoader(dataset, batch_size=batch_size, sampler=_Cycle(sampler), **kwargs)


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


def _samples_in(batch: Any, default: int) -> int:
    for tensor in iter_tensors(batch):
        return int(tensor.shape[0]) if tensor.dim() > 0 else default
    try:
        return len(batch)
    except TypeError:
        return default


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
    time_limit: float = 5.0,
    min_window_s: float = 0.5,
    min_rounds: int = 3,
    min_batches: int = 6,
    measure_consumer: bool = False,
) -> TrialResult:
    """Time ``config`` against ``consumer`` (see NOTE [ Trial timing ]); workers are always reaped.

    Returns a ``TrialResult`` with ``status="failed"`` and the reason when the candidate itself fails (worker killed,
    timeout, file descriptors); re-raises the user's own exceptions from the dataset or the step unchanged.
    With ``measure_consumer``, ``consumer_s_per_batch`` is the step alone timed on the last batch (back to back, then
    synchronised), which is exact on CUDA too; otherwise it is the host time spent in the step during the window.
    """
    started = time.perf_counter()
    before = _procs.child_pids()
    workers: list = []
    n = config.num_workers
    skip = n * (config.prefetch_factor or 0) + n if n else 1
    need = max(min_batches, min_rounds * n)
    with quiet_worker_count_warning(True):
        loader = build_trial_loader(dataset, batch_size, config, shuffle=shuffle,
                                    loader_kwargs=loader_kwargs or {}, timeout=time_limit)
    prefetcher = PrefetchLoader(loader, device=consumer.device, normalize=normalize, dtype=dtype)
    cut_message = (f"trial exceeded its time limit of {time_limit:.1f} s and was cut after "
                   f"{time_limit + HARD_LIMIT_GRACE_S:.1f} s: a batch or a step never finished (does the dataset or "
                   f"the step block?)")
    repeats = advice.RepeatCheck(skip) if n >= 2 and isinstance(dataset, IterableDataset) else None
    it: Optional[Iterator[Any]] = None
    deadline = started + time_limit
    marks: List[Tuple[float, int, float, float, float]] = []
    probe_start: Optional[Tuple[float, float, _procs.WorkerSample]] = None
    memory_start: Optional[_procs.WorkerSample] = None
    startup: Optional[float] = None
    batch_bytes: Optional[int] = None
    error: Optional[BaseException] = None
    end = started
    consumer_s: Optional[float] = None
    batch: Any = None
    last_batch: Any = None
    user_code = False
    probe_end: Optional[Tuple[float, float, Optional[_procs.WorkerSample]]] = None
    try:
        with hard_limit(time_limit + HARD_LIMIT_GRACE_S, cut_message), quiet_worker_count_warning(True):
            user_code = True
            it = iter(prefetcher)
            while True:
                t_ask, c_ask = time.perf_counter(), time.process_time()
                user_code = True
                try:
                    batch = next(it)
                except StopIteration:
                    break
                user_code = False
                t_got, c_got = time.perf_counter(), time.process_time()
                if startup is None:
                    startup = t_got - started
                    batch_bytes = batch_nbytes(batch)
                    workers = _procs.new_children(before)
                    memory_start = _procs.sample_workers(workers) if workers else None
                if repeats is not None:
                    repeats.see(batch)
                user_code = True
                consumer(batch)
                user_code = False
                t_done = time.perf_counter()
                marks.append((t_done, _samples_in(batch, batch_size), t_got - t_ask, c_got - c_ask, t_done - t_got))
                last_batch, batch = batch, None
                if len(marks) == skip:
                    probe_start = (time.perf_counter(), time.process_time(),
                                   _procs.sample_workers(workers, memory=False))
                if len(marks) - skip >= need and t_done - marks[skip - 1][0] >= min_window_s:
                    break
                if t_done >= deadline:
                    break
            consumer.synchronize()
            end = time.perf_counter()
            if probe_start is not None:
                probe_end = (end, time.process_time(), _procs.sample_workers(workers) if workers else None)
            if measure_consumer and last_batch is not None:
                user_code = True
                consumer_s = consumer.seconds_per_batch(last_batch, seconds=0.25)
                user_code = False
            last_batch = None
    except BaseException as exc:  # noqa: B036 - classified below; the user's errors are re-raised unchanged
        error = exc
    finally:
        if timed_out(error):
            _procs.terminate(_procs.new_children(before))
        with _quiet_half_built_iterators():
            if error is not None and error.__traceback__ is not None:
                traceback.clear_frames(error.__traceback__)
            it = prefetcher = loader = batch = last_batch = None
            gc.collect()
        _procs.reap(_procs.new_children(before))
    elapsed = time.perf_counter() - started
    if error is not None:
        reason = failure_reason(error)
        if isinstance(error, (KeyboardInterrupt, SystemExit)) or (reason is None and user_code):
            raise error
        if reason is None:
            raise TuningError(f"trial {config.label()} failed inside autoloader: {error!r}") from error
        log.info("trial %s failed: %s", config.label(), reason)
        return TrialResult(config=config, status="failed", reason=reason, startup_s=startup,
                           elapsed_s=elapsed, batch_bytes=batch_bytes)
    if repeats is not None and repeats.repeated:
        advice.warn_once(dataset, "repeated-stream", advice.repeated_stream_advice(dataset, n))
    result = _result(config, marks, end, skip, need, probe_start, probe_end, memory_start, startup, elapsed,
                     batch_bytes)
    copy_on_read = advice.copy_on_read_advice(result, dataset_name=type(dataset).__name__)
    if copy_on_read is not None:
        advice.warn_once(dataset, "copy-on-read", copy_on_read)
    if consumer_s is not None and result.ok:
        result = dataclasses.replace(result, consumer_s_per_batch=consumer_s)
    return result


def _window_open(count: int, skip: int, n: int) -> Optional[int]:
    """Index of the batch whose completion opens the timed window: after the burst if we got that far, else after
    the first wave, else after the first batch; None when fewer than two batches follow it."""
    for index in (skip - 1, n, 0):
        if count - 1 - index >= 2:
            return index
    return None


def _result(config: LoaderConfig, marks: list, end: float, skip: int, need: int, probe_start: Any,
            probe_end: Any, memory_start: Optional[_procs.WorkerSample], startup: Optional[float], elapsed: float,
            batch_bytes: Optional[int]) -> TrialResult:
    n = config.num_workers
    opened = _window_open(len(marks), skip, n)
    if opened is None:
        return TrialResult(config=config, status="failed", startup_s=startup, elapsed_s=elapsed,
                           batch_bytes=batch_bytes, steady=False,
                           reason=f"only {len(marks)} batches within the trial's time limit; too few to measure a rate")
    window_marks = marks[opened + 1:]
    batches = len(window_marks)
    window = max(end, marks[-1][0]) - marks[opened][0]
    samples = sum(m[1] for m in window_marks)
    wait = sum(m[2] for m in window_marks)
    worker_fields: dict = {}
    if probe_start is not None and probe_end is not None:
        span = max(1e-9, probe_end[0] - probe_start[0])
        per_batch = window / (span * batches)
        worker_fields["main_cpu_util"] = (probe_end[1] - probe_start[1]) / span
        start_sample, end_sample = probe_start[2], probe_end[2]
        if n and end_sample is not None:
            cpu = max(0.0, end_sample.cpu_s - start_sample.cpu_s)
            first_uss = memory_start.uss_by_pid if memory_start is not None else {}
            growth = [end_sample.uss_by_pid[p] - first_uss[p] for p in end_sample.uss_by_pid if p in first_uss]
            read = (None if end_sample.read_bytes is None or start_sample.read_bytes is None
                    else max(0, end_sample.read_bytes - start_sample.read_bytes))
            worker_fields.update(
                worker_cpu_util=cpu / (span * n),
                worker_cpu_s_per_batch=cpu * per_batch,
                read_bytes_per_batch=None if read is None else read * per_batch,
                worker_rss_bytes=end_sample.max_rss,
                worker_uss_bytes=end_sample.max_uss,
                worker_uss_growth_bytes=max(growth) if growth else None,
            )
    return TrialResult(
        config=config,
        samples_per_s=samples / window,
        batches=batches,
        window_s=window,
        startup_s=startup,
        elapsed_s=elapsed,
        stall_fraction=min(1.0, wait / window),
        fetch_s_per_batch=wait / batches,
        fetch_cpu_s_per_batch=sum(m[3] for m in window_marks) / batches,
        consumer_s_per_batch=sum(m[4] for m in window_marks) / batches,
        batch_bytes=batch_bytes,
        steady=opened == skip - 1 and batches >= need,
        **worker_fields,
    )
