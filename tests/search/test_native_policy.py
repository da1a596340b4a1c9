"""The native-threads decisions (search/native_policy.py), as pure functions on tables of fake trials."""
import pytest

from autoloader.config import LoaderConfig
from autoloader.probe._pools import NativePool, limit_held
from autoloader.results import TrialResult
from autoloader.search import native_policy as policy

BLAS_2 = (NativePool("libscipy_openblas", "blas", "openblas", 2, 1), NativePool("libgomp", "openmp", "openmp", 1, 1))
BLAS_1 = (NativePool("libscipy_openblas", "blas", "openblas", 1, 1),)


def serial(fetch_s=0.01, cpu_s=0.01, rate=1000.0):
    return TrialResult(config=LoaderConfig(0), samples_per_s=rate, fetch_s_per_batch=fetch_s,
                       fetch_cpu_s_per_batch=cpu_s)


def workers(n, rate, native=1, pools=BLAS_2, status="ok", prefetch=2):
    return TrialResult(config=LoaderConfig(n, prefetch, native_threads=native), status=status,
                       samples_per_s=rate if status == "ok" else None, native_pools=pools)


@pytest.mark.parametrize("usable, n, expected", [
    (2, 0, None), (2, 1, 1), (2, 2, 1), (2, 8, 1), (1, 1, 1), (0, 1, 1),
    (8, 1, 7), (8, 2, 3), (8, 3, 2), (8, 4, 1), (8, 16, 1), (64, 4, 15),
])
def test_share_leaves_the_main_process_one_cpu_and_never_oversubscribes(usable, n, expected):
    assert policy.share(usable, n) == expected
    if n and usable > 1:
        assert n * expected <= max(n, usable - 1), "the workers' pools fit in the CPUs the main process leaves"


@pytest.mark.parametrize("setting, n, limited, expected", [
    (None, 0, True, None), (None, 2, True, 3), (None, 2, False, None),
    (4, 2, True, 4), (4, 2, False, 4), (4, 0, True, None),   # the user's value, never measured without
    (False, 2, True, None), (False, 2, False, None),
])
def test_limit_for_keeps_the_users_setting(setting, n, limited, expected):
    assert policy.limit_for(setting, usable_cpus=8, num_workers=n, limited=limited) == expected


@pytest.mark.parametrize("fetch_s, cpu_s, expected", [
    (0.010, 0.010, False),    # one thread busy
    (0.010, 0.0119, False),   # within the margin of the process's other threads
    (0.010, 0.013, True),     # BLAS on more than one CPU
    (0.010, 0.002, False),    # waiting
    (0.0, 0.01, False), (None, 0.01, False), (0.01, None, False),
])
def test_native_in_use_is_cpu_time_above_wall_time(fetch_s, cpu_s, expected):
    assert policy.native_in_use(serial(fetch_s, cpu_s)) is expected
    assert policy.native_in_use(None) is False


def test_limit_changes_a_pool_found_above_it_or_unknown_pools():
    assert policy.limit_changes(BLAS_2, 1) and not policy.limit_changes(BLAS_1, 1)
    assert not policy.limit_changes(BLAS_2, 2), "nothing above 2"
    assert policy.limit_changes(None, 1), "unknown (no threadpoolctl): measured to find out"
    assert not policy.limit_changes(BLAS_2, None), "no limit: nothing to change"
    assert not policy.limit_changes((), 1)


@pytest.mark.parametrize("serial_trial, chosen, setting, expected", [
    (serial(0.01, 0.02), workers(2, 900.0), None, True),
    (serial(0.01, 0.01), workers(2, 900.0), None, False),        # no native threads in the serial trial
    (None, workers(2, 900.0), None, False),                       # no serial trial: the limit stays
    (serial(0.01, 0.02), workers(2, 900.0), 1, False),            # the user's limit, never measured without
    (serial(0.01, 0.02), workers(2, 900.0, native=None), False, False),
    (serial(0.01, 0.02), workers(2, 900.0, native=None), None, False),  # already without a limit
    (serial(0.01, 0.02), serial(0.01, 0.02), None, False),        # no workers
    (serial(0.01, 0.02), workers(2, None, status="failed"), None, False),
])
def test_worth_comparing(serial_trial, chosen, setting, expected):
    assert policy.worth_comparing(serial_trial, chosen, setting=setting) is expected


