"""The tuner's decisions, tested on tables of fake trial results (no trial runs here)."""
import dataclasses

import pytest

from autoloader.search import policy, thread_bounds, threads_policy
from autoloader.search.capacity import fill_count, step_share
from autoloader.config import LoaderConfig
from autoloader.results import TrialResult
from search_fakes import MIB, tt


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
    (0.0325, 0.03234, 0.0, 2, 64, 2),   # a share measured 0.995: 2 CPUs fit 2 workers, not 3
    (0.064, 0.0256, 0.0, 2, 64, 5),     # a share of 0.4: 5 workers fill 2 CPUs
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


@pytest.mark.parametrize("workers_rate, serial_rate, expected", [
    (9037, 11922, None),    # H200, in-memory dict samples: 16 idle workers slower than none -> nothing to extrapolate
    (12100, 11922, None),   # within half the tolerance of serial: the workers added nothing
    (12400, 11922, 128),    # 4 % over serial: they did add, extrapolate by their CPU (16 / 0.07 -> 228, capped)
    (9037, None, 128),      # no serial figure: extrapolate as before
])
def test_predict_from_workers_needs_workers_that_beat_serial(workers_rate, serial_rate, expected):
    assert policy.predict_from_workers(trial(16, workers_rate, util=0.07), batch_size=64, consumer_s=0.0,
                                       usable_cpus=16, cap=128, serial_samples_per_s=serial_rate) == expected



@pytest.mark.parametrize("main, expected, why", [
    (0.15, 9, "the main process was free: the one worker was the limit; extrapolated by its CPU (2 / 0.22 -> 9)"),
    (0.95, None, "the main process was busy handing over: nothing to extrapolate"),
])
def test_a_first_pool_slower_than_serial_for_its_own_workers_is_extrapolated(main, expected, why):
    """Drawn seed 6 (big-samples): 5.9 MB batches waiting 21 ms on storage; one worker made 593/s against serial's 685
    (it loads and hands over what the main process loaded alone), 8 made 3,000/s; the search ended at 0 workers."""
    one = trial(1, 593.0, util=0.22, main=main, stall=0.97)
    assert policy.predict_from_workers(one, batch_size=19, consumer_s=0.0012, usable_cpus=2, cap=64,
                                       serial_samples_per_s=685.0) == expected, why

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
    # drawn seed 0 (a service admitting 12 at once): 8 still rising, 64 contending below them: the peak is between
    ({0: 133, 8: 1071, 64: 980}, 23),
    ({0: 132, 8: 1069, 64: 1101}, 23),                       # as much, not more: a peak between may beat both
    ({0: 132, 8: 1069, 16: None, 64: 1101}, 4),              # but not past a count that failed
    ({0: 133, 8: 1071, 64: 980, 23: 1500}, 38),
    ({0: 133, 8: 1071, 64: 980, 23: 1500, 38: 1400}, 14),   # 38 is within a doubling of 23: descend
    ({0: 133, 8: 1071, 64: 980, 23: 900}, 14),               # 23 made less too: the peak is below it
    ({0: 300, 4: 1000, 8: 1010, 64: 990}, 2),                # 8 gained nothing over 4: a plateau, descend
])
def test_next_worker_count(rates, expected):
    assert policy.next_worker_count(rates, cap=64) == expected


@pytest.mark.parametrize("rates, refused, expected, why", [
    ({0: 100, 2: 150, 4: None}, [4], 3, "refused for memory (a whole epoch's forecast): halfway to it"),
    ({0: 100, 2: 150, 3: 160, 4: None}, [4], None, "then done: nothing between the best and the ceiling"),
    ({0: 50, 8: 400, 16: None}, [16], 12, "8 measured, 16 over the budget: 12"),
    ({0: 50, 8: 400, 16: None}, [], 4, "16 failed (out of file descriptors): not approached, the descent goes on"),
    ({0: 50, 8: 400, 12: None, 16: None}, [16], 4, "the lowest ceiling (12) failed: not approached"),
])
def test_the_climb_goes_halfway_to_a_memory_ceiling_only(rates, refused, expected, why):
    assert policy.next_worker_count(rates, cap=64, refused=refused) == expected, why


def test_next_worker_count_never_exceeds_cap_nor_repeats():
    assert policy.next_worker_count({0: 50, 8: 400}, cap=10) == 10
    assert policy.next_worker_count({0: 50, 8: 400, 10: 500}, cap=10) is None
    assert policy.next_worker_count({}, cap=10) is None


