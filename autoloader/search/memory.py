"""The memory a loader may take, and what each configuration takes of it, in one place: the budget (``resolve_budget``:
``memory_budget=`` and what the probe read of this process's memory, decided here and nowhere else), the footprint
of a configuration (``footprint``: the one formula every check and forecast uses), how much a candidate's workers
grow during its trial, by the end of an epoch and across epochs (the copy-on-read forecast, ``forecast_bytes``), and
the checks that keep a search under the budget: before a candidate starts (``budget_guard``, ``forecast_guard``), at
its first batch (``MemoryCheck``), on a cached result (``no_longer_fits``); what one worker is sized at
(``per_worker_estimate``). Pure functions of the machine's facts and of what trials measured, tested on tables
(tests/search/test_memory.py, test_memory_forecast.py, test_memory_footprint.py, test_memory_budget.py).

# NOTE [ Memory budget ]
# The budget is decided in one place (``resolve_budget``): ``make_loader(memory_budget=...)`` bytes as
# given ("user"), or a fraction (default ``DEFAULT_FRACTION``) of what this process may still allocate, which the probe
# reads as the smaller of the machine's available memory and the cgroup's headroom (limit - working set), and which
# ``distributed.Group.share_profile`` already divided among the ranks of a node. Half is tf.data's anchor for its
# ``ram_budget``: the training process itself (model, optimizer, CUDA context, the batches it holds) needs the rest.
# A candidate's footprint (``footprint``) is what autoloader adds to the process tree:
#   workers      num_workers x one worker's private memory (USS) measured, plus its growth during the trial beyond
#                what any worker shows once (``window_growth_bytes``: the batches it was building); one
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
# sees the start of it, and the choice is made on the forecast of an epoch (NOTE [ Copy-on-read forecast ]
# below).
#
# NOTE [ Copy-on-read forecast ]
# A trial sees a worker's first few hundred samples; an epoch is its 1/num_workers share of the dataset. The USS growth
# between the two edges of a window cannot tell the one from the other: a worker reading a list of 300,000 objects
# grew 1.5-2.5 MiB in a trial (4 KiB, one page, per sample), a worker reading tensors 0.1-1 MiB (allocator, batches),
# and a noise floor above the second hid the first: 32 workers were chosen under a 700 MiB budget and their epoch
# peaked at 1,343 MiB. So the window also reads which pages one worker shares with this process, at its first batch
# and at its end (measure/cow.py, Linux pagemap; with two workers or more): a page shared then and its own now is a
# copy, whatever else its USS does. ``copied_per_sample``: those copies over the samples it made (``samples_made``:
# its share of the window's batches and the burst), 0 below ``COPY_NOISE_BYTES`` or ``COPY_NOISE_PER_SAMPLE`` (what
# any worker copies: its allocator reusing inherited heap pages). A dataset that copies less than that per sample
# (small objects read in order) goes unseen here, as with the USS before.
# The copies saturate: a page is copied once, and the inherited objects are finite. ``worker_copy_span_bytes`` is
# what the worker shared within the address span its copies fell in (trimmed of stray ones, widened to the range
# uniform copies cover: the objects its reads copy from; 181 MiB measured for that list, whose 300,000 objects take
# 160 MiB, in a heap of 244 MiB). Over an epoch of N samples read uniformly at random, each worker reading 1/n of them
# and each sample copying ``per_sample`` bytes, the span's pages are touched T = N x per_sample / span times in all, so
# one worker copies span x (1 - (1 - 1/n)^T) (``copy_forecast``; at most the linear per_sample x N/n). That is the
# expectation for uniform reads (reads in order copy less: neighbours share pages) and, at a given T, the most any
# spread of objects over pages gives (the bracket is concave in the objects per page); the span over-counts what is
# not the dataset's, which only raises it. Measured on that list, 4 workers: 646 MiB forecast, 605-633 MiB peaked.
# ``epoch_growth_bytes`` adds what else a worker's USS gained beyond ``growth_noise_bytes`` (the runs, a per-worker
# cache), linearly; ``forecast_bytes`` puts it in the same ``footprint``. Where the census cannot be read (not Linux, a
# sandbox), the USS growth beyond ``growth_noise_bytes`` is extended linearly, as before (measured on a dataset that
# keeps 128 KiB per sample: 0.82-1.17 x that with 2 and 4 workers). Workers kept across epochs (persistent) copy the
# whole span in time: ``lasting_bytes``, which ``verdict.keep_workers_alive`` reads.
# Once a candidate measured copies, ``forecast_guard`` refuses before it starts any count forecast past the budget
# (``Search.guard``): the choice would refuse it, and as a ceiling it sends the search below it. Without it the search
# climbed 8 -> 32 -> 16 -> 23 on that list under 700 MiB, all forecast past it, and fell back to no workers. The count
# that measured the copies is a ceiling too once it is forecast past the budget (``Search.rates``,
# ``policy.over_budget``): counted as measured, it left the search nothing to try below a refused half, and the list
# chose no workers in 2 of 3 runs where 4 workers fit at 88 %; the climb goes halfway to such a ceiling.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from .._text import mib
from ..probe.machine import MemoryInfo
from ..config import LoaderConfig
from ..results import TrialResult, TuneResult

__all__ = ["BROKEN_RUNS", "COPY_NOISE_BYTES", "COPY_NOISE_PER_SAMPLE", "DEFAULT_FRACTION", "DENSE",
           "GROWTH_NOISE_BYTES", "RUNS_BEYOND_CHANCE", "SHM_MARGIN", "budget_guard", "BudgetArg", "copied_in_window",
           "copied_per_sample", "copy_forecast", "copy_rate", "epoch_growth_bytes", "first_batch_check", "Footprint",
           "footprint", "forecast_bytes", "forecast_guard", "growth_noise_bytes", "growth_per_sample", "lasting_bytes",
           "lone_growth_rate", "lone_reach", "measured_batch_bytes", "memory_check", "MemoryBudget", "MemoryCheck",
           "no_longer_fits", "overlap_guard", "per_worker_bytes", "per_worker_estimate", "resolve_budget",
           "samples_made", "scattered_bytes", "shm_need_bytes", "sized", "skipped_for_memory", "trial_footprint",
           "window_growth_bytes", "worker_growth_bytes"]

DEFAULT_FRACTION = 0.5
"""The share of this process's available memory (cgroup-aware, per local rank) the loader may take by default."""
BudgetArg = Union[None, int, float]


