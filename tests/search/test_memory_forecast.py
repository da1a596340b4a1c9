"""How much a candidate's workers grow (search/memory.py, NOTE [ Copy-on-read forecast ]): during its trial, by the
end of an epoch, kept across epochs, and the guard that refuses a count forecast past the budget; tables of fake
trials, and one property of the forecast on random spreads of objects over pages."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoloader.search import memory
from autoloader.search.memory import footprint
from search_fakes import GIB, MIB, config, copying, fake, growth_for


def test_growth_per_sample_and_forecast():
    slope = 4096
    trial = fake(4, 1000.0, uss=50 * MIB, growth=growth_for(4, slope))
    assert memory.growth_per_sample(trial) == pytest.approx(slope, rel=0.01)
    # each of 4 workers reads a quarter of 100,000 samples: 50 MiB + 100 MB / 4 each, plus 10 batches in flight
    forecast = memory.forecast_bytes(trial, epoch_samples=100_000)
    assert forecast == pytest.approx(4 * 50 * MIB + slope * 100_000 + 10 * MIB, rel=0.01)
    assert memory.growth_per_sample(fake(0, 500.0)) is None
    assert memory.forecast_bytes(trial, epoch_samples=None) is None
    assert memory.growth_per_sample(fake(4, 1000.0, growth=-MIB)) == 0
    assert memory.growth_per_sample(fake(4, 1000.0, growth=3 * MIB)) == 0  # a healthy worker's noise


def test_copy_forecast_saturates_over_the_span():
    kw = dict(per_sample=4096, reach_bytes=160 * MIB, epoch_samples=300_000)
    linear = 4096 * 300_000
    assert memory.copy_forecast(workers=1, **kw) == 160 * MIB, "one worker reads all: it copies all it can reach"
    four = memory.copy_forecast(workers=4, **kw)
    assert four == pytest.approx(160 * MIB * (1 - 0.75 ** (linear / (160 * MIB))))
    assert 0.85 * 160 * MIB < four < 160 * MIB and four < linear / 4
    # few samples over a big span: the linear share
    assert memory.copy_forecast(per_sample=4096, reach_bytes=10 * GIB, workers=4, epoch_samples=1000) == \
        pytest.approx(4096 * 250, rel=0.01)
    assert memory.copy_forecast(per_sample=4096, reach_bytes=0, workers=4, epoch_samples=1000) == 0


def test_copies_in_runs_grow_linearly():
    """A worker writing 128 KiB a sample into inherited free space copies 32-page runs: what it writes, not what it
    reads, so no span bounds it (the Hoarder below measured so: 0.3 GiB forecast instead of 12 GiB before runs were
    told apart)."""
    hoarding = copying(8, per_sample=128 * 1024)
    hoarding = dataclasses.replace(hoarding, worker_copied_run_bytes=hoarding.worker_copied_bytes)
    assert memory.copied_per_sample(hoarding) == 0 and memory.scattered_bytes(hoarding) == 0
    assert memory.epoch_growth_bytes(hoarding, epoch_samples=300_000) > 0.9 * 128 * 1024 * 300_000 / 8
    # the same, its runs broken by pages never present: its copies fill their span
    dense = dataclasses.replace(hoarding, worker_copied_run_bytes=0,
                                worker_copy_span_bytes=hoarding.worker_copied_bytes)
    assert memory.scattered_bytes(dense) == 0 and memory.epoch_growth_bytes(dense, epoch_samples=300_000) > GIB
    assert memory.lasting_bytes(hoarding) == footprint(hoarding.config, per_worker_bytes=hoarding.worker_uss_bytes,
                                                      batch_bytes=4096).total_bytes, "written, not read: as measured"


def test_copies_under_the_noise_are_none_and_other_growth_still_counts():
    quiet = copying(8, per_sample=300)  # 0.1 MiB copied in a trial: the allocator reusing inherited pages
    assert memory.copied_per_sample(quiet) == 0
    assert memory.epoch_growth_bytes(quiet, epoch_samples=300_000) == 0
    hoarding = copying(8, per_sample=300, other=64 * MIB)  # a per-worker cache the census does not see as copies
    assert memory.epoch_growth_bytes(hoarding, epoch_samples=300_000) > GIB
    assert memory.copied_per_sample(fake(8, 100.0)) is None
    many = copying(2, per_sample=200, batches=400)  # 1.6 MiB over 6,400 samples each: still the allocator
    assert many.worker_copied_bytes > memory.COPY_NOISE_BYTES and memory.copied_per_sample(many) == 0


@settings(max_examples=60, deadline=None)
@given(pages=st.integers(200, 4000), per_page=st.floats(1.0, 16.0), workers=st.integers(1, 32),
       skew=st.floats(0.0, 3.0), seed=st.integers(0, 2**31))
def test_the_copy_forecast_bounds_what_a_worker_copies(pages, per_page, workers, skew, seed):
    """The invariant ``copy_forecast`` rests on: whatever the spread of N objects over the pages (uniform, or skewed:
    some pages hold many), a worker reading a random 1/n of them touches (copies) no more pages than the forecast
    made from what a trial measures: one page per sample, and the pages the objects lie on."""
    rng = np.random.default_rng(seed)
    n_objects = int(pages * per_page)
    weights = rng.pareto(1.0 + skew, pages) + 1e-3 if skew else np.ones(pages)
    page_of = rng.choice(pages, size=n_objects, p=weights / weights.sum())
    held = len(np.unique(page_of))  # the pages the objects lie on: the span the census sees
    share = rng.permutation(n_objects)[:n_objects // workers]
    touched = len(np.unique(page_of[share]))
    forecast = memory.copy_forecast(per_sample=1.0, reach_bytes=held, workers=workers, epoch_samples=n_objects)
    assert touched <= forecast * 1.02 + 3 * np.sqrt(forecast) + 1


@pytest.mark.parametrize("trial_, expected, why", [
    (fake(4, 1000.0, batch_bytes=MIB), 4 * MIB, "4 batches of 1 MiB a worker: the floor"),
    (fake(4, 1000.0, batch_bytes=8 * MIB), 32 * MIB, "a worker's share of 16 batches of 8 MiB, above the floor"),
    (fake(4, 1000.0, batch_bytes=None), memory.GROWTH_NOISE_BYTES, "batch size not known: the floor"),
    (fake(1, 1000.0, batch_bytes=MIB), 4 * MIB, "a lone worker holds all 2 x 2 batches"),
])
def test_growth_noise_bytes(trial_, expected, why):
    assert memory.growth_noise_bytes(trial_) == expected, why


@pytest.mark.parametrize("trial_, expected, why", [
    (fake(4, 1000.0, batches=40, batch=32), (40 + 12) * 32 / 4, "its quarter of the window and the burst (8 + 4)"),
    (fake(1, 1000.0, batches=40, batch=32), (40 + 3) * 32, "one worker makes every batch: 2 in flight + 1 more"),
    (fake(0, 1000.0), None, "no workers: nothing a worker made"),
    (fake(4, 1000.0, batches=0), None, "no batch in the window"),
    (fake(4, None, status="failed"), None, "no rate"),
])
def test_samples_made(trial_, expected, why):
    assert memory.samples_made(trial_) == expected, why


def census(copied, runs, span):
    return dataclasses.replace(fake(4, 1000.0), worker_copied_bytes=copied, worker_copied_run_bytes=runs,
                               worker_copy_span_bytes=span)


@pytest.mark.parametrize("trial_, expected, why", [
    (census(10 * MIB, 4 * MIB, 100 * MIB), 10 * MIB,
     "a tenth of the span, 40 % in runs (chance: 19 %, within the margin): reads of inherited objects"),
    (census(10 * MIB, 8 * MIB, 100 * MIB), 2 * MIB, "80 % in runs, far past chance: the runs were written"),
    (census(10 * MIB, None, 100 * MIB), 10 * MIB, "no runs measured: all of it"),
    (census(10 * MIB, 0, 20 * MIB), 0, "filling half their span, no page beside another: written, not read"),
    (census(42 * MIB, 14 * MIB, 85 * MIB), 42 * MIB,
     "half their span, a third in runs: 46 objects read a sample (issue 59), as reads at random lie: all of it"),
    (census(66 * MIB, 40 * MIB, 85 * MIB), 66 * MIB, "the same at 78 % of the span, 60 % in runs (chance: 95 %)"),
    (census(42 * MIB, 5 * MIB, 85 * MIB), 0, "half their span, an eighth in runs: fewer than chance, written"),
    (census(4 * MIB, 8 * MIB, 100 * MIB), 0, "runs beyond the copies (two readings apart) never count below 0"),
    (fake(4, 1000.0), None, "no census (not Linux, a sandbox)"),
])
def test_scattered_bytes(trial_, expected, why):
    assert memory.scattered_bytes(trial_) == expected, why


@pytest.mark.parametrize("trials, expected, why", [
    ([copying(4, per_sample=4096), copying(8, per_sample=8192, span=100 * MIB)], (pytest.approx(8192, rel=0.01),
                                                                                     100 * MIB),
     "the worker that copied the most per sample, with the shared bytes its copies reach"),
    ([copying(4, per_sample=4096, shared=50 * MIB)], (pytest.approx(4096, rel=0.01), 50 * MIB),
     "the reach is the span, at most what the worker shared"),
    ([copying(4, per_sample=300), fake(0, 100.0)], None, "copies under the noise: none"),
    ([], None, "nothing measured"),
])
def test_copy_rate(trials, expected, why):
    assert memory.copy_rate(trials) == expected, why


@pytest.mark.parametrize("n, trials, budget_bytes, epoch, refused, why", [
    (8, [copying(4)], 700 * MIB, 300_000, True, "8 workers each copying ~105 MiB of the list: ~920 MiB"),
    (4, [copying(4)], 700 * MIB, 300_000, False, "4 workers, ~153 MiB each: ~650 MiB fits"),
    (8, [copying(4)], 2 * GIB, 300_000, False, "a budget that holds them"),
    (8, [copying(4, per_sample=300)], 700 * MIB, 300_000, False, "copies under the noise: nothing to forecast"),
    (8, [copying(4)], None, 300_000, False, "no budget: nothing is checked"),
    (8, [copying(4)], 700 * MIB, None, False, "an epoch of unknown length"),
    (0, [copying(4)], 1, 300_000, False, "no workers copy nothing"),
])
def test_forecast_guard(n, trials, budget_bytes, epoch, refused, why):
    reason = memory.forecast_guard(config(n), trials=trials, per_worker_bytes=10 * MIB, batch_bytes=4096,
                                   budget_bytes=budget_bytes, epoch_samples=epoch)
    assert (reason is not None) is refused, why
    if refused:
        assert reason.startswith("memory: copy-on-read") and f"{n} workers" in reason and "memory_budget=" in reason


def test_forecast_guard_needs_a_worker_size():
    assert memory.forecast_guard(config(8), trials=[copying(4)], per_worker_bytes=None, batch_bytes=4096,
                                 budget_bytes=MIB, epoch_samples=300_000) is None, "forked, none measured yet"


def test_what_a_worker_copied_in_its_window_is_counted_once():
    """Issue 59: a worker's USS at the window's end holds the copies it made there, and the epoch's copy forecast
    counts every copy from the worker's start: the forecast is its size at the first batch plus the epoch's copies (3
    workers of a 261,552-object list forecast at 490 MiB with the window's copies counted twice, 4 refused under
    757 MiB)."""
    trial = copying(4, per_sample=4096)
    copies = memory.copy_forecast(per_sample=4096, reach_bytes=181 * MIB, workers=4, epoch_samples=300_000)
    expected = footprint(trial.config, per_worker_bytes=10 * MIB + int(copies), batch_bytes=4096).total_bytes
    assert memory.forecast_bytes(trial, epoch_samples=300_000) == pytest.approx(expected, rel=0.01)
    assert memory.copied_in_window(trial) == trial.worker_copied_bytes
    assert memory.copied_in_window(fake(4, 1000.0)) == 0
