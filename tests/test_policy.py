"""The tuner's decisions, tested on tables of fake trial results (no trial runs here)."""
import pytest

from autoloader import policy
from autoloader.results import LoaderConfig, TrialResult


def trial(n, rate, *, prefetch=2, status="ok", util=None, main=None, stall=None, fetch=None, cpu=None, pin=False):
    config = LoaderConfig(n, prefetch if n else None, pin, False)
    return TrialResult(config=config, status=status, samples_per_s=rate if status == "ok" else None,
                       worker_cpu_util=util, main_cpu_util=main, stall_fraction=stall,
                       fetch_s_per_batch=fetch, fetch_cpu_s_per_batch=cpu)


@pytest.mark.parametrize("table, expected", [
    # in-memory: workers only add IPC, zero wins by far
    ([(0, 10000), (2, 900), (1, 700)], 0),
    # CPU-bound on 2 cores: 2 workers ~1.7x over 0, 3 no better (within 5 %) -> 2
    ([(0, 100), (2, 170), (3, 172), (1, 98)], 2),
    # latency-bound: 32 workers best, 24 within 5 % -> 24
    ([(0, 50), (8, 400), (32, 1500), (24, 1460), (16, 1000)], 24),
    # slow consumer: every count that keeps up is equal, the fewest wins
    ([(0, 300), (4, 990), (8, 1000), (16, 1000), (6, 1000)], 4),
    # exactly at the tolerance edge: 95 % of the best is still "near"
    ([(0, 95.0), (4, 100.0)], 0),
    ([(0, 94.9), (4, 100.0)], 4),
])
def test_select_fewest_workers_within_tolerance(table, expected):
    chosen = policy.select([trial(n, r) for n, r in table])
    assert chosen.config.num_workers == expected


def test_select_prefers_smaller_prefetch_then_faster():
    trials = [trial(4, 1000, prefetch=4), trial(4, 990, prefetch=2), trial(8, 1010)]
    assert policy.select(trials).config.prefetch_factor == 2
    trials = [trial(4, 900, prefetch=4), trial(4, 1000, prefetch=2)]
    assert policy.select(trials, tolerance=0.2).config.prefetch_factor == 2


def test_select_ignores_failed_and_skipped_and_returns_none_without_rates():
    trials = [trial(0, 100), trial(4, None, status="failed"), trial(8, None, status="skipped")]
    assert policy.select(trials).config.num_workers == 0
    assert policy.select([trial(4, None, status="failed")]) is None
    assert policy.select([]) is None


def test_select_custom_tolerance():
    trials = [trial(0, 80), trial(2, 100)]
    assert policy.select(trials, tolerance=0.05).config.num_workers == 2
    assert policy.select(trials, tolerance=0.25).config.num_workers == 0


@pytest.mark.parametrize("fetch, cpu, consumer, usable, cap, expected", [
    (0.064, 0.064, 0.0, 2, 64, 2),      # CPU-bound, no consumer: fill the cores
    (0.064, 0.064, 0.0, 16, 64, 16),
    (0.160, 0.002, 0.0, 2, 64, 8),      # latency-bound: a first step of max(8, 2 x cores), not 160 at once
    (0.160, 0.002, 0.0, 8, 64, 16),
    (0.160, 0.002, 0.040, 2, 64, 5),    # meets a 40 ms consumer at 160/40 x 1.2 = 4.8 -> 5
    (0.010, 0.010, 0.100, 8, 64, 1),    # consumer far slower than loading: one worker suffices
    (0.160, 0.002, 0.0, 2, 3, 3),       # the cap bounds it
    (0.0, 0.0, 0.0, 2, 64, 1),
])
def test_predict_from_serial(fetch, cpu, consumer, usable, cap, expected):
    assert policy.predict_from_serial(fetch_s=fetch, fetch_cpu_s=cpu, consumer_s=consumer, usable_cpus=usable,
                                      cap=cap) == expected