@dataclass(frozen=True)
class MemoryBudget:
    """The loader's memory budget: ``bytes`` (None: unknown, nothing is checked), the ``fraction`` of ``basis_bytes``
    it is (None for bytes the user gave), and ``source``: "user" (bytes given), "cgroup" (a fraction of the cgroup's
    headroom, the tighter), "available" (a fraction of the machine's available memory) or "unknown"."""

    bytes: Optional[int]
    fraction: Optional[float]
    source: str
    basis_bytes: Optional[int] = None
    user_fraction: bool = False

    def describe(self) -> str:
        if self.bytes is None:
            return "unknown (the memory available could not be read): nothing is checked"
        if self.source == "user":
            return f"{mib(self.bytes)} (memory_budget={self.bytes}, set by the user)"
        basis = "the cgroup's headroom (limit - used)" if self.source == "cgroup" else "the available memory"
        given = f"memory_budget={self.fraction:g}" if self.user_fraction else "the default"
        return f"{mib(self.bytes)} ({self.fraction:g} of {mib(self.basis_bytes or 0)}, {basis}; {given})"


def resolve_budget(memory_budget: BudgetArg, memory: MemoryInfo) -> MemoryBudget:
    """THE memory budget: ``memory_budget`` as checked by ``_validate.check_memory_budget`` (None, bytes as an int,
    or a fraction in (0, 1]) over the profile's ``memory`` (a ``MemoryInfo``: ``budget_bytes`` is what may still be
    allocated, already divided among local ranks; ``headroom_bytes`` says whether the cgroup is the tighter)."""
    if isinstance(memory_budget, int) and not isinstance(memory_budget, bool):
        return MemoryBudget(int(memory_budget), None, "user")
    fraction = DEFAULT_FRACTION if memory_budget is None else float(memory_budget)
    basis = memory.budget_bytes
    if basis is None:
        return MemoryBudget(None, fraction, "unknown", None, memory_budget is not None)
    headroom, available = memory.headroom_bytes, memory.available_bytes
    cgroup = headroom is not None and (available is None or headroom < available)
    return MemoryBudget(int(fraction * basis), fraction, "cgroup" if cgroup else "available", basis,
                        memory_budget is not None)


