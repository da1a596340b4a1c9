"""``tune()``: the search (``search/search.py``) driven by trials, each a short real DataLoader timed against the
consumer step before training starts (``measure/trial.py``).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch

from ..errors import TuningError, warn_user
from ..loader.device import release_cached
from ..loader.rng import parts_of_kwargs, preserved
from ..measure.consumer import Consumer, Step
from ..measure.trial import run_trial
from ..probe import MachineProfile, probe_machine, with_saved_disk
from ..request import Request
from ..results import TrialResult, TuneResult
from ..search import policy
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
    """Find the DataLoader configuration that feeds ``step`` fastest with the fewest workers, as ``make_loader``
    would, without building the loader or touching the cache.

    Takes ``make_loader``'s arguments: every other keyword goes to each trial's ``DataLoader`` unchanged, and a
    ``num_workers``, ``prefetch_factor``, ``pin_memory`` or ``persistent_workers`` given explicitly is never tuned.
    ``budget`` is in seconds (default 30); the result is the best found when it runs out, at most one trial's limit
    later. ``threads``: False (default), an int (every candidate fetches with that many threads per process) or True
    (the tuner chooses threads per process, see ``make_loader``). ``memory_budget``: bytes, or a fraction of the
    available memory (default 0.5), as ``make_loader``. ``native_threads``: None (default), an int or False, as
    ``make_loader``. Every RNG state is left as it was: torch's, Python's and
    numpy's global ones, the GPUs', the generators and ``state_dict()`` of the sampler and batch sampler. Raises
    ``TuningError`` when autoloader itself fails.
    """
    request = Request.checked(dataset, batch_size, shuffle=shuffle, step=step, device=device, normalize=normalize,
                              dtype=dtype, input_key=input_key, budget=budget, max_workers=max_workers,
                              threads=threads, memory_budget=memory_budget, native_threads=native_threads,
                              dataloader_kwargs=dataloader_kwargs)
    return tune_with(request)


def tune_with(request: Request, profile: Optional[MachineProfile] = None, *, progress: Optional[Progress] = None,
              tolerance: float = policy.DEFAULT_TOLERANCE) -> TuneResult:
    """``tune`` for a checked ``request`` (``make_loader`` and the CLI): on the machine ``profile`` (probed when
    None, with the saved disk figures), ranks agreeing through the request's group, ``progress`` after each trial."""
    profile = profile if profile is not None else with_saved_disk(probe_machine(disk=False, gpus=False))
    group = request.group
    search = Search(request, profile, budget=DEFAULT_BUDGET_S if request.budget is None else float(request.budget),
                    coordinator=group.coordinator() if group is not None else None, progress=progress,
                    tolerance=tolerance)
    consumer = Consumer(request.step, request.device)

    def measure(candidate: Candidate) -> TrialResult:
        try:
            return run_trial(request, candidate.config, consumer=consumer, limit_s=candidate.limit_s,
                             measure_consumer=candidate.first, threads_tuned=search.settings.tune_threads)
        except Exception as err:  # the user's own error, re-raised unchanged by run_trial
            if candidate.config.threads > 1 and not isinstance(err, TuningError):
                warn_user(f"the dataset raised with threads={candidate.config.threads} per process "
                          f"({type(err).__name__}); if it does not with threads=False, its __getitem__ is not "
                          f"thread-safe (e.g. one file handle shared by all threads): open one per thread "
                          f"(threading.local()) or leave threads=False")
            raise

    try:
        with preserved(parts_of_kwargs(request.loader_kwargs)):  # trials iterate the user's sampler, run their step
            result = drive(search.steps(), measure)
    finally:
        release_cached(request.device)
    warn_if_bound_by_open_files(search, result)
    log.info("tuned %s in %.1f s: %s", type(request.dataset).__name__, result.seconds, result.config.label())
    return result


def warn_if_bound_by_open_files(search: Search, result: TuneResult) -> None:
    if search.settings.cap_by_open_files and 0 < search.settings.cap <= result.config.num_workers:
        warn_user(f"num_workers={search.settings.cap} is the most the open-files limit allows ({search.settings.cap_reason}; each "
                  f"worker needs about 32 descriptors) and more workers might load faster: raise it, e.g. "
                  f"`ulimit -n 4096` in the shell that starts training (LimitNOFILE= for a systemd service)")