def test_predict_from_workers_extrapolates_per_worker_rate_and_cpu():
    # 8 waiting workers give 1600 samples/s at 3 % CPU each: CPUs fill at ~67 workers, capped at 64
    assert policy.predict_from_workers(trial(8, 1600, util=0.03), batch_size=32, consumer_s=0.0, usable_cpus=2,
                                       cap=64) == 64
    # a 20 ms consumer of 32-sample batches eats 1600/s; with 1.2 headroom 1920/s at 200/s per worker -> 10
    assert policy.predict_from_workers(trial(8, 1600, util=0.03), batch_size=32, consumer_s=0.02, usable_cpus=2,
                                       cap=64) == 10
    # CPU-bound: 2 workers at 95 % on 2 cores -> stay at 2
    assert policy.predict_from_workers(trial(2, 170, util=0.95), batch_size=32, consumer_s=0.0, usable_cpus=2,
                                       cap=64) == 2
    assert policy.predict_from_workers(trial(0, 100), batch_size=32, consumer_s=0.0, usable_cpus=2, cap=64) is None
    assert policy.predict_from_workers(trial(4, 100), batch_size=32, consumer_s=0.0, usable_cpus=2, cap=64) is None


@pytest.mark.parametrize("rates, expected", [
    ({0: 50, 8: 400}, 16),                      # still climbing: double
    ({0: 50, 8: 400, 16: 800, 32: 1500}, 64),
    ({0: 50, 8: 400, 64: 1600}, 23),            # at the cap: descend between 8 and 64 (geometric middle)
    ({0: 50, 8: 400, 23: 1200, 64: 1600}, 38),
    ({0: 50, 8: 400, 23: 1200, 38: 1550, 64: 1600}, 30),     # 38 within 5 %; 38/23 > 1.5 -> middle 30
    ({0: 50, 8: 400, 23: 1200, 30: 1300, 38: 1550, 64: 1600}, None),   # 38/30 < 1.5: done
    ({0: 100, 2: 170}, 4),                      # cores full, yet more may fill the gaps: measured, not assumed
    ({0: 100, 2: 170, 4: 172}, 1),              # 4 gains < 2.5 %: no climb; 2 is the fewest near the best: try 1
    ({0: 100, 2: 170, 4: 176}, 8),              # 4 gains 3.5 %: small steps add up past the cores, climb on
    ({0: 100, 2: 170, 4: 120}, 1),              # oversubscription lost: stay below
    ({0: 100, 2: 170, 4: 172, 1: 98}, None),
    ({0: 10000, 2: 900}, None),                 # zero is best: nothing to refine
    ({0: 300, 4: 1000, 8: 1000}, 2),            # 4 keeps up as well as 8: is 2 enough?
    ({0: 300, 4: 1000, 8: 1000, 2: 600}, 3),
    ({0: 300, 4: 1000, 8: 1000, 2: 600, 3: 900}, None),
    ({0: 100, 4: None}, 2),                     # the only worker count failed: try half as many
    ({0: 100, 4: None, 2: None, 1: None}, None),  # every count down to one failed: stay at zero
    ({0: 100, 2: 150, 4: None}, 1),             # a failure above is not climbed into again
])
def test_next_worker_count(rates, expected):
    assert policy.next_worker_count(rates, cap=64) == expected


def test_next_worker_count_never_exceeds_cap_nor_repeats():
    assert policy.next_worker_count({0: 50, 8: 400}, cap=10) == 10
    assert policy.next_worker_count({0: 50, 8: 400, 10: 500}, cap=10) is None
    assert policy.next_worker_count({}, cap=10) is None


def test_default_max_workers():
    assert policy.default_max_workers(usable_cpus=2, nofile=20000) == 64
    assert policy.default_max_workers(usable_cpus=32, nofile=None) == 256
    assert policy.default_max_workers(usable_cpus=2, nofile=1024) == 32
    assert policy.default_max_workers(usable_cpus=None, nofile=16) == 1


def test_memory_guard():
    assert policy.memory_guard(8, per_worker_bytes=2**30, budget_bytes=16 * 2**30) is None
    reason = policy.memory_guard(32, per_worker_bytes=2**30, budget_bytes=16 * 2**30)
    assert reason.startswith("memory:") and "32 workers" in reason
    assert policy.memory_guard(32, per_worker_bytes=None, budget_bytes=2**30) is None
    assert policy.memory_guard(0, per_worker_bytes=2**40, budget_bytes=1) is None