def test_worth_more_prefetch():
    near = trial(4, 950, stall=0.2)
    assert policy.worth_more_prefetch(near, consumer_samples_per_s=1000)
    assert not policy.worth_more_prefetch(trial(4, 500, stall=0.5), consumer_samples_per_s=1000)
    assert not policy.worth_more_prefetch(trial(4, 990, stall=0.01), consumer_samples_per_s=1000)
    assert not policy.worth_more_prefetch(near, consumer_samples_per_s=None)
    assert not policy.worth_more_prefetch(trial(0, 950, stall=0.2), consumer_samples_per_s=1000)


# ---------------------------------------------------------------- processes x threads (NOTE [ Processes x threads ])
# select's side of it: the thread decisions are tested in test_threads_policy.py, their bounds in test_thread_bounds.py


@pytest.mark.parametrize("table, expected", [
    # 2 x 32 threads matches 64 processes: fewest processes wins
    ([(64, 1, 10275), (2, 32, 11264), (1, 32, 5401), (2, 16, 6818)], (2, 32)),
    # threads slower than the tolerance allows: the process-only config stays
    ([(8, 1, 1000), (2, 8, 900)], (8, 1)),
    # same processes: fewest threads
    ([(2, 1, 1000), (2, 8, 1010), (2, 4, 990)], (2, 1)),
    ([(2, 16, 1000), (2, 8, 990), (4, 1, 1000)], (2, 8)),
    # threads in the main process (num_workers=0) count as no worker process
    ([(0, 8, 1000), (2, 1, 1000)], (0, 8)),
])
def test_select_fewest_processes_then_fewest_threads(table, expected):
    chosen = policy.select([tt(n, t, r) for n, t, r in table])
    assert (chosen.config.num_workers, chosen.config.threads) == expected


def test_select_least_worker_memory_before_prefetch_and_ignores_small_differences():
    lean, fat = tt(2, 8, 1000, memory=40, prefetch=4), tt(2, 8, 1000, memory=400, prefetch=2)
    assert policy.select([fat, lean]) is lean
    # a few MiB apart is measurement noise: the smaller prefetch_factor decides, as without memory figures
    near = [tt(2, 8, 1000, memory=41, prefetch=4), tt(2, 8, 990, memory=40, prefetch=2)]
    assert policy.select(near).config.prefetch_factor == 2
    assert policy.select([tt(2, 1, 1000, prefetch=4), tt(2, 1, 990, prefetch=2)]).config.prefetch_factor == 2


def test_worker_memory_is_the_sum_of_uss():
    assert tt(4, 1, 1.0, memory=200).worker_memory_bytes == 200 * MIB
    per_worker = TrialResult(config=LoaderConfig(4, 2), samples_per_s=1.0, worker_uss_bytes=50 * MIB)
    assert per_worker.worker_memory_bytes == 200 * MIB
    assert tt(0, 8, 1.0).worker_memory_bytes == 0
    assert tt(2, 1, 1.0).worker_memory_bytes is None


@pytest.mark.parametrize("cpus, share, expected", [
    (2, 1.0, 2), (2, 0.998, 2), (2, 0.8, 3), (2, 0.81, 2), (16, 0.95, 17), (16, 0.9, 18), (64, 1.0, 64),
    (2, 0.001, 200), (2, 1.5, 2), (1, 0.9, 1)])
def test_fill_count_is_the_count_whose_cpu_use_comes_nearest_the_cpus(cpus, share, expected):
    assert fill_count(usable_cpus=cpus, share=share) == expected


@pytest.mark.parametrize("cpus, share, step, expected, why", [
    (2, 1.0, 1.0, 1, "each worker's batches cost the step a CPU as well: one worker and the step fill 2"),
    (2, 0.5, 0.5, 2, "half a CPU each, and as much of the step's per worker"),
    (2, 1.0, 0.01, 2, "a step of bookkeeping: the cores rule"),
    (16, 0.1, 0.3, 40, "waiting workers beside a step on the CPU"),
])
def test_fill_count_counts_the_steps_cpu_at_the_pace_the_workers_feed_it(cpus, share, step, expected, why):
    assert fill_count(usable_cpus=cpus, share=share, step_share=step) == expected, why


@pytest.mark.parametrize("busy, step_s, worker_batch_s, expected", [
    (0.8, 0.0003, 0.03, 0.008), (1.9, 0.05, 0.1, 0.95), (1.0, 0.01, 0.01, 1.0), (0.0, 0.05, 0.1, 0.0),
    (1.0, None, 0.1, 0.0), (1.0, 0.05, None, 0.0), (1.0, 0.05, 0.0, 0.0)])
def test_step_share_is_the_steps_cpu_per_second_of_one_worker(busy, step_s, worker_batch_s, expected):
    assert step_share(busy_cpus=busy, consumer_s=step_s, worker_batch_s=worker_batch_s) == pytest.approx(expected)


