"""The memory budget (NOTE [ Memory budget ] in search/memory.py): what a candidate takes of it, the checks before it
starts and at its first batch, what a worker is sized at, and the search kept under it; tables of fake trials, plus
one real trial whose workers grow by a known amount per sample. How the budget is decided: test_memory_budget.py; the
footprint formula: test_memory_footprint.py; the copy-on-read forecast: test_memory_forecast.py."""
import dataclasses
import gc
import math
import time
import warnings
from typing import Callable, List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from autoloader import AutoloaderWarning
from autoloader.config import LoaderConfig
from autoloader.consumer import Consumer
from autoloader.measure.trial import run_trial
from autoloader.request import Request
from autoloader.results import TrialResult, TuneResult
from autoloader.search import memory, policy, verdict
from autoloader.search.search import Search
from helpers import drive_search, full_profile
from workloads import LatencyBound
from search_fakes import GIB, MIB, config, copying, fake, growth_for


def test_budget_guard_names_the_budget_and_the_fix():
    kw = dict(per_worker_bytes=100 * MIB, batch_bytes=MIB, shm_free_bytes=None)
    assert memory.budget_guard(config(8), budget_bytes=GIB, **kw) is None  # 800 + 18 MiB
    reason = memory.budget_guard(config(16), budget_bytes=GIB, **kw)
    assert reason.startswith("memory:") and "16 workers" in reason and "memory budget of 1,024 MiB" in reason
    assert "memory_budget=" in reason and "max_workers=" in reason
    assert memory.budget_guard(config(0), budget_bytes=1, **kw) is None
    assert memory.budget_guard(config(16), budget_bytes=None, **kw) is None
    assert memory.budget_guard(config(16), budget_bytes=GIB, per_worker_bytes=None, batch_bytes=MIB,
                               shm_free_bytes=None) is None


def test_budget_guard_checks_what_is_known_before_a_worker_is_measured():
    """NOTE [ Memory budget ]: with no worker measured (forked), the batches in flight are known and no worker size can
    make them smaller: 16 workers x prefetch 2 of 64 MiB batches (34 in /dev/shm: 2,176 MiB) do not fit 1 GiB."""
    kw = dict(per_worker_bytes=None, batch_bytes=64 * MIB, shm_free_bytes=None)
    reason = memory.budget_guard(config(16), budget_bytes=GIB, **kw)
    assert reason is not None and "need at least 2,176 MiB" in reason and "not measured yet" in reason, reason
    assert "memory_budget=" in reason and "max_workers=" in reason
    assert memory.budget_guard(config(6), budget_bytes=GIB, **kw) is None  # 14 batches, 896 MiB: the workers unknown
    assert memory.budget_guard(config(16), budget_bytes=GIB, per_worker_bytes=None, batch_bytes=None,
                               shm_free_bytes=None) is None  # nothing known


def test_budget_guard_checks_dev_shm_as_its_own_limit():
    # 4 workers x 2 prefetch + 2 in hand = 10 batches of 10 MiB = 100 MiB
    kw = dict(per_worker_bytes=MIB, batch_bytes=10 * MIB, budget_bytes=None)
    assert memory.budget_guard(config(4), shm_free_bytes=200 * MIB, **kw) is None
    reason = memory.budget_guard(config(4), shm_free_bytes=64 * MIB, **kw)
    assert "/dev/shm" in reason and "--shm-size" in reason
    assert memory.budget_guard(config(0), shm_free_bytes=1, **kw) is None


@pytest.mark.parametrize("table, budget_bytes, expected, warned", [
    # no budget: the plain selection
    ([(0, 100), (4, 400), (8, 410)], None, 4, False),
    # 8 workers would fit, 16 (1.6 GiB measured) not: never chosen, though fastest
    ([(0, 100), (8, 380), (16, 400)], GIB, 8, False),
    # nothing with workers fits: the serial candidate, which adds nothing
    ([(0, 100), (16, 400)], GIB, 0, False),
])
def test_select_within_budget_chooses_what_fits(table, budget_bytes, expected, warned):
    trials = [fake(n, rate) for n, rate in table]
    chosen, warning = policy.select_within_budget(trials, budget_bytes=budget_bytes, epoch_samples=10_000)
    assert chosen.config.num_workers == expected
    assert (warning is not None) == warned