def test_shm_guard():
    mib = 2**20
    # 4 workers x 2 prefetch + 2 in hand = 10 batches of 10 MiB = 100 MiB
    assert policy.shm_guard(4, 2, batch_bytes=10 * mib, shm_free_bytes=200 * mib) is None
    reason = policy.shm_guard(4, 2, batch_bytes=10 * mib, shm_free_bytes=64 * mib)
    assert "/dev/shm" in reason and "--shm-size" in reason
    assert policy.shm_guard(4, 2, batch_bytes=10 * mib, shm_free_bytes=None) is None
    assert policy.shm_guard(0, None, batch_bytes=10 * mib, shm_free_bytes=1) is None


def test_keep_workers_alive():
    assert policy.keep_workers_alive(0, per_worker_bytes=None, budget_bytes=None) is False
    assert policy.keep_workers_alive(4, per_worker_bytes=None, budget_bytes=None) is True
    assert policy.keep_workers_alive(4, per_worker_bytes=2**30, budget_bytes=16 * 2**30) is True
    assert policy.keep_workers_alive(16, per_worker_bytes=2**30, budget_bytes=16 * 2**30) is False


def test_worth_more_prefetch():
    near = trial(4, 950, stall=0.2)
    assert policy.worth_more_prefetch(near, consumer_samples_per_s=1000)
    assert not policy.worth_more_prefetch(trial(4, 500, stall=0.5), consumer_samples_per_s=1000)
    assert not policy.worth_more_prefetch(trial(4, 990, stall=0.01), consumer_samples_per_s=1000)
    assert not policy.worth_more_prefetch(near, consumer_samples_per_s=None)
    assert not policy.worth_more_prefetch(trial(0, 950, stall=0.2), consumer_samples_per_s=1000)


@pytest.mark.parametrize("chosen, others, consumer, memory_limited, expected", [
    (trial(4, 990, stall=0.02, util=0.3), [], 1000.0, False, "consumer"),
    (trial(0, 10000, fetch=0.001, cpu=0.001), [trial(2, 900)], None, False, "ipc"),
    (trial(0, 100, fetch=0.1, cpu=0.1), [], None, False, "cpu"),
    (trial(0, 100, fetch=0.1, cpu=0.005), [], None, False, "io"),
    (trial(2, 170, util=0.9, main=0.2, stall=0.5), [], None, False, "cpu"),
    (trial(32, 1500, util=0.02, main=0.3, stall=0.6), [], None, False, "io"),
    (trial(4, 3000, util=0.1, main=0.95, stall=0.6), [], None, False, "ipc"),
    (trial(8, 1500, util=0.02, main=0.3, stall=0.6), [], None, True, "memory"),
])
def test_bottleneck(chosen, others, consumer, memory_limited, expected):
    assert policy.bottleneck(chosen, [chosen, *others], consumer_samples_per_s=consumer, usable_cpus=2,
                             memory_limited=memory_limited) == expected


def test_cpu_saturated():
    assert policy.cpu_saturated(trial(2, 1, util=0.9, main=0.1), usable_cpus=2)
    assert not policy.cpu_saturated(trial(2, 1, util=0.4, main=0.1), usable_cpus=2)
    assert not policy.cpu_saturated(trial(2, 1), usable_cpus=2)


def test_bottleneck_is_the_consumer_when_it_is_busy_most_of_the_window():
    # every count gave ~82 % of the step's own rate (the rest is hand-over overhead): the step still dominates
    busy = TrialResult(config=LoaderConfig(2, 2), samples_per_s=330, batches=40, window_s=2.0,
                       consumer_s_per_batch=0.04, stall_fraction=0.2, worker_cpu_util=0.3, main_cpu_util=0.3)
    assert policy.bottleneck(busy, [busy], consumer_samples_per_s=400, usable_cpus=2, memory_limited=False) \
        == "consumer"
    idle = TrialResult(config=LoaderConfig(2, 2), samples_per_s=330, batches=40, window_s=2.0,
                       consumer_s_per_batch=0.01, stall_fraction=0.7, worker_cpu_util=0.95, main_cpu_util=0.2)
    assert policy.bottleneck(idle, [idle], consumer_samples_per_s=1600, usable_cpus=2, memory_limited=False) == "cpu"