def test_workers_needed_is_what_predict_from_serial_caps():
    # 2 % of a CPU per batch in flight: 100 fill 2 CPUs; the consumer (10 ms a batch, 128 ms to load) needs 15.36
    assert policy.workers_needed(fetch_s=0.128, fetch_cpu_s=0.00256, consumer_s=0.0, usable_cpus=2) == \
        pytest.approx(100)
    assert policy.workers_needed(fetch_s=0.128, fetch_cpu_s=0.00256, consumer_s=0.01, usable_cpus=2) == \
        pytest.approx(15.36)
    assert policy.workers_needed(fetch_s=0.0, fetch_cpu_s=0.0, consumer_s=0.0, usable_cpus=2) == 1.0
    assert policy.predict_from_serial(fetch_s=0.128, fetch_cpu_s=0.00256, consumer_s=0.0, usable_cpus=2,
                                      cap=64) == 8


def test_policy_holds_the_process_decisions_and_threads_policy_the_thread_ones():
    # thread_search reads threads_policy and thread_bounds directly; policy only borrows fewest_near for select
    thread_only = ("busy_fraction", "first_thread_config", "next_thread_config", "threads_to_cover_wait",
                   "MAX_THREAD_TRIALS", "waits", "first_threads_first", "climb_threads", "next_threads_first",
                   "fewest_near", "THREADS_FIRST_TRIALS")
    bounds_only = ("thread_processes", "max_threads_per_process", "MAX_THREADS", "threads_first_processes",
                   "process_reference", "THREADS_FIRST_PROCESSES_PER_CPU")
    assert all(hasattr(threads_policy, n) for n in thread_only)
    assert set(bounds_only) <= set(thread_bounds.__all__) and not any(hasattr(threads_policy, n) for n in bounds_only)
    assert not (set(thread_only) | set(bounds_only)) & set(policy.__all__)
    assert all(hasattr(policy, n) for n in policy.__all__)


@pytest.mark.parametrize("rates, consumer, expected", [
    ({0: 100.0, 8: 900.0}, None, 64),                 # no step measured: no limit but the cap
    ({0: 100.0, 8: 900.0}, 1000.0, 64),               # 8 does not keep up with the step: climb on
    ({0: 100.0, 8: 960.0, 16: 1000.0}, 1000.0, 8),    # 8 keeps up (within 5 %): never more than 8
    ({0: 990.0, 4: 1000.0}, 1000.0, 4),               # the serial count never sets the cap
    ({8: None, 4: 1000.0}, 1000.0, 4),
])
def test_climb_cap(rates, consumer, expected):
    assert policy.climb_cap(rates, cap=64, ceiling_samples_per_s=consumer) == expected


def _serial(fetch_s: float, cpu_s: float, *, batch: int = 32) -> TrialResult:
    return TrialResult(config=LoaderConfig(0), samples_per_s=batch / fetch_s, batches=20, window_s=20 * fetch_s,
                       fetch_s_per_batch=fetch_s, fetch_cpu_s_per_batch=cpu_s)


@pytest.mark.parametrize("serial, consumer, expected", [
    (_serial(0.010, 0.010), None, 2 * 3200.0),        # CPU-bound: 2 CPUs' worth of 10 ms per batch of 32
    (_serial(0.010, 0.010), 5000.0, 5000.0),          # the step is the lower bound
    (_serial(0.010, 0.001), None, 2 * 32000.0),       # waiting: a high CPU bound, reached only by many workers
    (_serial(0.010, 0.0), 700.0, 700.0),              # no CPU measured: the step only
    (_serial(0.010, 0.0), None, None),
    (None, 900.0, 900.0),
    (TrialResult(config=LoaderConfig(0), status="failed", reason="x"), None, None),
])
def test_rate_ceiling(serial, consumer, expected):
    assert policy.rate_ceiling(serial, batch_size=32, usable_cpus=2, consumer_samples_per_s=consumer) == expected


def _pool(n: int, samples_per_s: float, *, util: float, main: float) -> TrialResult:
    return TrialResult(config=LoaderConfig(n, 2) if n else LoaderConfig(0), samples_per_s=samples_per_s, batches=20,
                       window_s=1.0,
                       worker_cpu_util=util, main_cpu_util=main)


@pytest.mark.parametrize("pool, consumer, expected, why", [
    (_pool(2, 681.0, util=0.16, main=0.3), None, 681.0 * 2 / 0.62, "its CPU, not the serial trial's 2 x 3,200/s"),
    (_pool(2, 6200.0, util=0.95, main=0.1), None, 6200.0 * 2 / 2.0, "saturated: the ceiling is what it made"),
    (_pool(2, 681.0, util=0.16, main=0.3), 900.0, 900.0, "the step is still the lower bound"),
    (_pool(2, 681.0, util=None, main=0.3), None, 2 * 3200.0, "no CPU measured: the serial model"),
    (_pool(0, 3200.0, util=None, main=1.0), None, 2 * 3200.0, "no workers: the serial model"),
])
def test_a_measured_pools_cpu_supersedes_the_serial_model(pool, consumer, expected, why):
    assert policy.rate_ceiling(_serial(0.010, 0.010), batch_size=32, usable_cpus=2, consumer_samples_per_s=consumer,
                               pool=pool) == pytest.approx(expected), why