def test_a_forecast_past_the_budget_warns_and_prefers_fewer_workers_or_threads():
    slope = 5000  # 500 MB over an epoch of 100,000 samples, whichever worker reads them
    trials = [fake(0, 100.0), fake(4, 300.0, uss=50 * MIB, growth=growth_for(4, slope)),
              fake(16, 400.0, uss=50 * MIB, growth=growth_for(16, slope))]
    chosen, warning = policy.select_within_budget(trials, budget_bytes=GIB, epoch_samples=100_000)
    # 16 workers: 16 x 50 MiB + ~477 MiB grown: over 1 GiB; 4: 200 + 477 MiB: under
    assert chosen.config.num_workers == 4
    for words in ("copy-on-read", "numpy arrays", "torch tensors", "gc.freeze()", "threads=True", "memory_budget="):
        assert words in warning
    # a threaded candidate (one process) fits where the fewer workers do not
    trials.append(fake(1, 395.0, uss=50 * MIB, growth=growth_for(1, slope), threads=16))
    chosen, _ = policy.select_within_budget(trials, budget_bytes=600 * MIB, epoch_samples=100_000)
    assert (chosen.config.num_workers, chosen.config.threads) == (1, 16)
    # nothing lasts: the one forecast to take least, still with the warning
    chosen, warning = policy.select_within_budget(trials[:3], budget_bytes=400 * MIB, epoch_samples=10**7)
    assert chosen.config.num_workers in (0, 4) and warning is not None


def test_a_cached_result_is_checked_with_the_same_footprint():
    trials = (fake(0, 100.0), fake(8, 400.0))
    result = TuneResult(LoaderConfig(8, 2, False, True), 400.0, "cpu", "tuned", trials)
    assert memory.no_longer_fits(result, budget_bytes=GIB, shm_free_bytes=None) is None
    reason = memory.no_longer_fits(result, budget_bytes=800 * MIB, shm_free_bytes=None)
    assert "memory budget of 800 MiB" in reason


# ---------------------------------------------------------------- the search, on fake measurements

BATCH = 32


class PriorSearch(Search):
    """The search with a fixed size for one worker before any was measured (the real one reads this process's private
    memory, which depends on what ran before in the test session)."""

    prior = 100 * MIB

    def per_worker_estimate(self):
        return self.found.per_worker_bytes if self.found.per_worker_bytes is not None else self.prior


def waiting(config: LoaderConfig, *, slope=0) -> TrialResult:
    """Waiting data: 250 samples/s per worker; each worker 100 MiB (50 when it grows by copy-on-read)."""
    n = config.num_workers
    rate = min(12000.0, max(1, n) * 250.0)
    uss = 50 * MIB if slope else 100 * MIB
    return dataclasses.replace(fake(n, rate, uss=uss, growth=growth_for(n, slope) if n else 0,
                                    batch_bytes=MIB, batch=BATCH),
                               config=config, consumer_s_per_batch=1e-5, worker_cpu_util=0.01 if n else None,
                               fetch_s_per_batch=BATCH / rate if n == 0 else None,
                               fetch_cpu_s_per_batch=BATCH / rate * 0.01 if n == 0 else None)


def drive(model: Callable[[LoaderConfig], TrialResult], *, memory_budget, prior=100 * MIB, cpus=None):
    request = Request.checked(LatencyBound(n=100_000, latency_s=0.004), BATCH, device="cpu", max_workers=64,
                              memory_budget=memory_budget)
    profile = full_profile()
    if cpus is not None:
        profile = dataclasses.replace(profile, cpu=dataclasses.replace(profile.cpu, usable=cpus))
    search = PriorSearch(request, profile, budget=30.0)
    search.prior = prior
    return drive_search(search, model)


def test_the_search_skips_what_would_not_fit_and_decides_under_the_budget():
    asked, result = drive(waiting, memory_budget=GIB)  # fits 10 workers of 100 MiB (+ their batches)
    skipped = [t for t in result.trials if t.status == "skipped"]
    assert skipped, [t.config.label() for t in result.trials]
    for t in skipped:
        assert t.config.num_workers > 10 and "memory budget of 1,024 MiB" in t.reason and "memory_budget=" in t.reason
        assert t.footprint_bytes > GIB
    assert all(c.num_workers <= 10 for c in asked), [c.num_workers for c in asked]
    assert result.num_workers <= 10 and result.bottleneck == "memory"
    chosen = next(t for t in result.trials if t.ok and t.config.same_candidate(result.config))
    assert chosen.footprint_bytes <= GIB
    assert result.memory_budget_bytes == GIB and "set by the user" in result.memory_budget_from
    text = str(result)
    assert "footprint MiB" in text and "memory budget 1,024 MiB" in text


