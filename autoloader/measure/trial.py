"""A trial: one candidate configuration timed against the consumer step before training, by the one measured loop
(``run.Run``, NOTE [ Trial timing ]) over a DataLoader whose sampler never ends.

While it runs, a trial also watches for two mistakes in the dataset (advice.py): workers repeating an unsharded
IterableDataset (``advice.RepeatCheck``) and copy-on-read memory growth (worker USS from the first batch to the end).
"""
from __future__ import annotations

import dataclasses
import logging
import traceback
from typing import Any, Iterator, Optional

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from ..config import LoaderConfig
from ..consumer import Consumer
from ..errors import quiet_worker_count_warning
from ..loader.native import worker_pools
from ..loader.prefetch import PrefetchLoader
from ..probe import start_method
from ..request import Request
from ..results import TrialResult
from . import advice as _advice
from .failures import classify
from .run import Run, served
from .window import MemoryCheck

log = logging.getLogger("autoloader.trial")

_TRIAL_SEED = 0x5EED
SPAWN_STARTUP_S = 15.0
"""Allowed on top of a trial's limit when its workers are spawned (spawn, forkserver): each imports torch before its
first batch, seconds on a busy machine, and that start-up is reported apart, never the candidate's fault."""


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


def trial_loader(request: Request, config: LoaderConfig, *, limit_s: float) -> DataLoader:
    """The DataLoader a trial iterates (``Request.data_loader``): the user's arguments, the candidate's knobs, a
    private generator, no persistent workers, a worker ``timeout``, a sampler that never ends, and workers that
    report their native thread pools (``native.worker_pools``)."""
    kwargs = request.loader_kwargs
    generator = _private_generator(kwargs.get("generator"))
    forced: dict = {"generator": generator, "persistent_workers": False}
    if config.num_workers > 0 and not kwargs.get("timeout"):
        forced["timeout"] = max(1.0, limit_s)
    sampling: Optional[dict] = None
    if request.streaming:
        pass
    elif kwargs.get("batch_sampler") is not None:
        sampling = {"batch_sampler": _Cycle(kwargs["batch_sampler"])}
    else:
        sampler = kwargs.get("sampler")
        if sampler is None:
            sampler = RandomSampler(request.dataset, generator=generator) if request.shuffle else \
                SequentialSampler(request.dataset)
        sampling = {"batch_size": request.loader_batch_size, "sampler": _Cycle(sampler),
                    "drop_last": kwargs.get("drop_last", False)}
    with quiet_worker_count_warning(True):
        return request.data_loader(config, sampling=sampling, measured=True, **forced)


def run_trial(request: Request, config: LoaderConfig, *, consumer: Consumer, limit_s: float = 5.0,
              measure_consumer: bool = False, threads_tuned: bool = False,
              memory: Optional[MemoryCheck] = None) -> TrialResult:
    """Time ``config`` against ``consumer`` (see NOTE [ Trial timing ]); workers are always reaped.

    Returns a ``TrialResult`` with ``status="failed"`` and the reason when the candidate itself fails (worker killed,
    timeout, file descriptors, or a thread candidate the tuner chose, ``threads_tuned``, raising), and with
    ``status="skipped"`` when ``memory`` (the candidate's ``memory.MemoryCheck``) stopped it at its first batch;
    re-raises the user's own exceptions from the dataset or the step unchanged, and ``KeyboardInterrupt``. With
    ``measure_consumer``, ``consumer_s_per_batch`` and ``consumer_cpu_s_per_batch`` are the step alone timed on the
    last batch (see ``Consumer.cost_per_batch``); otherwise the host time and CPU spent in the step during the
    window.
    """
    spawned = config.num_workers > 0 and start_method(request.setting("multiprocessing_context")) != "fork"
    limit_s += SPAWN_STARTUP_S if spawned else 0.0
    loader = trial_loader(request, config, limit_s=limit_s)
    init = loader.worker_init_fn  # what the workers report their native pools through (the run lets go of loader)
    run = Run(loader, config, mode="trial", consumer=consumer, batch_size=request.batch_size, limit_s=limit_s)
    run.window.memory_check = memory
    del loader
    error: Optional[BaseException] = None
    try:
        with run.guard:  # its hard limit covers every step, the last one's and measure_consumer's too
            try:
                batches = served(run, until_complete=True)
                _consume(PrefetchLoader(batches, device=consumer.device, **request.transform), run, consumer,
                         measure_consumer=measure_consumer)
            except BaseException as exc:  # noqa: B036 - classified below: the user's errors are re-raised unchanged
                error = exc
            finally:
                run.stop(error)
    finally:
        run.stop(error)  # a Ctrl-C that landed as the first call began: the workers are stopped all the same
    if error is not None:
        record = run.record
        failed = classify(error, config, user=record.user, threads_tuned=threads_tuned, stream=request.streaming,
                          startup_s=record.startup_s, elapsed_s=record.elapsed, batch_bytes=run.window.batch_bytes)
        # the candidate's failure, not raised: its traceback's frames (and this one) would hold the run in a cycle,
        # up through the caller's frames (the loop's, when make_loader tunes at the first iter())
        traceback.clear_frames(error.__traceback__)
        del error
        return failed
    result = run.result
    if result is None:  # the generator never ran to its end: cannot happen without an error above
        raise RuntimeError("the trial's loop ended without a measurement")
    if not result.ok:  # stopped at its first batch for the memory budget: nothing else was measured
        return result
    if run.repeats is not None and run.repeats.repeated:
        _advice.warn_once(request.dataset, "repeated-stream",
                          _advice.repeated_stream_advice(request.dataset, config.num_workers))
    copy_on_read = _advice.copy_on_read_advice(result, dataset_name=type(request.dataset).__name__)
    if copy_on_read is not None:
        _advice.warn_once(request.dataset, "copy-on-read", copy_on_read)
    return dataclasses.replace(result, elapsed_s=run.record.elapsed, native_pools=worker_pools(init))


def _consume(prefetcher: PrefetchLoader, run: Run, consumer: Consumer, *, measure_consumer: bool) -> None:
    """The training loop of a trial: the step on every batch the run hands out (the user's code: ``record.user``),
    then the step alone on the last one when asked."""
    last: Any = None
    record = run.record
    for last in prefetcher:
        record.user = True
        consumer(last)
        record.user = False
    if measure_consumer and last is not None and run.result is not None:
        record.user = True
        consumer_s, consumer_cpu_s = consumer.cost_per_batch(last, seconds=0.25)
        record.user = False
        run.result = dataclasses.replace(run.result, consumer_s_per_batch=consumer_s,
                                         consumer_cpu_s_per_batch=consumer_cpu_s)
