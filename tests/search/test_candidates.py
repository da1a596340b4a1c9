"""A candidate's time limit grows with its predicted start-up, and the budget refuses what would not fit (NOTE
[ Candidate time limit ] in search/candidates.py): tables of fake trials, and the search driven by a model whose
workers take seconds to start."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoloader.config import LoaderConfig
from autoloader.request import Request
from autoloader.results import TrialResult
from autoloader.search.candidates import (MIN_LIMIT_S, PRIOR_WORKER_START_S, StartCosts, admit, predict_start,
                                          start_costs, trial_limit)
from autoloader.search.search import Search
from helpers import full_profile
from workloads import LatencyBound


def config(n, prefetch=2):
    return LoaderConfig(n, prefetch if n else None)


H200 = StartCosts(worker_s=2.7 / 32, batch_s=0.33, batch_cpu_s=0.33)
"""The H200 of issue 45: 32 workers took 2.7 s to start; a ResNet-18 batch costs 0.33 s of one core."""


def test_start_costs_come_from_the_trials():
    serial = TrialResult(config=config(0), samples_per_s=100.0, fetch_s_per_batch=0.33, fetch_cpu_s_per_batch=0.3,
                         startup_s=0.4)
    small = TrialResult(config=config(4), samples_per_s=300.0, startup_s=0.33 + 4 * 0.05)
    big = TrialResult(config=config(16), status="failed", startup_s=0.33 + 16 * 0.08)  # failed, but it did start
    costs = start_costs([serial, small, big])
    assert costs.batch_s == 0.33 and costs.batch_cpu_s == 0.3
    assert costs.worker_s == pytest.approx(0.08), "the most per worker: forks are serial"
    assert start_costs([]) == StartCosts()
    assert start_costs([small]).worker_s == pytest.approx((0.33 + 0.2) / 4), "no serial batch: start-up over workers"
    assert start_costs([TrialResult(config=config(8), status="skipped")]).worker_s is None


@pytest.mark.parametrize("n, costs, usable, expected", [
    (0, H200, 16, 0.0),
    # 32 workers forked one after the other, then 96 burst batches over 16 CPUs (3 per worker: 1 s, CPUs: 2 s)
    (32, H200, 16, 32 * 2.7 / 32 + 96 * 0.33 / 16),
    # waiting batches: each worker makes its 3 burst batches one after the other, CPUs idle
    (8, StartCosts(0.01, 0.1, 0.001), 2, 8 * 0.01 + 3 * 0.1),
    # nothing measured yet: the prior per worker, no burst
    (16, StartCosts(), 4, 16 * PRIOR_WORKER_START_S),
])
def test_predicted_start(n, costs, usable, expected):
    assert predict_start(config(n), costs, usable_cpus=usable) == pytest.approx(expected)


def test_a_32_worker_candidate_of_slow_batches_gets_the_time_to_start_and_be_measured():
    # budget 15 on the H200: the flat limit was 3 s, less than the 2.7 s start-up and 2 s burst
    base = trial_limit(15)
    start = predict_start(config(32), H200, usable_cpus=16)
    limit = admit(config(32), window_limit_s=base, left_s=15 - 4.0, costs=H200, usable_cpus=16, budget_s=15)
    assert base == 3.0 and start > base
    assert limit == pytest.approx(start + base)
    # little left: started only when its start-up and the least window fit, with the window's share cut
    limit = admit(config(32), window_limit_s=base, left_s=start + 1.5, costs=H200, usable_cpus=16, budget_s=15)
    assert limit == pytest.approx(start + 1.5)
    refused = admit(config(32), window_limit_s=base, left_s=start + 0.5, costs=H200, usable_cpus=16, budget_s=15)
    assert isinstance(refused, str) and refused.startswith("budget:") and "budget of 15 s" in refused
    assert "budget=" in refused and "32 workers" in refused
    # fewer workers start sooner: they fit where 32 did not
    assert not isinstance(admit(config(4), window_limit_s=base, left_s=start + 0.5, costs=H200, usable_cpus=16,
                                budget_s=15), str)


def test_the_first_candidate_and_online_ones_get_their_full_limit():
    for left in (0.1, math.inf):
        assert admit(config(32), window_limit_s=3.0, left_s=left, costs=H200, usable_cpus=16, budget_s=15,
                     forced=left < 1) == pytest.approx(predict_start(config(32), H200, usable_cpus=16) + 3.0)
    assert admit(config(0), window_limit_s=3.0, left_s=5.0, costs=H200, usable_cpus=16, budget_s=30) == 3.0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 64), left=st.floats(0.0, 60.0), base=st.floats(1.5, 8.0),
       worker_s=st.one_of(st.none(), st.floats(0.0, 0.5)), batch_s=st.one_of(st.none(), st.floats(0.0, 2.0)),
       usable=st.integers(1, 64))
def test_a_started_candidate_fits_what_is_left_and_covers_its_start_up(n, left, base, worker_s, batch_s, usable):
    """The budget holds and the limit grows with the start-up: a candidate is started only when its predicted start-up
    and the least window fit in what is left, and then its limit covers that start-up, at most what is left (or the
    least window), at most the start-up plus the window's share."""
    costs = StartCosts(worker_s, batch_s, batch_s)
    start = predict_start(config(n), costs, usable_cpus=usable)
    limit = admit(config(n), window_limit_s=base, left_s=left, costs=costs, usable_cpus=usable, budget_s=30)
    if isinstance(limit, str):
        assert start + MIN_LIMIT_S > left
    else:
        assert start + MIN_LIMIT_S <= left
        assert start + MIN_LIMIT_S <= limit <= max(left, start + MIN_LIMIT_S) + 1e-9
        assert limit <= start + base + 1e-9