def test_the_default_budget_is_half_of_the_profiles():
    _, result = drive(waiting, memory_budget=None)
    assert result.memory_budget_bytes == full_profile().memory.budget_bytes // 2
    _, result = drive(waiting, memory_budget=0.25)
    assert result.memory_budget_bytes == full_profile().memory.budget_bytes // 4


def test_the_search_warns_when_growth_over_the_epoch_would_cross_the_budget():
    with pytest.warns(AutoloaderWarning, match="gc.freeze"):
        _, result = drive(lambda c: waiting(c, slope=5000), memory_budget=GIB)
    chosen = next(t for t in result.trials if t.ok and t.config.same_candidate(result.config))
    assert memory.forecast_bytes(chosen, epoch_samples=100_000) <= GIB, result
    fastest = max((t for t in result.trials if t.ok), key=lambda t: t.samples_per_s)
    assert result.num_workers < fastest.config.num_workers



def big_waiting(config: LoaderConfig) -> TrialResult:
    """Drawn seed 14 (big-samples): 4 MiB batches waiting on storage; this process's native pool spins while a
    batch loads, so serial loading reads as a whole CPU busy and the first pool is the 2 workers that fill the 2 CPUs
    at that share, which make fewer samples than the main process alone (it loads and hands over); each worker
    12 MiB."""
    n = config.num_workers
    rate = 400.0 if n == 0 else min(4000.0, 168.0 * n)
    fetch_s = BATCH / rate
    return dataclasses.replace(fake(n, rate, uss=12 * MIB, batch_bytes=4 * MIB, batch=BATCH), config=config,
                               consumer_s_per_batch=1e-5, consumer_cpu_s_per_batch=1e-5, stall_fraction=0.97,
                               main_cpu_util=1.0 if n == 0 else 0.05,
                               worker_cpu_util=0.07 if n else None, fetch_s_per_batch=fetch_s if n == 0 else None,
                               fetch_cpu_s_per_batch=fetch_s if n == 0 else None)


def test_an_extrapolated_count_that_would_not_fit_is_followed_by_the_most_that_do():
    """The first pool lost to serial loading for want of workers (``capacity.worker_bound``); the count extrapolated
    from it would not fit 200 MiB: the most that fit are measured, not nothing (seed 14 served num_workers=0 at 0.09x
    the best count that fits)."""
    unbound = [c.num_workers for c in drive(big_waiting, memory_budget=GIB, prior=12 * MIB, cpus=2)[0]]
    asked, result = drive(big_waiting, memory_budget=200 * MIB, prior=12 * MIB, cpus=2)
    counts = [c.num_workers for c in asked]
    assert counts[:2] == unbound[:2] == [0, 2] and counts[2] < unbound[2], (counts, unbound)
    assert result.num_workers >= 8, (counts, result.num_workers)
    chosen = next(t for t in result.trials if t.ok and t.config.same_candidate(result.config))
    assert chosen.footprint_bytes <= 200 * MIB

# ---------------------------------------------------------------- a real trial whose workers grow

class Hoarder(Dataset):
    """Each ``__getitem__`` keeps ``grow_bytes`` of freshly written bytes in a list the dataset holds: in a worker, the
    list is the worker's own, so its private memory (USS) grows by about that much per sample (copy-on-read grows the
    same way, page by page)."""

    def __init__(self, n=100_000, grow_bytes=64 * 1024):
        self.n, self.grow_bytes = n, grow_bytes
        self.kept: List[bytes] = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.002)
        if self.grow_bytes:
            self.kept.append(bytes([i % 251]) * self.grow_bytes)  # written: every page touched
        return torch.zeros(4)