@pytest.mark.parametrize("limited, unlimited, keep", [
    (1000.0, 1000.0, True),
    (1100.0, 1000.0, True),
    (960.0, 1000.0, True),     # within the 5 % tie: fewer threads win it
    (940.0, 1000.0, False),    # slower beyond the tie
    (500.0, None, True),       # without the limit it failed
    (None, 500.0, False),      # with it it failed
])
def test_keep_limit_when_measured_at_least_as_fast(limited, unlimited, keep):
    with_limit = workers(2, limited, status="ok" if limited else "failed")
    without = workers(2, unlimited, native=None, status="ok" if unlimited else "failed")
    assert policy.keep_limit(with_limit, without, tolerance=0.05) is keep


def test_without_losers_drops_the_losing_side_of_each_pair_only():
    trials = [serial(), workers(1, 500.0), workers(2, 900.0), workers(2, 1200.0, native=None), workers(4, 950.0)]
    kept = policy.without_losers(trials, tolerance=0.05)
    assert [(t.config.num_workers, t.config.native_threads) for t in kept] == [(0, None), (1, 1), (2, None), (4, 1)]
    trials[3] = workers(2, 920.0, native=None)
    kept = policy.without_losers(trials, tolerance=0.05)
    assert [(t.config.num_workers, t.config.native_threads) for t in kept] == [(0, None), (1, 1), (2, 1), (4, 1)]


def test_without_losers_reads_the_latest_measurement_of_each_side():
    first, again = workers(2, 700.0), workers(2, 1000.0)  # the limited one measured again beside the unlimited one
    trials = [first, workers(2, 990.0, native=None), again]
    kept = policy.without_losers(trials, tolerance=0.05)
    assert first in kept and again in kept and all(t.config.native_threads == 1 for t in kept)


def test_without_losers_leaves_different_prefetch_alone():
    trials = [workers(2, 900.0), workers(2, 2000.0, native=None, prefetch=4)]
    assert policy.without_losers(trials, tolerance=0.05) == trials


def test_pair_and_decision_words_say_why_the_limit_stays_or_goes():
    limited, without = workers(2, 1000.0), workers(2, 980.0, native=None)
    assert policy.pair([workers(2, 500.0), without, limited], limited.config) == (limited, without)
    assert policy.pair([limited], limited.config) is None and policy.decision_words([limited], limited.config,
                                                                                    tolerance=0.05) is None
    kept = policy.decision_words([limited, without], limited.config, tolerance=0.05)
    assert kept == "native pools limited to 1 thread(s) per worker: measured at least as fast as without (within 5%)"
    dropped = policy.decision_words([limited, workers(2, 1500.0, native=None)], without.config, tolerance=0.05)
    assert dropped == "native pools not limited: faster without than limited to 1 per worker"


@pytest.mark.parametrize("limit, pools, expected", [
    (None, BLAS_2, None), (None, None, None),                                  # no limit: nothing to claim
    (1, BLAS_2, True), (1, BLAS_1, True), (2, BLAS_2, True),
    (1, None, False),                                                          # pools unknown: no threadpoolctl
    (1, (NativePool("libscipy_openblas", "blas", "openblas", 8, 4),), False),  # a library that kept more
    (1, (NativePool("libscipy_openblas", "blas", "openblas", 2),), False),     # found 2, no limit applied
    (1, (), True),
])
def test_limit_held_only_when_every_pool_was_seen_under_it(limit, pools, expected):
    assert limit_held(limit, pools) is expected
    if limit is not None:
        assert workers(2, 1.0, native=limit, pools=pools).native_limit_held is expected
    assert workers(0, 1.0, native=None, pools=pools, prefetch=None).native_limit_held is None  # no workers


def test_decision_words_never_claim_a_limit_not_seen_applied():
    limited, without = workers(2, 1000.0, pools=None), workers(2, 980.0, native=None, pools=None)
    words = policy.decision_words([limited, without], limited.config, tolerance=0.05)
    assert "not seen applied" in words and "limited to" not in words
