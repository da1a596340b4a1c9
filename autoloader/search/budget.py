"""What a candidate configuration would take of the memory budget (``memory_budget.py``), and the checks that keep it
under: before it starts, at its first batch, and on a cached result; what one worker is sized at. Pure functions of
the machine's facts and of what trials measured (tested on tables).

# NOTE [ Memory budget ]
# The budget is decided in one place (``memory_budget.resolve_budget``): ``make_loader(memory_budget=...)`` bytes as
# given ("user"), or a fraction (default ``DEFAULT_FRACTION``) of what this process may still allocate, which the probe
# reads as the smaller of the machine's available memory and the cgroup's headroom (limit - working set), and which
# ``distributed.Group.share_profile`` already divided among the ranks of a node. Half is tf.data's anchor for its
# ``ram_budget``: the training process itself (model, optimizer, CUDA context, the batches it holds) needs the rest.
# A candidate's footprint (``footprint``, footprint.py) is what autoloader adds to the process tree:
#   workers      num_workers x one worker's private memory (USS) measured, plus its growth during the trial beyond
#                what any worker shows once (``footprint.window_growth_bytes``: the batches it was building); one
#                worker is the mean of those read (``procs.WorkerSample.mean_uss``), so that the count times it is
#                the pool's sum: the largest is a worker holding the samples and the output of the batch it builds,
#                which the term below counts already (20 MiB beside 12 idle, waiting-bound 384 KiB samples: counted
#                13 times, 104 MiB, it refused pools whose epochs peaked at 77-98 % of the budget);
#   in flight    ``LoaderConfig.shm_batches``: those in flight + 2, in /dev/shm (tmpfs: RAM, charged to the cgroup),
#                which is also checked against free /dev/shm as a limit of its own (``shm_need_bytes``);
#   pinned       as many page-locked copies when pin_memory (the pin thread copies every batch it takes);
#   threads      with threads > 1, each loading process holds a batch's samples in its threads' hands before collate
#                (one per-thread share of the batch per thread: a batch per process).
# Every check uses ``footprint``: ``budget_guard`` before a candidate starts, ``first_batch_check`` once its workers
# made their first batch, the choice at the end (a candidate whose measured footprint is over the budget is not
# chosen), and ``no_longer_fits`` on a cached result.
# Before a worker was measured, it is sized conservatively (``per_worker_estimate``): this process's private memory
# (``probe.private_bytes``: its anonymous pages, the most a forked worker can ever copy, and about what a spawned one
# builds again), so that no pool starts whose footprint is not known to fit, from the first fork on. (Not sizing it
# at all, and checking the workers only at their first batch, let a prior of 25 workers start under 380 MiB and peak
# at 1.36x the budget; 22 workers reading a list of 300,000 objects under 700 MiB measured 1,210 MiB in their window.)
# A forked worker measures far less than that bound (15-20 MiB beside 150-350 MiB of this process), so the first pool
# is the most workers that fit at the conservative size, its workers' USS is read at their first batch
# (``MemoryCheck``, trials and online alike; ``procs.MEMORY_SAMPLE`` of them, spread over the pool, sizing all: one
# read costs 2-20 ms), and the search then grows the pool to the most that fit at the measured size
# (``search/online_plan.py``'s prior; the trials' climb goes up from it): one more start in the first epoch where
# the budget is tight, none where it is not (half of 23 GiB holds 64 workers of 150 MiB). When the footprint measured
# at the first batch, plus the growth an earlier candidate's workers showed during their window beyond the noise, is
# over the budget, the candidate stops at once, "skipped" with the figures, and its measured worker size guards every
# later candidate (``per_worker_bytes``: sized by candidates of two workers or more, a lone worker holding alone every
# page this process writes meanwhile). What this admits: once a worker was measured, the process tree passes the
# budget only by what a worker holds beyond that size (its own allocations: a worker_init_fn that allocates more is
# not bounded).
# Copy-on-read (NOTE [ Copy-on-read ] in measure/advice.py) makes workers grow with every sample they read; a trial
# sees the start of it, and the choice is made on the forecast of an epoch (NOTE [ Copy-on-read forecast ] in
# growth.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..config import LoaderConfig
from .._text import mib
from ..results import TrialResult, TuneResult
from .footprint import Footprint, footprint, shm_need_bytes, window_growth_bytes

__all__ = ["SHM_MARGIN", "Footprint", "MemoryCheck", "budget_guard", "first_batch_check", "footprint",
           "measured_batch_bytes", "memory_check", "no_longer_fits", "overlap_guard", "per_worker_bytes",
           "per_worker_estimate", "shm_need_bytes", "sized", "skipped_for_memory", "trial_footprint",
           "worker_growth_bytes"]

SHM_MARGIN = 0.9
"""/dev/shm is full well before its last byte: keep this share of what is free."""


def trial_footprint(trial: TrialResult) -> Optional[int]:
    """The footprint a trial measured: its own workers' memory (a worker's USS plus growth, per worker)."""
    if trial.config.num_workers and trial.worker_uss_bytes is None:
        return None
    per_worker = None if trial.worker_uss_bytes is None else trial.worker_uss_bytes + window_growth_bytes(trial)
    return footprint(trial.config, per_worker_bytes=per_worker, batch_bytes=trial.batch_bytes).total_bytes


def budget_guard(config: LoaderConfig, *, per_worker_bytes: Optional[int], batch_bytes: Optional[int],
                 budget_bytes: Optional[int], shm_free_bytes: Optional[int]) -> Optional[str]:
    """Why ``config`` would not fit in the memory budget or in free /dev/shm, or None (an unknown figure passes).
    Before a worker was measured (``per_worker_bytes`` None) what is known is checked: the batches in /dev/shm, pinned
    and in threads' hands, which no worker size can make smaller."""
    need = footprint(config, per_worker_bytes=per_worker_bytes, batch_bytes=batch_bytes)
    if config.num_workers and budget_bytes is not None and need.least_bytes > budget_bytes:
        unmeasured = need.workers_bytes is None
        return (f"memory: {config.num_workers} workers need{' at least' if unmeasured else ''} "
                f"{mib(need.least_bytes)} ({need.describe()}{'; their workers not measured yet' if unmeasured else ''})"
                f", over the memory budget of {mib(budget_bytes)}; pass memory_budget= (bytes, or a fraction of the "
                f"available memory) to allow more, or max_workers= to try fewer")
    if config.num_workers and batch_bytes is not None and shm_free_bytes is not None and \
            need.shm_bytes > SHM_MARGIN * shm_free_bytes:
        return (f"/dev/shm: {config.num_workers} workers x prefetch {config.prefetch_factor} batches of "
                f"{mib(batch_bytes)} need {mib(need.shm_bytes)}, only {mib(shm_free_bytes)} free (Docker: --shm-size)")
    return None