def test_a_trial_measures_the_growth_per_sample_and_the_forecast_catches_it():
    grow = 128 * 1024
    request = Request.checked(Hoarder(grow_bytes=grow), 4, device="cpu")
    trial = run_trial(request, config(2), consumer=Consumer(None, torch.device("cpu")), limit_s=5.0)
    assert trial.ok, trial.reason
    slope = memory.growth_per_sample(trial)
    assert slope is not None and 0.5 * grow <= slope <= 2.0 * grow, (slope, trial)
    # an epoch of 100,000 samples: about 12 GiB of growth; a 1 GiB budget is crossed, with the fix named
    forecast = memory.forecast_bytes(trial, epoch_samples=100_000)
    assert forecast > 3 * GIB
    chosen, warning = policy.select_within_budget([trial], budget_bytes=GIB, epoch_samples=100_000)
    assert warning is not None and "gc.freeze()" in warning

    gc.freeze()  # the workers' collector leaves this process's objects alone: after a thousand tests, scanning them
    try:  # copied 52 MiB into each worker of the flat trial (the copy-on-read the warning names)
        flat = run_trial(Request.checked(Hoarder(grow_bytes=0), 4, device="cpu"), config(2),
                         consumer=Consumer(None, torch.device("cpu")), limit_s=5.0)
    finally:
        gc.unfreeze()
    assert flat.ok and memory.growth_per_sample(flat) < 0.1 * grow, flat
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutoloaderWarning)
        assert policy.select_within_budget([flat], budget_bytes=GIB, epoch_samples=100_000)[1] is None
    assert math.isfinite(memory.forecast_bytes(flat, epoch_samples=100_000))


def test_the_first_pool_is_what_fits_at_the_conservative_size_and_grows_once_measured():
    # before any worker ran, one is sized at 300 MiB (the real search: this process's private memory); measured,
    # 100 MiB: the first pool is the 3 that fit at 300 MiB, never a count that does not (issue 59: no pool starts
    # whose footprint is not known to fit), then it grows to the predicted 8, and climbs to the most that fit
    asked, result = drive(waiting, memory_budget=GIB, prior=300 * MIB)
    counts = [c.num_workers for c in asked]
    assert counts[:3] == [0, 3, 8], counts
    assert not any(t.status == "skipped" and t.config.num_workers <= 10 for t in result.trials), result.trials
    assert result.num_workers == 10 and all(n <= 10 for n in counts), "then halfway to 16 (skipped): the most that fit"


def test_when_not_one_worker_fits_at_the_conservative_size_one_starts_checked_at_its_first_batch():
    # 1.5 GiB per worker before one ran, under 1 GiB: no count is known to fit, so one worker starts, sized at its
    # first batch (100 MiB); the predicted 8 then fits, and the climb goes on from it, to the most that fit
    asked, result = drive(waiting, memory_budget=GIB, prior=1536 * MIB)
    counts = [c.num_workers for c in asked]
    assert counts[:3] == [0, 1, 8], counts
    assert result.num_workers == 10, [(t.config.num_workers, t.status) for t in result.trials]


# ---------------------------------------------------------------- forked workers: measured, never guessed (issue 45)

def test_first_batch_check():
    check = memory.MemoryCheck(380 * MIB)
    # 8 workers of 15 MiB + 18 batches of 6 MiB in /dev/shm: 228 MiB
    assert memory.first_batch_check(config(8), check, uss_bytes=15 * MIB, batch_bytes=6 * MIB) is None
    reason = memory.first_batch_check(config(16), check, uss_bytes=15 * MIB, batch_bytes=6 * MIB)
    assert reason.startswith("memory: stopped at its first batch") and "16 workers of 15 MiB" in reason
    assert "memory budget of 380 MiB" in reason and "memory_budget=" in reason and "max_workers=" in reason
    # the growth an earlier window measured counts too
    grown = memory.MemoryCheck(380 * MIB, growth_bytes=20 * MIB)
    assert memory.first_batch_check(config(8), grown, uss_bytes=15 * MIB, batch_bytes=6 * MIB) is not None
    assert check(config(16), 15 * MIB, 6 * MIB) == reason, "what a measuring window calls"
    for cfg, chk, uss in ((config(0), check, GIB), (config(8), None, GIB), (config(8), check, None)):
        assert memory.first_batch_check(cfg, chk, uss_bytes=uss, batch_bytes=MIB) is None


def forked_waiting(candidate) -> TrialResult:
    """A forked worker of 15 MiB, 250 samples/s each, 6 MiB batches: stopped at its first batch, as a measuring window
    stops it (``Window._stopped``), when its candidate's ``memory`` check says so."""
    config = candidate.config
    n = config.num_workers
    if n and candidate.memory is not None:
        reason = candidate.memory(config, 15 * MIB, 6 * MIB)
        if reason is not None:
            return TrialResult(config=config, status="skipped", reason=reason, worker_uss_bytes=15 * MIB,
                               batch_bytes=6 * MIB, startup_s=0.1)
    rate = min(12000.0, max(1, n) * 250.0)
    return dataclasses.replace(fake(n, rate, uss=15 * MIB, growth=MIB if n else 0, batch_bytes=6 * MIB, batch=16),
                               config=config, consumer_s_per_batch=1e-5, startup_s=0.05 + 0.01 * n,
                               worker_cpu_util=0.01 if n else None,
                               fetch_s_per_batch=16 / rate if n == 0 else None,
                               fetch_cpu_s_per_batch=16 / rate * 0.01 if n == 0 else None)


