"""How much a candidate's workers grow: during its trial, by the end of an epoch, and kept across epochs; pure
functions of what its window measured (tested on tables), in the footprint of NOTE [ Memory budget ] (budget.py).

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

from typing import Optional, Sequence, Tuple

from ..config import LoaderConfig
from .._text import mib
from ..results import TrialResult
from .footprint import GROWTH_NOISE_BYTES, footprint, growth_noise_bytes, window_growth_bytes

__all__ = ["BROKEN_RUNS", "COPY_NOISE_BYTES", "COPY_NOISE_PER_SAMPLE", "DENSE", "GROWTH_NOISE_BYTES", "RUNS_BEYOND_CHANCE",
           "copied_in_window", "lone_growth_rate", "lone_reach",
           "copied_per_sample",
           "copy_forecast", "copy_rate", "epoch_growth_bytes", "forecast_bytes", "forecast_guard", "growth_noise_bytes",
           "growth_per_sample", "lasting_bytes", "samples_made", "scattered_bytes", "window_growth_bytes"]

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
    runs than ``BROKEN_RUNS`` of chance's are written too, their runs broken by pages never present: 0. Reads of many objects a
    sample fill their span densely, their runs as chance has it (46 objects a sample from a list of 261,552: half the
    span copied, a third in runs, in a trial of 666 samples; their runs taken for writes and extended linearly, 2
    workers that peak at 260 MiB were forecast at 925). None when not measured."""
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
    size = max(0, trial.worker_uss_bytes - copied_in_window(trial))
    return footprint(trial.config, per_worker_bytes=size + growth, batch_bytes=trial.batch_bytes).total_bytes


def lasting_bytes(trial: TrialResult) -> Optional[int]:
    """The footprint of ``trial``'s configuration once its workers, kept across epochs, copied all their reads can
    reach (the span of their copies, NOTE [ Copy-on-read forecast ]); its measured footprint when they copy nothing,
    None when not known."""
    if trial.worker_uss_bytes is None:
        return None
    copied = copied_per_sample(trial)
    reach = min(trial.worker_copy_span_bytes or 0, trial.worker_shared_bytes or 0) if copied else 0
    size = max(0, trial.worker_uss_bytes - copied_in_window(trial))
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