@dataclass(frozen=True)
class MemoryCheck:
    """What a candidate's workers are checked against at their first batch (``first_batch_check``): the budget, and
    the growth per worker an earlier candidate's workers showed during their window (0: none measured); ``census``:
    whether its window reads which pages a worker copies (NOTE [ Copy-on-read forecast ] in growth.py: 25-80 ms at
    each edge, not worth it where its workers could copy all of this process and still fit)."""

    budget_bytes: int
    growth_bytes: int = 0
    census: bool = True

    def __call__(self, config: LoaderConfig, uss_bytes: Optional[int], batch_bytes: Optional[int]) -> Optional[str]:
        """``first_batch_check`` with this check (how a measuring window calls it: measure/window.py)."""
        return first_batch_check(config, self, uss_bytes=uss_bytes, batch_bytes=batch_bytes)


def first_batch_check(config: LoaderConfig, check: Optional[MemoryCheck], *, uss_bytes: Optional[int],
                      batch_bytes: Optional[int]) -> Optional[str]:
    """Why ``config`` must stop at its first batch, where one worker's USS is ``uss_bytes`` (the mean of those read):
    its footprint with that worker size plus ``check.growth_bytes`` is over ``check.budget_bytes`` (NOTE [ Memory
    budget ]); None when it fits, or when nothing is checked or measured. Pure."""
    if check is None or uss_bytes is None or config.num_workers == 0:
        return None
    need = footprint(config, per_worker_bytes=uss_bytes + check.growth_bytes, batch_bytes=batch_bytes)
    total = need.total_bytes
    if total is None or total <= check.budget_bytes:
        return None
    grown = f" and {mib(check.growth_bytes)} each of the growth measured before" if check.growth_bytes else ""
    return (f"memory: stopped at its first batch: {config.num_workers} workers of {mib(uss_bytes)} (measured there"
            f"{grown}) need {mib(total)} ({need.describe()}), over the memory budget of {mib(check.budget_bytes)}; "
            f"pass memory_budget= (bytes, or a fraction of the available memory) to allow more, or max_workers= to "
            f"try fewer")