def drive_candidates(search, model):
    """``drive_search``, answering each ``Candidate`` (its memory check included) rather than its config."""
    steps = search.steps()
    asked, candidate = [], next(steps)
    try:
        while True:
            asked.append(candidate)
            candidate = steps.send(model(candidate))
    except StopIteration as done:
        return asked, done.value


def test_the_census_is_asked_for_only_where_copying_could_matter():
    request = Request.checked(LatencyBound(n=100_000), 16, device="cpu")  # the default budget: half of the available
    search = Search(request, dataclasses.replace(full_profile(), memory=dataclasses.replace(
        full_profile().memory, budget_bytes=2 * GIB)), budget=30.0)
    assert search.memory_check(config(0)) is None
    assert search.memory_check(config(8)).census, "nothing measured: asked for"
    search.main_private = 300 * MIB
    assert search.memory_check(config(2)).census is False, "2 x 300 MiB fit 1 GiB whatever they copy"
    assert search.memory_check(config(8)).census is True
    assert search.memory_check(config(8)).budget_bytes == GIB


def test_a_users_budget_always_asks_for_the_census():
    """Issue 59: the census tells reads (which saturate) from writes (which do not); without it a worker's growth is
    extended linearly, and 2 workers skipped it (2 x 263 MiB fit 757 MiB even copying all) then were forecast at
    1.7 GiB, a ceiling below which the search measured 1 worker for nothing."""
    request = Request.checked(LatencyBound(n=100_000), 16, device="cpu", memory_budget=GIB)
    search = Search(request, full_profile(), budget=30.0)
    search.main_private = 300 * MIB
    assert search.memory_check(config(2)).census is True


@pytest.mark.parametrize("n, trials, budget_bytes, rss, expected, why", [
    (0, [], GIB, None, None, "no workers: nothing to check at a first batch"),
    (8, [], None, None, None, "no budget: nothing is checked"),
    (8, [], GIB, None, (GIB, 0, True), "nothing known of this process yet: the census is read"),
    (2, [], GIB, 300 * MIB, (GIB, 0, False), "2 x 300 MiB fit 1 GiB even copying all of this process: no census"),
    (8, [], GIB, 300 * MIB, (GIB, 0, True), "8 x 300 MiB would not: the census"),
    (2, [fake(2, 500.0, uss=220 * MIB, growth=7 * MIB)], GIB, 300 * MIB, (GIB, 3 * MIB, True),
     "a measured worker's size and growth beyond the noise (4 MiB) on top of the RSS: 2 x 523 MiB + batches, past "
     "1 GiB"),
    (2, [fake(2, 500.0, uss=200 * MIB, growth=7 * MIB)], GIB, 300 * MIB, (GIB, 3 * MIB, False),
     "2 x 503 MiB + 6 batches of 1 MiB: just under 1 GiB"),
    (1, [fake(2, 500.0, uss=20 * MIB, growth=-MIB)], GIB, 100 * MIB, (GIB, 0, False),
     "a worker that shrank grew by nothing"),
    (1, [fake(2, 500.0, uss=20 * MIB, growth=3 * MIB)], GIB, 100 * MIB, (GIB, 0, False),
     "3 MiB is the noise of two readings (batches being built): no growth"),
])
def test_memory_check(n, trials, budget_bytes, rss, expected, why):
    check = memory.memory_check(config(n), trials, budget_bytes=budget_bytes, main_private_bytes=rss, batch_bytes=MIB)
    assert (None if check is None else (check.budget_bytes, check.growth_bytes, check.census)) == expected, why


@pytest.mark.parametrize("measured, private, expected, why", [
    (16 * MIB, 300 * MIB, 16 * MIB, "a worker measured: its size"),
    (None, 300 * MIB, 300 * MIB, "none measured: this process's private memory, the most a fork can copy"),
    (None, None, None, "before the first outcome, among ranks: nothing to size it by"),
])
def test_per_worker_estimate(measured, private, expected, why):
    assert memory.per_worker_estimate(measured, main_private_bytes=private) == expected, why