@dataclass(frozen=True)
class Footprint:
    """What one configuration adds to the process tree's memory (see NOTE [ Memory budget ]); ``workers_bytes`` is
    None when one worker's memory is not known yet."""

    workers_bytes: Optional[int]
    shm_bytes: int
    pinned_bytes: int
    threads_bytes: int

    @property
    def total_bytes(self) -> Optional[int]:
        if self.workers_bytes is None:
            return None
        return self.workers_bytes + self.shm_bytes + self.pinned_bytes + self.threads_bytes

    @property
    def least_bytes(self) -> int:
        """``total_bytes``, or, while one worker's memory is not known, the rest: what no worker size makes smaller."""
        total = self.total_bytes
        return self.shm_bytes + self.pinned_bytes + self.threads_bytes if total is None else total

    def describe(self) -> str:
        parts = [("workers", self.workers_bytes), ("batches in /dev/shm", self.shm_bytes),
                 ("pinned copies", self.pinned_bytes), ("thread buffers", self.threads_bytes)]
        return " + ".join(f"{mib(v)} {name}" for name, v in parts if v)


def shm_need_bytes(config: LoaderConfig, batch_bytes: int) -> int:
    """/dev/shm the batches in flight take (``LoaderConfig.shm_batches``)."""
    return config.shm_batches() * batch_bytes


def footprint(config: LoaderConfig, *, per_worker_bytes: Optional[int], batch_bytes: Optional[int]) -> Footprint:
    """THE footprint of ``config`` when one worker takes ``per_worker_bytes`` (USS plus growth) and a batch
    ``batch_bytes`` (unknown: 0 for the batch parts)."""
    n, batch = config.num_workers, batch_bytes or 0
    shm = shm_need_bytes(config, batch)
    pinned = (shm if n else 2 * batch) if config.pin_memory else 0
    threads = max(1, n) * config.threads * math.ceil(batch / config.threads) if config.threads > 1 else 0
    workers = 0 if n == 0 else (None if per_worker_bytes is None else n * per_worker_bytes)
    return Footprint(workers, shm, pinned, threads)


GROWTH_NOISE_BYTES = 4 * 2**20
"""A worker's USS grows this much once in any trial, whatever it reads: allocator warm-up, the collector's first pass
over inherited objects, batches being built (measured 1-3 MiB in a pytest process)."""


def growth_noise_bytes(trial: TrialResult) -> int:
    """Growth any worker shows once during a trial: ``GROWTH_NOISE_BYTES``, or the batches a worker holds
    (``LoaderConfig.worker_batches``) when more (a batch built in shared memory counts as the worker's own until the
    main process maps it)."""
    return max(GROWTH_NOISE_BYTES, trial.config.worker_batches() * (trial.batch_bytes or 0))


def window_growth_bytes(trial: TrialResult) -> int:
    """What one worker of ``trial`` grew during its window beyond what any worker shows once (``growth_noise_bytes``):
    the growth every memory check adds to a worker's measured size; 0 when not measured. Below the noise,
    the difference of two readings is the batches a worker was building at each, which its size already holds (a
    waiting-bound worker of 12 MiB read 3.2 MiB "growth" from 6 MiB batches, and 13 workers were refused under a
    budget their epoch peaked at 82 % of)."""
    return max(0, (trial.worker_uss_growth_bytes or 0) - growth_noise_bytes(trial))


DENSE = 0.25
"""Copies filling more than this of their span are written, not read, unless they lie in runs about as often as
chance would put them (``scattered_bytes``): a trial's reads of single objects at random copy a few percent of the
span they fall in (1 % measured on a list of 300,000 objects), reads of many objects a sample can copy half of it."""
RUNS_BEYOND_CHANCE = 0.25
"""Copies lying in runs this share of them beyond what chance gives at their density were (in those runs) written."""
BROKEN_RUNS = 0.2
"""Dense copies with fewer runs than this share of chance's were written, their runs broken by pages never present."""
COPY_NOISE_BYTES = 2**20
COPY_NOISE_PER_SAMPLE = 1024
"""Pages a worker copies in any trial, whatever it reads, mostly its allocator reusing the free space of inherited
heap pages: measured 0.2-0.8 MiB (0.1-3.1 KiB a sample: the most where samples are few) in workers of a pytest
process reading tensors, numpy arrays or sleeping; a list of objects read at random copies a 4 KiB page per sample
(1.5-2.1 MiB in 400-600 samples). Copies are copy-on-read only past both."""


