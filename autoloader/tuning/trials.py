"""``tune()``: the search (``search/search.py``) driven by trials, each a short real DataLoader timed against the
consumer step before training starts (``measure/trial.py``).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch

from ..errors import TuningError, warn_user
from ..loader.device import release_cached
from ..loader.resume.rng import parts_of_kwargs, preserved
from ..consumer import Consumer, Step
from ..supervise.signals import SignalGuard
from ..measure.trial import run_trial
from ..probe import MachineProfile, probe_machine, with_saved_disk
from ..cache.fingerprint import dataset_length
from ..request import Request
from ..results import TrialResult, TuneResult
from ..search.candidates import DEFAULT_BUDGET_S, Candidate, Outcome, Progress, Steps
from ..search.search import Search

__all__ = ["drive", "tune", "tune_with"]

log = logging.getLogger("autoloader.tuner")


def drive(steps: Steps[TuneResult], measure: Callable[[Candidate], TrialResult]) -> TuneResult:
    """Run a search to its end: measure each candidate it yields and send back the result (or the ``TuningError``
    that stopped the measurement; the search decides, with the other ranks, what it means)."""
    try:
        candidate = next(steps)
        while True:
            outcome: Outcome
            try:
                outcome = measure(candidate)
            except TuningError as err:
                outcome = err
            candidate = steps.send(outcome)
    except StopIteration as done:
        return done.value


def tune(
    dataset: Any,
    batch_size: int = 1,
    *,
    step: Step = None,
    device: Union[str, torch.device, None] = None,
    shuffle: bool = False,
    normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
    dtype: Optional[torch.dtype] = None,
    input_key: Any = None,
    budget: Optional[float] = None,
    max_workers: Optional[int] = None,
    threads: Union[bool, int] = False,
    memory_budget: Union[None, int, float] = None,
    native_threads: Optional[Union[bool, int]] = None,
    **dataloader_kwargs: Any,
) -> TuneResult:
    """Find the DataLoader configuration that feeds ``step`` fastest with the fewest workers, by short trials.

    The trials ``make_loader(..., tuning="trials")`` runs, without building the loader or touching the cache: each
    candidate is a real DataLoader with your arguments, timed in its steady state against ``step`` (``help(
    autoloader.make_loader)`` says how the candidates are chosen). Every RNG state is left as it was: torch's,
    Python's and numpy's global ones, the GPUs', your generators and the ``state_dict()`` of your sampler and batch
    sampler. A candidate that fails is recorded in the result's ``trials`` and the search goes on.

    Args:
        dataset: A map-style ``Dataset`` (``__getitem__`` and ``__len__``, not empty) or an ``IterableDataset``.
        batch_size (int): Samples per batch, an int >= 1 (default 1), or None when the dataset yields ready batches.
        step: What the trials are timed against: None (default: the copy to the device only), a number of seconds
            >= 0 per batch (a simulated step that leaves the host CPU free), or a callable run on each batch already
            on the device (your real step: it runs a few dozen times).
        device: Where batches go: a ``torch.device`` or a name (``"cuda"``, ``"cuda:1"``, ``"cpu"``). Default None:
            the current CUDA device when CUDA is available, else ``"cpu"``.
        shuffle (bool): Shuffle the samples (default False), as ``DataLoader``'s; not with ``sampler=``.
        normalize: ``(mean, std)`` per channel, applied on the device to the input tensor during the trials, as
            ``make_loader``'s. Default None.
        dtype (torch.dtype): The input tensor converted to it on the device during the trials. Default None.
        input_key: For mapping batches, the key of the input tensor ``normalize``/``dtype`` apply to. Default None.
        budget (float): Seconds the trials may take, > 0. Default None: 30 s. When it runs out the best found so
            far is returned, at most one trial's time limit later.
        max_workers (int): The most worker processes tried, an int >= 0. Default None: max(64, 8 x the usable CPUs),
            at most ``ulimit -n`` // 32, and never more than an ``IterableDataset``'s shards.
        threads: False (default: no threads), True (the tuner chooses threads per process) or an int N >= 1 (every
            candidate fetches each batch's samples with N threads per process); map-style datasets with a
            thread-safe ``__getitem__`` only.
        memory_budget: What the candidates may add to memory: bytes as an int >= 1, or a float fraction in (0, 1]
            of the memory available to this process. Default None: 0.5.
        native_threads: The limit of each worker's native thread pools: None (default: each worker's share of the
            CPUs, measured against no limit when native threads are in use), an int N >= 1 (fixed), or False (left
            alone).
        **dataloader_kwargs: Every other ``torch.utils.data.DataLoader`` argument, passed to each trial's DataLoader
            unchanged. A ``num_workers``, ``prefetch_factor``, ``pin_memory`` or ``persistent_workers`` given here
            is never tuned.

    Returns:
        TuneResult: The chosen ``config`` (a ``LoaderConfig``, whose knobs the result also answers:
        ``result.num_workers``), its measured ``samples_per_s``, the ``bottleneck``, ``source="tuned"`` (or
        ``"fallback"`` when no candidate measured a rate), the ``reason`` it was chosen and every ``trials`` entry.
        ``print(result)`` shows them as a table; ``help(autoloader.TuneResult)`` describes each field.

    Raises:
        TypeError: An argument of the wrong type (e.g. ``step="fast"``, an unknown keyword), named with its value
            and the fix, before any trial; DataLoader's own rules raise the type DataLoader raises.
        ValueError: A bad value (e.g. ``batch_size=0``, ``budget<=0``, an empty dataset, ``shuffle=True`` with a
            ``sampler``, a dataset that cannot be pickled for ``spawn`` workers), named with the fix, before any
            trial.
        TuningError: autoloader's own machinery failed during a trial (not your dataset or step, whose exceptions
            reach you unchanged). ``make_loader`` falls back to a safe configuration instead.
    """
    request = Request.checked(dataset, batch_size, shuffle=shuffle, step=step, device=device, normalize=normalize,
                              dtype=dtype, input_key=input_key, budget=budget, max_workers=max_workers,
                              threads=threads, memory_budget=memory_budget, native_threads=native_threads,
                              dataloader_kwargs=dataloader_kwargs)
    if dataset_length(dataset) == 0:
        raise ValueError(f"dataset {type(dataset).__name__} is empty (len 0): there is nothing to tune")
    return tune_with(request)


def tune_with(request: Request, profile: Optional[MachineProfile] = None, *,
              progress: Optional[Progress] = None) -> TuneResult:
    """``tune`` for a checked ``request`` (``make_loader`` and the CLI): on the machine ``profile`` (probed when
    None, with the saved disk figures), ranks agreeing through the request's group, ``progress`` after each trial."""
    profile = profile if profile is not None else with_saved_disk(probe_machine(disk=False, gpus=False))
    group = request.group
    search = Search(request, profile, budget=DEFAULT_BUDGET_S if request.budget is None else float(request.budget),
                    coordinator=group.coordinator() if group is not None else None, progress=progress)
    consumer = Consumer(request.step, request.device)

    def measure(candidate: Candidate) -> TrialResult:
        try:
            return run_trial(request, candidate.config, consumer=consumer, limit_s=candidate.limit_s,
                             measure_consumer=candidate.first, threads_tuned=search.settings.tune_threads,
                             memory=candidate.memory)
        except Exception as err:  # the user's own error, re-raised unchanged by run_trial
            if candidate.config.threads > 1 and not isinstance(err, TuningError):
                warn_user(f"the dataset raised with threads={candidate.config.threads} per process "
                          f"({type(err).__name__}); if it does not with threads=False, its __getitem__ is not "
                          f"thread-safe (e.g. one file handle shared by all threads): open one per thread "
                          f"(threading.local()) or leave threads=False")
            raise

    try:
        with preserved(parts_of_kwargs(request.loader_kwargs)):  # trials iterate the user's sampler, run their step
            with SignalGuard():  # between two trials too (NOTE [ Asynchronous exceptions ]); each trial nests its own
                result = drive(search.steps(), measure)
    finally:
        release_cached(request.device)
    warn_if_bound_by_open_files(search, result)
    log.info("tuned %s in %.1f s: %s", type(request.dataset).__name__, result.seconds, result.config.label())
    return result


def warn_if_bound_by_open_files(search: Search, result: TuneResult) -> None:
    settings = search.settings
    if settings.cap_by_open_files and 0 < settings.cap <= result.config.num_workers:
        warn_user(f"num_workers={settings.cap} is the most the open-files limit allows ({settings.cap_reason}; each "
                  f"worker needs about 32 descriptors) and more workers might load faster: raise it, e.g. "
                  f"`ulimit -n 4096` in the shell that starts training (LimitNOFILE= for a systemd service)")