# ---------------------------------------------------------------- the search, with workers slow to start

class Timed:
    """A driver whose candidates take ``start_s`` per worker to start and 0.33 s per batch per worker, half of it on a
    CPU (the first worker candidate is then 32 on 16 CPUs, as on the H200): one that is given less than its start-up
    and a few batches fails as run_trial does ("only 1 batch")."""

    def __init__(self, start_s=2.7 / 32, batch_s=0.33):
        self.start_s, self.batch_s, self.limits = start_s, batch_s, {}

    def __call__(self, candidate):
        n = candidate.config.num_workers
        self.limits[n] = candidate.limit_s
        startup = n * self.start_s + self.batch_s
        if n and candidate.limit_s < startup + 3 * self.batch_s:
            return TrialResult(config=candidate.config, status="failed", startup_s=startup,
                               reason="only 1 batches within the trial's time limit; too few to measure a rate")
        rate = 16 * min(max(1, n), 32) / self.batch_s
        return TrialResult(config=candidate.config, samples_per_s=rate, batches=48, window_s=48 * 16 / rate,
                           startup_s=startup, consumer_s_per_batch=1e-4, batch_bytes=2**20,
                           fetch_s_per_batch=self.batch_s if n == 0 else None,
                           fetch_cpu_s_per_batch=self.batch_s / 2 if n == 0 else None,
                           worker_cpu_util=0.5 if n else None, worker_uss_bytes=10 * 2**20 if n else None)


def drive(search, model):
    steps = search.steps()
    candidate = next(steps)
    try:
        while True:
            candidate = steps.send(model(candidate))
    except StopIteration as done:
        return done.value


def sixteen_cores():
    profile = full_profile()
    return profile.__class__(**{**profile.__dict__, "cpu": profile.cpu.__class__(
        **{**profile.cpu.__dict__, "usable": 16, "logical": 16})})


def test_the_search_measures_a_32_worker_candidate_of_slow_batches():
    request = Request.checked(LatencyBound(n=100_000), 16, device="cpu", max_workers=32)
    model = Timed()
    result = drive(Search(request, sixteen_cores(), budget=15.0), model)
    table = [(t.config.num_workers, t.status, t.reason) for t in result.trials]
    assert [t.ok for t in result.trials if t.config.num_workers == 32] == [True], table
    assert model.limits[32] > trial_limit(15) and result.num_workers == 32, table