def overlap_guard(running: TrialResult, following: LoaderConfig, trials: Sequence[TrialResult], *,
                  budget_bytes: Optional[int]) -> Optional[str]:
    """Why ``following`` must not start while ``running``'s workers serve their tail (a hidden switch, NOTE [ Hidden
    switch ] in tuning/handover.py): the two footprints together, ``running``'s as measured and ``following``'s with a
    worker sized by ``trials`` (``per_worker_bytes``; nothing while none was measured), over the budget. None when
    they fit or nothing is checked. Pure."""
    if budget_bytes is None or not following.num_workers or not running.config.num_workers:
        return None
    batch_bytes = running.batch_bytes or measured_batch_bytes(trials)
    here = trial_footprint(running) or 0
    there = footprint(following, per_worker_bytes=per_worker_bytes(trials) or 0, batch_bytes=batch_bytes).total_bytes
    if (there or 0) + here <= budget_bytes:
        return None
    return (f"{following.label()} ({mib(there or 0)}) beside the {mib(here)} of {running.config.label()} serving its "
            f"tail would pass the memory budget of {mib(budget_bytes)}")


def measured_batch_bytes(trials: Sequence[TrialResult]) -> Optional[int]:
    """A batch's size as the first of ``trials`` that measured one read it; None when none did."""
    return next((t.batch_bytes for t in trials if t.batch_bytes is not None), None)


def per_worker_bytes(trials: Sequence[TrialResult]) -> Optional[int]:
    """What one worker needs, from trials that measured it (``sized``): the most any measured, its USS plus its growth
    during the trial beyond the noise (``footprint.window_growth_bytes``; copy-on-read keeps growing, see NOTE
    [ Copy-on-read ]); None when no trial measured a worker."""
    return max((t.worker_uss_bytes + window_growth_bytes(t) for t in sized(trials) if t.worker_uss_bytes is not None),
               default=None)


def worker_growth_bytes(trials: Sequence[TrialResult]) -> int:
    """The most one worker grew during a window beyond the noise (``footprint.window_growth_bytes``), of the trials
    ``sized`` keeps (0: none measured)."""
    return max((window_growth_bytes(t) for t in sized(trials)), default=0)


def sized(trials: Sequence[TrialResult]) -> Sequence[TrialResult]:
    """The trials that size a worker for any count: those with two workers or more when one measured a worker. A lone
    worker also holds alone every page the main process writes meanwhile (measure/cow.py): its USS measured 59 MiB
    online where 2 or more measured 15-20 MiB each, and sized as 59 MiB, 7 workers were refused under 380 MiB."""
    several = [t for t in trials if t.config.num_workers >= 2 and t.worker_uss_bytes is not None]
    return several or [t for t in trials if t.worker_uss_bytes is not None]


def skipped_for_memory(trial: TrialResult) -> bool:
    """The candidate was not started, or stopped at its first batch, for the memory budget or /dev/shm (not for the
    time budget: NOTE [ Candidate time limit ] in candidates.py)."""
    return trial.status == "skipped" and (trial.reason or "").startswith(("memory", "/dev/shm"))


def no_longer_fits(result: TuneResult, *, budget_bytes: Optional[int], shm_free_bytes: Optional[int]) -> Optional[str]:
    """Why a cached configuration would not fit in today's memory budget or free /dev/shm (``budget.budget_guard``,
    the check every candidate passed), or None."""
    return budget_guard(result.config, per_worker_bytes=per_worker_bytes(result.trials),
                        batch_bytes=measured_batch_bytes(result.trials),
                        budget_bytes=budget_bytes, shm_free_bytes=shm_free_bytes)


def per_worker_estimate(measured_bytes: Optional[int], *, main_private_bytes: Optional[int]) -> Optional[int]:
    """One worker's memory for the checks before a candidate starts: as measured (``per_worker_bytes``) once a worker
    candidate reached its first batch; before that, this process's private memory (``main_private_bytes``,
    ``probe.private_bytes``), the most a forked worker can ever copy and about what a spawned one builds again: a
    conservative size, so that no pool starts that is not known to fit (NOTE [ Memory budget ]); None when neither is
    known."""
    return measured_bytes if measured_bytes is not None else main_private_bytes


def memory_check(config: LoaderConfig, trials: Sequence[TrialResult], *, budget_bytes: Optional[int],
                 main_private_bytes: Optional[int], batch_bytes: Optional[int],
                 explicit: bool = False) -> Optional[MemoryCheck]:
    """What ``config``'s workers are checked against at their first batch: the budget and the most a worker grew
    during an earlier window of ``trials``; the census where the budget is the user's (``explicit``: what tells reads
    from writes, whose growth the forecast extends so differently, NOTE [ Copy-on-read forecast ]), else only where its
    workers, each copying all of this process's private memory (the most a fork can copy) on top of their own size,
    would not fit. None without workers or a budget."""
    if config.num_workers == 0 or budget_bytes is None:
        return None
    worst = None if main_private_bytes is None else footprint(
        config, per_worker_bytes=main_private_bytes + (per_worker_bytes(trials) or 0),
        batch_bytes=batch_bytes).total_bytes
    return MemoryCheck(budget_bytes, worker_growth_bytes(trials),
                       census=explicit or worst is None or worst > budget_bytes)