def samples_made(trial: TrialResult) -> Optional[float]:
    """Samples one worker made from its first batch to the window's end: its 1/num_workers share of the window's
    batches and the start-up burst; None when not known."""
    n = trial.config.num_workers
    if n == 0 or trial.batches <= 0 or not trial.samples_per_s or not trial.window_s:
        return None
    batch_size = trial.samples_per_s * trial.window_s / trial.batches
    return (trial.batches + trial.config.burst_batches()) * batch_size / n


def scattered_bytes(trial: TrialResult) -> Optional[int]:
    """What one worker copied by reading inherited objects (NOTE [ Copy-on-read forecast ]): all the census's copies
    when they lie beside each other (its runs) about as often as chance puts pages copied at random at the density
    they fill their span (``d``: a page has a copied neighbour with probability ``1 - (1 - d)^2``); its copies apart
    only, when clearly more lie in runs (``RUNS_BEYOND_CHANCE``): those runs are what it wrote (new objects in inherited
    free space: they grow linearly, not up to a span). Copies filling more than ``DENSE`` of their span with fewer
    runs than ``BROKEN_RUNS`` of chance's are written too, their runs broken by pages never present: 0. Reads of many
    objects a sample fill their span densely, their runs as chance has it (46 objects a sample from a list of 261,552:
    half the span copied, a third in runs, in a trial of 666 samples; their runs taken for writes and extended
    linearly, 2 workers that peak at 260 MiB were forecast at 925). None when not measured."""
    if trial.worker_copied_bytes is None:
        return None
    copied, runs = trial.worker_copied_bytes, min(trial.worker_copied_run_bytes or 0, trial.worker_copied_bytes)
    if copied <= 0:
        return 0
    span = trial.worker_copy_span_bytes or 0
    density = min(1.0, copied / span) if span else 1.0
    chance = 1.0 - (1.0 - density) ** 2
    scattered = copied - runs
    if scattered > DENSE * span and runs < BROKEN_RUNS * chance * copied:
        return 0
    return scattered if runs > (chance + RUNS_BEYOND_CHANCE) * copied else copied


def copied_per_sample(trial: TrialResult) -> Optional[float]:
    """Bytes one worker copied in pages apart (``scattered_bytes``) per sample it made: copy-on-read; 0 when less
    than ``COPY_NOISE_BYTES`` in all or ``COPY_NOISE_PER_SAMPLE`` a sample; None when not measured."""
    made = samples_made(trial)
    copied = scattered_bytes(trial)
    if copied is None or not made:
        return None
    per_sample = copied / made
    return per_sample if copied >= COPY_NOISE_BYTES and per_sample >= COPY_NOISE_PER_SAMPLE else 0.0


def growth_per_sample(trial: TrialResult) -> Optional[float]:
    """Bytes one worker grew per sample it made during the trial beyond the noise (``growth_noise_bytes``): what it
    copied (the census) plus what else its USS gained; without the census, its USS growth alone. None when not
    measured (no workers, no growth figure, no batches); 0 for a worker that did not grow past the noise."""
    made = samples_made(trial)
    if trial.worker_uss_growth_bytes is None or not made:
        return None
    copied = copied_per_sample(trial)
    other = max(0, trial.worker_uss_growth_bytes - int((copied or 0.0) * made) - growth_noise_bytes(trial))
    return (copied or 0.0) + other / made


def copy_forecast(*, per_sample: float, reach_bytes: int, workers: int, epoch_samples: int) -> float:
    """What one of ``workers`` workers copies by the end of an epoch of ``epoch_samples`` samples, each sample copying
    ``per_sample`` bytes of pages not copied yet out of ``reach_bytes`` shared ones (NOTE [ Copy-on-read forecast ]):
    the smaller of the linear share and the saturating one. Pure."""
    linear = per_sample * epoch_samples / workers
    if reach_bytes <= 0:
        return 0.0
    touches = per_sample * epoch_samples / reach_bytes
    return min(linear, reach_bytes * (1.0 - (1.0 - 1.0 / workers) ** touches))


