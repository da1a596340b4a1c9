"""``tune()``: the search (``_search.py``) driven by trials, each a short real DataLoader timed against the consumer
step before training starts (see ``trial.py``).
"""
from __future__ import annotations

import contextlib
import logging
import random
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import IterableDataset

from . import policy
from ._consumer import Consumer, Step
from ._device import release_cached, resolve_device
from ._search import (DEFAULT_BUDGET_S, Agreement, Candidate, Outcome, Progress, Search, Steps, fallback_result,
                      trial_limit)
from ._shards import shard_count
from ._failures import thread_failure
from ._validate import check_dataset, check_loader_kwargs, check_threads, check_tuning_arguments
from .errors import TuningError, warn_user
from .probe import MachineProfile, open_files_limit, probe_machine, with_saved_disk
from .results import LoaderConfig, TrialResult, TuneResult
from .trial import run_trial

__all__ = ["DEFAULT_BUDGET_S", "TUNED_KNOBS", "drive", "fallback_result", "preserved_rng", "trial_limit", "tune",
           "tune_with"]

log = logging.getLogger("autoloader.tuner")

TUNED_KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Trials draw from the global RNGs (worker seeds, augmentations); put them back so tuning is invisible."""
    torch_state = torch.random.get_rng_state()
    py_state = random.getstate()
    np_state = np.random.get_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(py_state)
        np.random.set_state(np_state)


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
    **dataloader_kwargs: Any,
) -> TuneResult:
    """Find the DataLoader configuration that feeds ``step`` fastest with the fewest workers, as ``make_loader``
    would, without building the loader or touching the cache.

    Takes ``make_loader``'s arguments: every other keyword goes to each trial's ``DataLoader`` unchanged, and a
    ``num_workers``, ``prefetch_factor``, ``pin_memory`` or ``persistent_workers`` given explicitly is never tuned.
    ``budget`` is in seconds (default 30); the result is the best found when it runs out, at most one trial's limit
    later. ``threads``: False (default), an int (every candidate fetches with that many threads per process) or True
    (the tuner chooses threads per process, see ``make_loader``). The global RNG states are left as they were. Raises
    ``TuningError`` when autoloader itself fails.
    """
    check_tuning_arguments(batch_size=batch_size, step=step, budget=budget, max_workers=max_workers)
    check_dataset(dataset)
    threads = check_threads(threads, dataset)
    check_loader_kwargs(dataset, batch_size=batch_size, shuffle=shuffle, kwargs=dataloader_kwargs)
    kwargs = dict(dataloader_kwargs)
    fixed = {k: kwargs.pop(k) for k in TUNED_KNOBS if k in kwargs}
    return tune_with(dataset, batch_size, step=step, device=resolve_device(device), shuffle=shuffle,
                     normalize=normalize, dtype=dtype, input_key=input_key, budget=budget, max_workers=max_workers,
                     loader_kwargs=kwargs, fixed=fixed, threads=threads)


def tune_with(
    dataset: Any,
    batch_size: int,
    *,
    step: Step,
    device: torch.device,
    shuffle: bool,
    normalize: Any,
    dtype: Optional[torch.dtype],
    input_key: Any,
    budget: Optional[float],
    max_workers: Optional[int],
    loader_kwargs: Mapping[str, Any],
    fixed: Mapping[str, Any],
    profile: Optional[MachineProfile] = None,
    agreement: Optional[Agreement] = None,
    progress: Optional[Progress] = None,
    tolerance: float = policy.DEFAULT_TOLERANCE,
    threads: Union[bool, int] = False,
) -> TuneResult:
    """``tune`` with its plumbing, for ``make_loader`` and the CLI: arguments already checked (``threads`` by
    ``check_threads``), the knobs the user ``fixed`` apart from the other ``loader_kwargs``, the machine ``profile``
    (probed when None, with the saved disk figures), how ranks agree, and a ``progress`` callback per trial."""
    search = new_search(dataset, batch_size, device=device, fixed=fixed, budget=budget, max_workers=max_workers,
                        profile=profile, agreement=agreement, progress=progress, tolerance=tolerance, threads=threads)
    consumer = Consumer(step, device)

    def measure(candidate: Candidate) -> TrialResult:
        try:
            return run_trial(dataset, batch_size, candidate.config, consumer=consumer, shuffle=shuffle,
                             loader_kwargs=loader_kwargs, normalize=normalize, dtype=dtype, input_key=input_key,
                             time_limit=candidate.limit_s, measure_consumer=candidate.first)
        except Exception as err:  # the user's own error, re-raised unchanged by run_trial
            if candidate.config.threads == 1 or isinstance(err, TuningError):
                raise
            if search.tune_threads:  # threads the tuner chose to try: a failed candidate (warns)
                return thread_failure(candidate.config, err)
            warn_user(f"the dataset raised with threads={candidate.config.threads} per process ({type(err).__name__}); "
                      f"if it does not with threads=False, its __getitem__ is not thread-safe (e.g. one file handle "
                      f"shared by all threads): open one per thread (threading.local()) or leave threads=False")
            raise

    try:
        with preserved_rng():
            result = drive(search.steps(), measure)
    finally:
        release_cached(device)
    warn_if_bound_by_open_files(search, result)
    log.info("tuned %s in %.1f s: %s", type(dataset).__name__, result.seconds, result.config.label())
    return result


def new_search(dataset: Any, batch_size: int, *, device: torch.device, fixed: Mapping[str, Any],
               budget: Optional[float], max_workers: Optional[int], profile: Optional[MachineProfile] = None,
               agreement: Optional[Agreement] = None, progress: Optional[Progress] = None,
               tolerance: float = policy.DEFAULT_TOLERANCE, start: Optional[LoaderConfig] = None,
               threads: Union[bool, int] = False) -> Search:
    """The search for ``dataset`` on this machine: its bounds (the user's ``max_workers``, else the open-files limit,
    and the shards an IterableDataset reads) and budgets, for trials or online tuning alike. ``threads`` as
    ``check_threads`` returns it."""
    unknown = set(fixed) - set(TUNED_KNOBS)
    if unknown:
        raise ValueError(f"fixed may only hold {TUNED_KNOBS}, got {sorted(unknown)}")
    profile = profile if profile is not None else with_saved_disk(probe_machine(disk=False, gpus=False))
    usable = profile.cpu.usable or profile.cpu.logical or 1
    nofile = open_files_limit()[0]
    cap = policy.default_max_workers(usable_cpus=usable, nofile=nofile)
    by_nofile = cap < policy.default_max_workers(usable_cpus=usable, nofile=None)
    cap_reason = f"at most {cap} workers: `ulimit -n` is {nofile}" if by_nofile else ""
    if max_workers is not None:
        cap, cap_reason, by_nofile = max_workers, "", False
    shards = shard_count(dataset) if isinstance(dataset, IterableDataset) else None
    if shards is not None and shards < cap:
        cap, by_nofile = shards, False
        cap_reason = f"at most {shards} workers: the dataset reads {shards} shards"
    return Search(batch_size=batch_size, device=device, fixed=dict(fixed),
                  budget=DEFAULT_BUDGET_S if budget is None else float(budget), cap=cap, usable_cpus=usable,
                  memory_budget=profile.memory.budget_bytes, shm_free=profile.shm.free_bytes, tolerance=tolerance,
                  agreement=agreement, progress=progress, cap_reason=cap_reason, cap_by_open_files=by_nofile,
                  start=start, threads=threads, disk_mb_s=profile.disk.seq_read_mb_s if profile.disk else None)


def warn_if_bound_by_open_files(search: Search, result: TuneResult) -> None:
    if search.cap_by_open_files and 0 < search.cap <= result.num_workers:
        warn_user(f"num_workers={search.cap} is the most the open-files limit allows ({search.cap_reason}; each "
                  f"worker needs about 32 descriptors) and more workers might load faster: raise it, e.g. "
                  f"`ulimit -n 4096` in the shell that starts training (LimitNOFILE= for a systemd service)")