def test_the_first_pool_is_held_to_what_fits_at_this_processs_size_then_grows():
    """Issue 59: waiting-bound 384 KiB samples online under 380 MiB: the prior's 25 workers started before any worker
    was measured and peaked at 1.36x the budget. The first pool is now the most that fit at this process's private
    size (a forked worker's bound), and once its workers measured 15 MiB each the pool grows to what fits."""
    request = Request.checked(LatencyBound(n=100_000, latency_s=0.004), 16, device="cpu", max_workers=64,
                              memory_budget=380 * MIB)
    search = Search(request, full_profile(), budget=30.0)
    search.main_private = 150 * MIB  # as the first outcome agrees it (a pytest process with torch: 150-350 MiB)
    assert search.per_worker_estimate() == 150 * MIB
    assert search.most_that_fit(low=0, high=25) == 2, "2 x 150 MiB and their batches fit 380 MiB; 3 do not"
    search.found.per_worker_bytes = 15 * MIB
    assert search.most_that_fit(low=2, high=25) == 25


def test_a_candidate_over_the_budget_at_its_first_batch_is_skipped_and_guards_the_rest(monkeypatch):
    # 64 MiB per worker at the first batch, this process's private memory 10 MiB (a worker that allocates on its own
    # passes the conservative size): 8 workers (512 MiB) stop there; every later candidate is guarded by it
    monkeypatch.setattr("autoloader.search.search.private_bytes", lambda: 10 * MIB)
    def heavy(candidate):
        trial = forked_waiting(candidate)
        n = candidate.config.num_workers
        if n and candidate.memory is not None:
            reason = candidate.memory(candidate.config, 64 * MIB, MIB)
            if reason is not None:
                return TrialResult(config=candidate.config, status="skipped", reason=reason,
                                   worker_uss_bytes=64 * MIB, batch_bytes=MIB, startup_s=0.1)
        return dataclasses.replace(trial, worker_uss_bytes=64 * MIB if n else None, batch_bytes=MIB)
    request = Request.checked(LatencyBound(n=100_000, latency_s=0.004), 16, device="cpu", max_workers=64,
                              memory_budget=300 * MIB)
    asked, result = drive_candidates(Search(request, full_profile(), budget=30.0), heavy)
    stopped = [t for t in result.trials if t.status == "skipped" and t.startup_s is not None]
    assert stopped and all("stopped at its first batch" in t.reason for t in stopped)
    first = result.trials.index(stopped[0])
    later = [c.config.num_workers for c in asked[first + 1:]]
    assert later and all(n * 64 * MIB + (2 * n + 2) * MIB <= 300 * MIB for n in later), later
    assert result.bottleneck == "memory" and result.num_workers * 64 * MIB <= 300 * MIB


def test_a_time_skip_is_no_memory_limit():
    trial = TrialResult(config=config(8), status="skipped", reason="budget: 8 workers would take about 3.0 s")
    assert not memory.skipped_for_memory(trial)
    assert memory.skipped_for_memory(dataclasses.replace(trial, reason="memory: 8 workers need ..."))
    assert memory.skipped_for_memory(dataclasses.replace(trial, reason="/dev/shm: 8 workers x prefetch 2 ..."))


# ---------------------------------------------------------------- the copy-on-read forecast (NOTE [ Copy-on-read forecast ])