def epoch_growth_bytes(trial: TrialResult, *, epoch_samples: int) -> Optional[int]:
    """How much one worker of ``trial`` grows by the end of an epoch of ``epoch_samples`` (this rank's; each worker
    reads its 1/num_workers share): its copies by ``copy_forecast`` within the span they fell in, plus any other growth
    at its measured rate; without the census, ``growth_per_sample`` x its share (linear). None when not measured."""
    n = trial.config.num_workers
    made = samples_made(trial)
    copied = copied_per_sample(trial)
    if copied is None or not made or trial.worker_uss_growth_bytes is None:
        slope = growth_per_sample(trial)
        if slope is None:
            return None
        linear = int(slope * epoch_samples / n)
        lone = lone_reach(trial)
        return linear if lone is None else min(linear, lone)
    reach = min(trial.worker_copy_span_bytes or 0, trial.worker_shared_bytes or 0)
    copies = copy_forecast(per_sample=copied, reach_bytes=reach, workers=n, epoch_samples=epoch_samples)
    other = max(0, trial.worker_uss_growth_bytes - int(copied * made) - growth_noise_bytes(trial))
    return int(copies + other / made * epoch_samples / n)


def lone_reach(trial: TrialResult) -> Optional[int]:
    """What a lone worker (no census: it holds alone every page this process writes meanwhile, measure/cow.py) could
    still copy: the pages it maps beside its own (its RSS less its USS); None with two workers or more, or unmeasured.
    Its growth is forecast up to this, not linearly past it (a lone worker reading a list of 261,552 objects grew
    43 MiB in 1,221 samples: 1 GiB linearly by the end of its epoch, where all it shared was 227 MiB)."""
    if trial.config.num_workers != 1 or trial.worker_rss_bytes is None or trial.worker_uss_bytes is None:
        return None
    return max(0, trial.worker_rss_bytes - trial.worker_uss_bytes)


def copied_in_window(trial: TrialResult) -> int:
    """What one worker of ``trial`` copied by reading during its window (``copied_per_sample`` x ``samples_made``):
    part of its measured USS already, and of the copies an epoch's forecast counts from the worker's start; 0 when
    none was measured."""
    per_sample, made = copied_per_sample(trial), samples_made(trial)
    return int(per_sample * made) if per_sample and made else 0


def forecast_bytes(trial: TrialResult, *, epoch_samples: Optional[int]) -> Optional[int]:
    """The footprint of ``trial``'s configuration at the end of an epoch of ``epoch_samples`` (this rank's share),
    its workers grown by ``epoch_growth_bytes`` from their size without what they copied in the window
    (``copied_in_window``: counted once); None when it cannot be told."""
    if epoch_samples is None or trial.worker_uss_bytes is None:
        return None
    growth = epoch_growth_bytes(trial, epoch_samples=epoch_samples)
    if growth is None:
        return None
    size = _uncopied_bytes(trial)
    return footprint(trial.config, per_worker_bytes=size + growth, batch_bytes=trial.batch_bytes).total_bytes


def lasting_bytes(trial: TrialResult) -> Optional[int]:
    """The footprint of ``trial``'s configuration once its workers, kept across epochs, copied all their reads can
    reach (the span of their copies, NOTE [ Copy-on-read forecast ]); its measured footprint when they copy nothing,
    None when not known."""
    if trial.worker_uss_bytes is None:
        return None
    copied = copied_per_sample(trial)
    reach = min(trial.worker_copy_span_bytes or 0, trial.worker_shared_bytes or 0) if copied else 0
    size = _uncopied_bytes(trial)
    return footprint(trial.config, per_worker_bytes=size + max(reach, copied_in_window(trial)),
                     batch_bytes=trial.batch_bytes).total_bytes


def copy_rate(trials: Sequence[TrialResult]) -> Optional[Tuple[float, int]]:
    """(bytes a worker copies per sample, the shared bytes those copies reach) of the trial whose worker copied the
    most per sample past the noise (``copied_per_sample``); None when none did."""
    copying = [(rate, min(t.worker_copy_span_bytes or 0, t.worker_shared_bytes or 0))
               for t in trials for rate in (copied_per_sample(t),) if rate]
    return max(copying, default=None)