def test_a_cpu_bound_climb_stops_at_the_cpu_ceiling():
    """The serial trial says 2 CPUs load at most 6,400 samples/s: 2 workers at 6,200 reach it, so the search proposes
    no 4 (it would without the ceiling), only the descent to 1."""
    rates = {0: 3200.0, 2: 6200.0}
    ceiling = policy.rate_ceiling(_serial(0.010, 0.010), batch_size=32, usable_cpus=2, consumer_samples_per_s=None)
    assert policy.next_worker_count(rates, cap=64) == 4
    assert policy.next_worker_count(rates, cap=policy.climb_cap(rates, cap=64, ceiling_samples_per_s=ceiling)) == 1


@pytest.mark.parametrize("serial, consumer, step_s, usable, cap, expected, why", [
    (_serial(0.128, 0.00256), None, 0.0, 2, 64, 8, "waiting serial loading, step unknown: the first step (8)"),
    (_serial(0.128, 0.00256), 500.0, 0.064, 2, 64, 3, "a step of 64 ms: 1.2 x 128 / 64 = 2.4, rounded up"),
    (_serial(0.128, 0.00256), 250.0, 0.128, 2, 64, 0, "a step of 128 ms: serial loading keeps up already"),
    (_serial(0.010, 0.010), 1000.0, 0.032, 2, 64, 0, "serial loading (3,200/s) already feeds a 1,000/s step"),
    (_serial(0.010, 0.010), 3100.0, 0.01, 2, 64, 0, "3,200/s is within 5 % of a 3,100/s step: no workers"),
    (_serial(0.010, 0.010), 4000.0, 0.008, 2, 64, 2, "short of the step, CPU-bound: the 2 CPUs"),
    (_serial(0.128, 0.00256), None, 0.0, 2, 4, 4, "never past the cap"),
    (None, 1000.0, 0.032, 3, 64, 3, "serial failed: the usable CPUs"),
    (None, None, 0.0, 3, 2, 2, "... at most the cap"),
    (None, None, 0.0, 3, 0, 0, "max_workers=0: none"),
])
def test_first_count(serial, consumer, step_s, usable, cap, expected, why):
    assert policy.first_count(serial, consumer_samples_per_s=consumer, consumer_s=step_s, usable_cpus=usable,
                              cap=cap) == expected, why


@pytest.mark.parametrize("step_cpu_s, expected, why", [
    (0.0, 2, "a step that leaves the CPUs free: the 2 CPUs"),
    (0.019, 1, "a step keeping 1.9 of 2 CPUs busy: one worker, on what it leaves (at least one is measured)"),
    (0.01, 1, "a step keeping one CPU busy: one worker fills the other"),
    (0.002, 2, "a step keeping a fifth of a CPU busy: not counted (capacity.STEP_CPU_FLOOR)"),
])
def test_the_first_count_fills_what_the_step_leaves(step_cpu_s, expected, why):
    """Issue 59: a step on the CPU runs torch's intra-op pool on the workers' cores."""
    serial = dataclasses.replace(_serial(0.020, 0.020), consumer_s_per_batch=0.01, consumer_cpu_s_per_batch=step_cpu_s)
    assert policy.first_count(serial, consumer_samples_per_s=3200.0, consumer_s=0.01, usable_cpus=2,
                              cap=64) == expected, why


def _limited(n, rate, *, limit):
    return TrialResult(config=LoaderConfig(n, 2, native_threads=limit), samples_per_s=rate)


@pytest.mark.parametrize("trials, expected, why", [
    ([trial(0, 100), trial(4, 400), trial(4, 380)], [0, 2], "a configuration measured again: its latest"),
    ([trial(4, 400), trial(0, 100), trial(4, 380), trial(8, 420)], [1, 2, 3], "the order measured stays"),
    ([_limited(4, 1000, limit=1), _limited(4, 700, limit=None)], [0], "limited and at least as fast: unlimited drops"),
    ([_limited(4, 700, limit=1), _limited(4, 1000, limit=None)], [1], "faster without the limit: limited drops"),
    ([], [], "nothing measured"),
])
def test_contenders(trials, expected, why):
    assert policy.contenders(trials, tolerance=0.05) == [trials[i] for i in expected], why