def test_the_census_forecast_admits_what_fits_and_not_more():
    """The 300,000-object list of issue 45 under 700 MiB: 4 workers (605-633 MiB measured over an epoch) fit, 8
    (about 1 GiB) do not; the old USS growth less its 4 MiB noise floor saw nothing and admitted 32 (1,343 MiB)."""
    trials = [fake(0, 875.0), copying(4, 3500.0), copying(8, 7000.0), copying(32, 25000.0)]
    forecasts = {t.config.num_workers: memory.forecast_bytes(t, epoch_samples=300_000) for t in trials[1:]}
    assert forecasts[4] <= 700 * MIB < forecasts[8] < forecasts[32], {n: f // MIB for n, f in forecasts.items()}
    chosen, warning = policy.select_within_budget(trials, budget_bytes=700 * MIB, epoch_samples=300_000)
    assert chosen.config.num_workers == 4 and "copy-on-read" in warning
    # without the census: the USS growth, which a short trial's noise floor hides
    blind = dataclasses.replace(trials[-1], worker_copied_bytes=None, worker_copy_span_bytes=None,
                                worker_shared_bytes=None)
    assert memory.growth_per_sample(blind) == 0 and memory.forecast_bytes(blind, epoch_samples=300_000) < 700 * MIB


def test_workers_that_would_copy_past_the_budget_in_time_are_not_kept_alive():
    trial = copying(4)
    lasting = memory.lasting_bytes(trial)
    assert lasting == pytest.approx(4 * (10 * MIB + 181 * MIB) + 10 * 4096)
    assert not verdict.keep_workers_alive(4, per_worker_bytes=12 * MIB, budget_bytes=700 * MIB, lasting_bytes=lasting)
    assert verdict.keep_workers_alive(4, per_worker_bytes=12 * MIB, budget_bytes=GIB, lasting_bytes=lasting)
    quiet = copying(4, per_sample=100)
    assert memory.lasting_bytes(quiet) == 4 * quiet.worker_uss_bytes + 10 * 4096, "copies nothing: as measured"


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 128), prefetch=st.integers(1, 8), pin=st.booleans(), threads=st.integers(1, 8),
       batch=st.one_of(st.none(), st.integers(0, 256 * MIB)), limit=st.one_of(st.none(), st.integers(1, 64 * GIB)),
       shm=st.one_of(st.none(), st.integers(0, 64 * GIB)), worker=st.integers(0, 8 * GIB),
       growth=st.integers(0, GIB))
def test_nothing_a_measurement_could_admit_is_refused_unmeasured(n, prefetch, pin, threads, batch, limit, shm,
                                                                 worker, growth):
    """Issue 45's invariant: before a worker is measured (forked workers: no estimate), a candidate is refused only for
    what holds whatever its workers measure (the batches in /dev/shm, pinned, in threads' hands); and at its first
    batch it stops exactly when the footprint measured there (plus the growth seen before) is over the budget."""
    cfg = LoaderConfig(n, prefetch if n else None, pin, False, threads=threads)
    kw = dict(batch_bytes=batch, budget_bytes=limit, shm_free_bytes=shm)
    unmeasured = memory.budget_guard(cfg, per_worker_bytes=None, **kw)
    if unmeasured is not None:
        assert memory.budget_guard(cfg, per_worker_bytes=worker, **kw) is not None
    if limit is not None:
        stop = memory.first_batch_check(cfg, memory.MemoryCheck(limit, growth), uss_bytes=worker, batch_bytes=batch)
        total = memory.footprint(cfg, per_worker_bytes=worker + growth, batch_bytes=batch).total_bytes
        assert (stop is not None) == (n > 0 and total > limit)


def test_a_lone_workers_size_does_not_size_the_others():
    """A lone worker holds alone every page the main process writes meanwhile (measure/cow.py): 59 MiB online where 2
    or more measured 15-20 MiB each. Once a candidate of two or more measured a worker, it sizes every count."""
    lone = fake(1, 250.0, uss=59 * MIB, growth=8 * MIB)  # the growth beyond the noise (4 MiB here) counts
    two = fake(2, 500.0, uss=15 * MIB, growth=5 * MIB)
    assert memory.per_worker_bytes([fake(0, 100.0), lone]) == 63 * MIB, "the only measurement there is"
    assert memory.per_worker_bytes([fake(0, 100.0), lone, two]) == 16 * MIB
    assert memory.worker_growth_bytes([lone, two]) == MIB and memory.worker_growth_bytes([fake(0, 100.0)]) == 0
    stopped = TrialResult(config=config(8), status="skipped", reason="memory: stopped ...", worker_uss_bytes=40 * MIB)
    assert memory.per_worker_bytes([lone, two, stopped]) == 40 * MIB, "measured at its first batch, it counts"