def lone_growth_rate(trials: Sequence[TrialResult]) -> Optional[Tuple[float, int]]:
    """(bytes per sample, the most it can reach) of a lone worker that grew past the noise (``growth_per_sample``,
    ``lone_reach``) while no census told copies apart: until one does, ``forecast_guard`` sizes pools as if that
    growth were copies (it saturates at what the worker shares), so that a pool grown from one worker's size holds the
    budget (5 workers grown from a lone worker's 152 MiB passed 757 MiB in their window, copying a list of objects);
    None when no lone worker grew."""
    rates = [(slope, reach) for t in trials for slope, reach in ((growth_per_sample(t), lone_reach(t)),)
             if slope and reach]
    return max(rates, default=None)


def forecast_guard(config: LoaderConfig, *, trials: Sequence[TrialResult], per_worker_bytes: Optional[int],
                   batch_bytes: Optional[int], budget_bytes: Optional[int],
                   epoch_samples: Optional[int]) -> Optional[str]:
    """Why ``config``'s workers, copying as an earlier candidate's did (``copy_rate``; before a census, growing as a
    lone worker did, ``lone_growth_rate``), would be over ``budget_bytes`` by the end of an epoch (``copy_forecast``):
    the choice would refuse it, so it is not started (its count is then a ceiling the search looks below); None when
    it fits or nothing says otherwise."""
    rate = copy_rate(trials) or lone_growth_rate(trials)
    n = config.num_workers
    if n == 0 or rate is None or per_worker_bytes is None or budget_bytes is None or not epoch_samples:
        return None
    per_sample, reach = rate
    already = max((copied_in_window(t) for t in trials), default=0)  # in the measured size already
    grown = per_worker_bytes + max(0, int(copy_forecast(per_sample=per_sample, reach_bytes=reach, workers=n,
                                                        epoch_samples=epoch_samples)) - already)
    total = footprint(config, per_worker_bytes=grown, batch_bytes=batch_bytes).total_bytes or 0
    if total <= budget_bytes:
        return None
    return (f"memory: copy-on-read: {n} workers would take {mib(total)} by the end of an epoch of {epoch_samples:,} "
            f"samples (each copying {per_sample / 1024:,.1f} KiB of inherited objects per sample it reads, up to "
            f"{mib(reach)}), over the memory budget of {mib(budget_bytes)}; store the samples in numpy arrays or "
            f"tensors, or pass memory_budget= to allow more")


SHM_MARGIN = 0.9
"""/dev/shm is full well before its last byte: keep this share of what is free."""


def trial_footprint(trial: TrialResult) -> Optional[int]:
    """The footprint a trial measured: its own workers' memory (a worker's USS plus growth, per worker)."""
    if trial.config.num_workers and trial.worker_uss_bytes is None:
        return None
    per_worker = None if trial.worker_uss_bytes is None else _worker_bytes(trial)
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
    whether its window reads which pages a worker copies (NOTE [ Copy-on-read forecast ]: 25-80 ms at
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
    during the trial beyond the noise (``window_growth_bytes``; copy-on-read keeps growing, see NOTE
    [ Copy-on-read ]); None when no trial measured a worker."""
    return max((_worker_bytes(t) for t in sized(trials) if t.worker_uss_bytes is not None), default=None)


def _worker_bytes(trial: TrialResult) -> int:
    """One of ``trial``'s workers as it measured it: its USS plus its growth during the window beyond the noise."""
    return (trial.worker_uss_bytes or 0) + window_growth_bytes(trial)


def _uncopied_bytes(trial: TrialResult) -> int:
    """One of ``trial``'s workers without what it copied in the window (``copied_in_window``)."""
    return max(0, (trial.worker_uss_bytes or 0) - copied_in_window(trial))


def worker_growth_bytes(trials: Sequence[TrialResult]) -> int:
    """The most one worker grew during a window beyond the noise (``window_growth_bytes``), of the trials
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
    """Why a cached configuration would not fit in today's memory budget or free /dev/shm (``budget_guard``,
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