def test_the_search_looks_below_counts_forecast_past_the_budget(monkeypatch):
    """Issue 45's list of 300,000 objects under 700 MiB: each worker copies a page a sample, out of 181 MiB. Measured
    in a real run: the search climbed 8 -> 32 -> 16 -> 23, every one forecast past the budget, and fell back to no
    workers (875 samples/s). Once a count measured the copies, counts forecast past the budget are not started
    (ceilings), so the search finds one that lasts."""
    def copy_on_read(candidate):
        config = candidate.config
        n = config.num_workers
        if n == 0:
            return dataclasses.replace(fake(0, 875.0, batch=64), consumer_s_per_batch=1e-5,
                                       fetch_s_per_batch=64 / 875.0, fetch_cpu_s_per_batch=64 / 875.0 * 0.1)
        trial = copying(n, 875.0 * n)
        return dataclasses.replace(trial, config=config, consumer_s_per_batch=1e-5, worker_cpu_util=0.05,
                                   startup_s=0.05 * n)
    request = Request.checked(LatencyBound(n=300_000), 64, device="cpu", max_workers=32, memory_budget=700 * MIB)
    monkeypatch.setattr("autoloader.search.search.private_bytes", lambda: 160 * MIB)  # the list's process
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutoloaderWarning)  # the choice fits: nothing to warn of
        asked, result = drive_candidates(Search(request, full_profile(), budget=30.0), copy_on_read)
    table = [(t.config.num_workers, t.status, (t.reason or "")[:40]) for t in result.trials]
    assert all(memory.forecast_bytes(t, epoch_samples=300_000) <= 700 * MIB for t in result.trials if t.ok and
               t.config.num_workers), "no pool measured was forecast past the budget: each was known to fit"
    refused = [t for t in result.trials if t.status == "skipped"]
    assert refused and all("copy-on-read" in t.reason and "by the end of an epoch" in t.reason for t in refused)
    assert result.num_workers == 4, table
    chosen = next(t for t in result.trials if t.ok and t.config.same_candidate(result.config))
    assert memory.forecast_bytes(chosen, epoch_samples=300_000) <= 700 * MIB
    assert not result.config.persistent_workers, "in time its workers would copy all 181 MiB each"


def test_a_measured_count_forecast_past_the_budget_is_a_ceiling_the_search_looks_below(monkeypatch):
    """The same list under 600 MiB (4 workers forecast at 652 MiB, 3 at 534): the first count measured (8) is forecast
    past the budget once measured, and 4 (its half) too. 8 had counted as measured, so nothing below 4 was tried and
    the choice fell back to no workers (2 of 3 benchmark runs of the list under 700 MiB, whose 4 workers sit at the
    edge); as a ceiling it sends the search below, halfway to it once a count fits."""
    def copy_on_read(candidate):
        n = candidate.config.num_workers
        if n == 0:
            return dataclasses.replace(fake(0, 875.0, batch=64), consumer_s_per_batch=1e-5,
                                       fetch_s_per_batch=64 / 875.0, fetch_cpu_s_per_batch=64 / 875.0 * 0.1)
        return dataclasses.replace(copying(n, 875.0 * n), config=candidate.config, consumer_s_per_batch=1e-5,
                                   worker_cpu_util=0.05, startup_s=0.05 * n)
    request = Request.checked(LatencyBound(n=300_000), 64, device="cpu", max_workers=32, memory_budget=600 * MIB)
    monkeypatch.setattr("autoloader.search.search.private_bytes", lambda: 160 * MIB)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutoloaderWarning)
        asked, result = drive_candidates(Search(request, full_profile(), budget=30.0), copy_on_read)
    table = [(t.config.num_workers, t.status) for t in result.trials]
    assert 0 < max(c.config.num_workers for c in asked) <= 3, table
    assert result.num_workers == 3, table
    assert memory.forecast_bytes(next(t for t in result.trials if t.ok and t.config.num_workers == 3),
                                 epoch_samples=300_000) <= 600 * MIB


@pytest.mark.parametrize("running, following, budget_bytes, refused, why", [
    (fake(8, 1400.0, uss=12 * MIB, batch_bytes=6 * MIB), config(12), 380 * MIB, True,
     "8 x 12 MiB + 18 batches of 6 MiB beside 12 x 12 MiB + 26 batches: 504 MiB"),
    (fake(8, 1400.0, uss=12 * MIB, batch_bytes=6 * MIB), config(12), GIB, False, "both fit 1 GiB"),
    (fake(8, 1400.0, uss=12 * MIB, batch_bytes=6 * MIB), config(12), None, False, "no budget: nothing checked"),
    (fake(0, 100.0), config(12), 380 * MIB, False, "serial: the next pool is checked alone at its first batch"),
    (fake(8, 1400.0, uss=12 * MIB, batch_bytes=6 * MIB), config(0), 380 * MIB, False, "serial next: no pool"),
])
def test_a_switch_is_hidden_only_where_both_pools_fit_the_budget(running, following, budget_bytes, refused, why):
    reason = memory.overlap_guard(running, following, [running], budget_bytes=budget_bytes)
    assert (reason is not None) is refused, why
    if refused:
        assert "workers=12" in reason and "workers=8" in reason and "memory budget of 380 MiB" in reason
