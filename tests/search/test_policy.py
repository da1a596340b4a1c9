"""The tuner's decisions, tested on tables of fake trial results (no trial runs here)."""
import dataclasses
import itertools

import pytest

from autoloader.search import policy, threads_policy
from autoloader.search.bounds import default_max_workers
from autoloader.config import LoaderConfig
from autoloader.probe._pools import NativePool
from autoloader.results import TrialResult


def pooled(n, rate, *, found, kept=None, limit=None):
    """A worker trial whose workers reported their BLAS pool: ``found`` threads, ``kept`` under ``limit``."""
    pool = NativePool("libscipy_openblas", "blas", "openblas", found,
                      None if limit is None else (kept if kept is not None else min(found, limit)))
    return dataclasses.replace(trial(n, rate), config=LoaderConfig(n, 2, False, False, native_threads=limit),
                               native_pools=(pool,))


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


@pytest.mark.parametrize("workers_rate, serial_rate, expected", [
    (9037, 11922, None),    # H200, in-memory dict samples: 16 idle workers slower than none -> nothing to extrapolate
    (12100, 11922, None),   # within half the tolerance of serial: the workers added nothing
    (12400, 11922, 128),    # 4 % over serial: they did add, extrapolate by their CPU (16 / 0.07 -> 228, capped)
    (9037, None, 128),      # no serial figure: extrapolate as before
])
def test_predict_from_workers_needs_workers_that_beat_serial(workers_rate, serial_rate, expected):
    assert policy.predict_from_workers(trial(16, workers_rate, util=0.07), batch_size=64, consumer_s=0.0,
                                       usable_cpus=16, cap=128, serial_samples_per_s=serial_rate) == expected


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
    assert default_max_workers(usable_cpus=2, nofile=20000) == 64
    assert default_max_workers(usable_cpus=32, nofile=None) == 256
    assert default_max_workers(usable_cpus=2, nofile=1024) == 32
    assert default_max_workers(usable_cpus=None, nofile=16) == 1


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
    # serial loading ran native threads (CPU 1.8x its wall time) and workers were slower:
    (trial(0, 200, fetch=0.05, cpu=0.09), [trial(2, 120)], None, False, "oversubscription"),  # their pools unknown
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(2, 120, found=2)], None, False, "oversubscription"),  # 2 x 2 > 2
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(2, 120, found=2, limit=1)], None, False, "cpu"),  # held to 1
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(4, 120, found=2, limit=1)], None, False, "cpu"),  # 4 x 1 thread
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(2, 120, found=8, kept=4, limit=1)], None, False,
     "oversubscription"),                                                                        # a pool kept 4
    (trial(0, 200, fetch=0.05, cpu=0.05), [trial(2, 120)], None, False, "ipc"),  # one thread: the transfer lost
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


# ---------------------------------------------------------------- processes x threads (NOTE [ Processes x threads ])

MIB = 1 << 20


def tt(n, threads, rate, *, util=None, memory=None, prefetch=2, status="ok", fetch=None, cpu=None):
    """A trial of ``n`` processes x ``threads`` threads; ``memory``: the workers' summed USS in MiB."""
    config = LoaderConfig(n, prefetch if n else None, False, False, threads)
    return TrialResult(config=config, status=status, samples_per_s=rate if status == "ok" else None,
                       worker_cpu_util=util, fetch_s_per_batch=fetch, fetch_cpu_s_per_batch=cpu,
                       worker_uss_total_bytes=None if memory is None else memory * MIB)


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


@pytest.mark.parametrize("trial_, expected", [
    (tt(4, 1, 100, util=0.25), 0.25),
    (tt(0, 1, 100, fetch=0.1, cpu=0.02), pytest.approx(0.2)),
    (tt(0, 1, 100, fetch=0.1, cpu=0.3), 1.0),     # several threads of the main process: capped at one CPU
    (dataclasses.replace(tt(0, 1, 100, fetch=0.1, cpu=0.02), fetch_delay_s_per_batch=0.06), pytest.approx(0.5)),
    (dataclasses.replace(tt(0, 1, 100, fetch=0.1, cpu=0.05), fetch_delay_s_per_batch=0.05), 1.0),  # CPU-bound, busy box
    (dataclasses.replace(tt(0, 1, 100, fetch=0.1, cpu=0.05), fetch_delay_s_per_batch=0.09), 1.0),  # clocks disagree a bit
    (tt(4, 1, 100), None),
    (tt(4, 1, None, status="failed", util=0.1), None),
])
def test_busy_fraction(trial_, expected):
    assert threads_policy.busy_fraction(trial_) == expected


@pytest.mark.parametrize("chosen, fixed, cap, usable, max_threads, expected", [
    (64, None, 64, 2, 64, (1, 2)),      # few processes: up to the usable CPUs
    (64, None, 64, 2, 16, (1, 4)),      # batch 16: 16 threads a process, 4 processes keep 64 samples in flight
    (64, None, 16, 2, 4, (1, 16)),      # ... never more than the cap
    (3, None, 64, 8, 64, (1, 3)),       # never more than the process-only choice
    (8, None, 4, 8, 64, (1, 4)),        # nor the cap
    (0, None, 64, 2, 64, (0, 0)),       # no workers chosen: threads in the main process
    (4, None, 0, 2, 64, (0, 0)),        # max_workers=0
    (4, 3, 64, 2, 64, (3, 3)),          # the user's num_workers
])
def test_thread_processes(chosen, fixed, cap, usable, max_threads, expected):
    assert threads_policy.thread_processes(chosen, fixed_workers=fixed, cap=cap, usable_cpus=usable,
                                           max_threads=max_threads) == expected


@pytest.mark.parametrize("chosen, processes, max_threads, consumer, expected", [
    # 64 waiting workers at 2 % CPU: cover 50 threads, capped at the batch (32); 64 samples in flight in 2 processes
    (tt(64, 1, 10000, util=0.02), (1, 2), 32, None, (2, 32)),
    # 16 workers at 10 % CPU: 10 threads cover one process's wait; 16 in flight -> 2 processes x 10
    (tt(16, 1, 4000, util=0.1), (1, 2), 64, None, (2, 10)),
    # 4 workers at 30 %: 4 threads cover the wait in one process
    (tt(4, 1, 1000, util=0.3), (1, 2), 64, None, (1, 4)),
    # busy processes (CPU-bound, GIL-bound): no thread candidate, by measurement of the process-only trials
    (tt(2, 1, 1000, util=0.95), (1, 2), 64, None, None),
    (tt(0, 1, 500, fetch=0.1, cpu=0.09), (0, 0), 64, None, None),
    # unknown CPU figures: nothing to go on
    (tt(8, 1, 1000), (1, 2), 64, None, None),
    # a batch of one sample cannot use two threads
    (tt(8, 1, 1000, util=0.1), (1, 2), 1, None, None),
    # serial and waiting with max_workers=0: threads in the main process
    (tt(0, 1, 100, fetch=0.1, cpu=0.01), (0, 0), 64, None, (0, 10)),
    # the process-only choice already feeds the consumer and no process can be spared: nothing to gain
    (tt(1, 1, 1000, util=0.2), (1, 1), 64, 1000.0, None),
    # ... but with processes to spare, fewer processes are worth a try
    (tt(4, 1, 1000, util=0.2), (1, 2), 64, 1000.0, (1, 5)),
])
def test_first_thread_config(chosen, processes, max_threads, consumer, expected):
    assert threads_policy.first_thread_config(chosen, processes=processes, max_threads=max_threads,
                                              consumer_samples_per_s=consumer, tolerance=0.05) == expected


@pytest.mark.parametrize("tried, reference, processes, max_threads, expected", [
    # the measured run on 2 cores (issue 16): 2 x 32 threads match 64 processes; first the control, 2 processes
    # without threads measured again side by side; far short: 1 x 64 would exceed the batch of 32, so halve the
    # threads; 16 short too, and the prediction from 16 and 32 (27) saves too little: done
    ([tt(2, 32, 11264, util=0.29)], 10275, (1, 2), 32, (2, 1)),
    ([tt(2, 32, 11264, util=0.29), tt(2, 1, 700, util=0.02)], 10275, (1, 2), 32, (2, 16)),
    ([tt(2, 32, 11264, util=0.29), tt(2, 1, 700, util=0.02), tt(2, 16, 6818, util=0.18)], 10275, (1, 2), 32, None),
    # within tolerance at 2 processes, control short, room for the same samples in flight in one: try 1 x 2t ...
    ([tt(2, 8, 1000, util=0.3), tt(2, 1, 200, util=0.05)], 1000, (1, 2), 64, (1, 16)),
    # ... which keeps up: its own control next
    ([tt(2, 8, 1000, util=0.3), tt(2, 1, 200, util=0.05), tt(1, 16, 990, util=0.6)], 1000, (1, 2), 64, (1, 1)),
    # ... or fell short with a saturated CPU: fewer threads at 2 processes instead
    ([tt(2, 8, 1000, util=0.3), tt(2, 1, 200, util=0.05), tt(1, 16, 600, util=0.95)], 1000, (1, 2), 64, (2, 4)),
    # short with a saturated process (CPU work or a GIL-bound transform): more processes, up to the bound
    ([tt(1, 8, 500, util=0.97)], 1000, (1, 2), 64, (2, 8)),
    ([tt(1, 8, 500, util=0.97), tt(2, 8, 700, util=0.97)], 1000, (1, 2), 64, None),
    # short and idle CPU: twice the threads while that gains
    ([tt(1, 8, 500, util=0.3)], 1000, (1, 2), 64, (1, 16)),
    ([tt(1, 8, 500, util=0.3), tt(1, 16, 505, util=0.3)], 1000, (1, 2), 64, None),
    # threads at the batch's size (no more allowed) and still short: more processes, up to the bound (issue 16's
    # benchmark at batch 16: 4 x 16 matched 64 waiting workers, 2 x 16 could not)
    ([tt(1, 32, 500, util=0.3)], 1000, (1, 2), 32, (2, 32)),
    ([tt(2, 16, 5247, util=0.2)], 8935, (1, 4), 16, (4, 16)),
    ([tt(2, 32, 500, util=0.3)], 1000, (1, 2), 32, None),       # the bound reached
    # a failed thread candidate (not thread-safe, out of memory) ends the search
    ([tt(2, 8, None, status="failed")], 1000, (1, 2), 64, None),
    # fewer threads as two measurements above one thread predict (linear in threads), when that saves a quarter:
    # 8 threads short at 900, 32 at 1000: 950 at ~20 threads; 8 at 200: ~31, not worth a trial
    ([tt(2, 32, 1000, util=0.3), tt(2, 1, 100), tt(2, 8, 900, util=0.3)], 1000, (2, 2), 64, (2, 20)),
    ([tt(2, 32, 1000, util=0.3), tt(2, 1, 100), tt(2, 8, 200, util=0.1)], 1000, (2, 2), 64, None),
    # a GIL-bound transform on a busy machine: 2 x 3 threads kept up with 3 processes measured seconds earlier (the
    # 2-process trial then happened to run slow); the control measures 2 processes again, side by side ...
    ([tt(1, 3, 693, util=0.79), tt(2, 3, 1048, util=0.65)], 1099, (1, 2), 64, (2, 1)),
    # ... and keeps up: threads do not pay, the search ends (selection keeps the one thread)
    ([tt(1, 3, 693, util=0.79), tt(2, 3, 1048, util=0.65), tt(2, 1, 1040, util=0.9)], 1099, (1, 2), 64, None),
    # ... or falls short: threads did pay; halving 3 threads leaves one: done (selection keeps 2 x 3)
    ([tt(1, 3, 693, util=0.79), tt(2, 3, 1048, util=0.65), tt(2, 1, 500, util=0.5)], 1099, (1, 2), 64, None),
    # threads in the main process (processes fixed at 0): the serial control, then halving
    ([tt(0, 10, 900, fetch=0.01, cpu=0.004)], 900, (0, 0), 64, (0, 1)),
    ([tt(0, 10, 900, fetch=0.01, cpu=0.004), tt(0, 1, 100, fetch=0.01, cpu=0.001)], 900, (0, 0), 64, (0, 5)),
])
def test_next_thread_config(tried, reference, processes, max_threads, expected):
    proposal = threads_policy.next_thread_config(tried, reference=reference, processes=processes,
                                                 max_threads=max_threads, tolerance=0.05)
    assert proposal == expected


def test_thread_search_ends_within_its_trials_on_any_table():
    """Whatever the rates, the proposals never repeat a candidate and stay within the bounds."""
    rates = {}
    for seed, (lo, hi), cap in itertools.product(range(30), [(1, 2), (0, 0), (3, 3)], [4, 32]):
        tried, proposal = [], (hi, min(cap, 8))
        for _ in range(10):
            if proposal is None:
                break
            p, t = proposal
            assert lo <= p <= hi and 1 <= t <= cap and proposal not in [(x.config.num_workers, x.config.threads)
                                                                        for x in tried]
            rate = rates.setdefault((seed, p, t), 100.0 * (1 + (hash((seed, p, t)) % 17) / 8))
            tried.append(tt(p, t, rate, util=((seed * 7 + t) % 10) / 10))
            proposal = threads_policy.next_thread_config(tried, reference=200.0, processes=(lo, hi),
                                                         max_threads=cap, tolerance=0.05)


# -- threads first (issue 23) ---------------------------------------------------------------------------------

SERIAL_WAITS = tt(0, 1, 240, fetch=0.128, cpu=0.002)   # batch 32 x 4 ms of sleep: 2 % of a CPU
SERIAL_BUSY = tt(0, 1, 900, fetch=0.016, cpu=0.0155)   # GIL-bound Python: the CPU all the time


@pytest.mark.parametrize("serial, max_threads, expected", [
    (SERIAL_WAITS, 32, True),
    (SERIAL_BUSY, 16, False),
    (tt(0, 1, 240, fetch=0.1, cpu=0.05), 32, False),    # exactly WAITING_BUSY: not "mostly waits"
    (SERIAL_WAITS, 1, False),                           # batches of one sample: nothing for a second thread
    (tt(0, 1, 240), 32, False),                         # no CPU figures: nothing to go on
    (tt(0, 1, None, status="failed"), 32, False),
])
def test_waits(serial, max_threads, expected):
    assert threads_policy.waits(serial, max_threads=max_threads) is expected


@pytest.mark.parametrize("cap, usable, max_threads, expected", [
    (64, 2, 32, (1, 8)),       # 4 x the usable CPUs
    (64, 2, 4, (1, 16)),       # batch 4: 16 processes keep cap=64 samples in flight
    (3, 2, 32, (1, 3)),        # never more than the cap
    (1, 8, 32, (1, 1)),
    (0, 2, 32, (0, 0)),        # max_workers=0: no threads-first search
])
def test_threads_first_processes(cap, usable, max_threads, expected):
    assert threads_policy.threads_first_processes(cap=cap, usable_cpus=usable, max_threads=max_threads) == expected


def test_workers_needed_is_what_predict_from_serial_caps():
    # 2 % of a CPU per batch in flight: 100 fill 2 CPUs; the consumer (10 ms a batch, 128 ms to load) needs 15.36
    assert policy.workers_needed(fetch_s=0.128, fetch_cpu_s=0.00256, consumer_s=0.0, usable_cpus=2) == \
        pytest.approx(100)
    assert policy.workers_needed(fetch_s=0.128, fetch_cpu_s=0.00256, consumer_s=0.01, usable_cpus=2) == \
        pytest.approx(15.36)
    assert policy.workers_needed(fetch_s=0.0, fetch_cpu_s=0.0, consumer_s=0.0, usable_cpus=2) == 1.0
    assert policy.predict_from_serial(fetch_s=0.128, fetch_cpu_s=0.00256, consumer_s=0.0, usable_cpus=2,
                                      cap=64) == 8


@pytest.mark.parametrize("serial, needed, processes, max_threads, usable, expected", [
    # issue 23's row (4 ms, batch 32): 100 workers' worth in flight -> the batch's 32 threads in the usable 2 CPUs
    (SERIAL_WAITS, 100.0, (1, 4), 32, 2, (2, 32)),
    # batch 16: threads capped at 16, still 2 processes to start (the climb adds more)
    (SERIAL_WAITS, 100.0, (1, 4), 16, 2, (2, 16)),
    # a slow consumer needs 3.8 workers' worth: one process with 4 threads
    (SERIAL_WAITS, 3.84, (1, 4), 32, 2, (1, 4)),
    # a quarter of a CPU per sample: 4 threads cover the wait; 8 workers' worth -> 2 x 4
    (tt(0, 1, 240, fetch=0.1, cpu=0.025), 8.0, (1, 4), 64, 2, (2, 4)),
    # never fewer than 2 threads
    (SERIAL_WAITS, 1.0, (1, 4), 32, 2, (1, 2)),
    # loading that does not wait, or no process allowed: no threads-first candidate
    (SERIAL_BUSY, 100.0, (1, 4), 16, 2, None),
    (SERIAL_WAITS, 100.0, (0, 0), 32, 2, None),
])
def test_first_threads_first(serial, needed, processes, max_threads, usable, expected):
    assert threads_policy.first_threads_first(serial, workers_needed=needed, processes=processes,
                                              max_threads=max_threads, usable_cpus=usable) == expected


@pytest.mark.parametrize("tried, processes, max_threads, consumer, expected", [
    # issue 23's row, measured: 2 x 32 (threads at the batch's size) -> more processes; 4 x 32 gained 14 % but the
    # bound is reached -> its control (4 x 1); 2 x 64 would exceed the batch, and fewer threads are never tried: done
    ([tt(2, 32, 10801, util=0.36)], (1, 4), 32, None, (4, 32)),
    ([tt(2, 32, 10801, util=0.36), tt(4, 32, 12334, util=0.2)], (1, 4), 32, None, (4, 1)),
    ([tt(2, 32, 10801, util=0.36), tt(4, 32, 12334, util=0.2), tt(4, 1, 744, util=0.02)], (1, 4), 32, None, None),
    # ... at batch 128 the same samples in flight fit in fewer processes: 2 x 64, then its control
    ([tt(2, 32, 10801, util=0.36), tt(4, 32, 12334, util=0.2), tt(4, 1, 744, util=0.02)], (1, 4), 64, None,
     (2, 64)),
    ([tt(4, 32, 12334, util=0.2), tt(4, 1, 744, util=0.02), tt(2, 64, 12200, util=0.4)], (1, 4), 64, None,
     (2, 1)),
    # short with an idle CPU and threads below the batch: more threads
    ([tt(2, 8, 4000, util=0.2)], (1, 4), 32, None, (2, 16)),
    # short with a saturated process (collate, hand-over, GIL): more processes at the same threads
    ([tt(2, 8, 4000, util=0.9)], (1, 4), 32, None, (4, 8)),
    ([tt(2, 8, 4000, util=0.9), tt(4, 8, 4100, util=0.9)], (1, 4), 32, None, (2, 1)),   # no gain: control of 2 x 8
    # the climb stops when more in flight gains no more than half the tolerance: the fewest within it is checked
    ([tt(2, 16, 8000, util=0.3), tt(4, 16, 8150, util=0.2)], (1, 4), 16, None, (2, 1)),
    # the consumer is fed: no climb, the control next
    ([tt(1, 4, 800, util=0.1)], (1, 4), 32, 780.0, (1, 1)),
    # the control keeps up: threads do not pay (the caller falls back to the process-only search)
    ([tt(2, 32, 1000, util=0.1), tt(4, 32, 1000, util=0.1), tt(2, 1, 990, util=0.5)], (1, 4), 32, None, None),
    # a thread candidate failed (not thread-safe): done, the caller falls back
    ([tt(2, 32, None, status="failed")], (1, 4), 32, None, None),
    # more threads stopped gaining and no process is saturated (a shared machine: issue 23's 1 ms / 1 KB row):
    # more processes at the best's threads, once
    ([tt(2, 25, 18293, util=0.5), tt(2, 50, 19574, util=0.6), tt(2, 64, 19059, util=0.6)], (1, 4), 64, None,
     (4, 50)),
    ([tt(2, 25, 18293, util=0.5), tt(2, 50, 19574, util=0.6), tt(2, 64, 19059, util=0.6), tt(4, 50, 19600, util=0.4)],
     (1, 4), 64, None, (2, 1)),
    # online, from the configuration in force (2 x 16): climb from there
    ([tt(2, 16, 5000, util=0.2)], (1, 4), 32, None, (2, 32)),
])
def test_next_threads_first(tried, processes, max_threads, consumer, expected):
    assert threads_policy.next_threads_first(tried, processes=processes, max_threads=max_threads, tolerance=0.05,
                                             consumer_samples_per_s=consumer) == expected


def test_threads_first_ends_within_its_trials_on_any_table():
    """Whatever the rates and CPU shares, proposals never repeat a candidate, stay in bounds, and end."""
    for seed, hi, cap in itertools.product(range(40), [1, 4, 8], [2, 16, 32]):
        first = threads_policy.first_threads_first(SERIAL_WAITS, workers_needed=100.0, processes=(1, hi),
                                                   max_threads=cap, usable_cpus=2)
        tried, proposal = [], first
        for _ in range(30):
            if proposal is None:
                break
            p, t = proposal
            assert 1 <= p <= hi and 1 <= t <= cap and proposal not in [(x.config.num_workers, x.config.threads)
                                                                       for x in tried]
            rate = 100.0 * (1 + (hash((seed, p, t)) % 17) / 8) * (p * t) ** 0.5
            tried.append(tt(p, t, rate, util=((seed * 7 + t) % 10) / 10))
            proposal = threads_policy.next_threads_first(tried, processes=(1, hi), max_threads=cap, tolerance=0.05,
                                                         consumer_samples_per_s=None)
        assert proposal is None, tried


@pytest.mark.parametrize("chosen, cap, expected", [
    (tt(2, 32, 12000), 64, 64),      # the same samples in flight in single-threaded workers
    (tt(4, 32, 12000), 64, 64),      # ... at most the cap
    (tt(1, 4, 900), 64, 4),
    (tt(2, 32, 12000), 2, None),     # no more processes than the choice: nothing to compare
])
def test_process_reference(chosen, cap, expected):
    assert threads_policy.process_reference(chosen, cap=cap) == expected


def test_fewest_near_is_what_select_chooses_among():
    trials = [tt(4, 32, 12334), tt(4, 1, 744), tt(2, 32, 11800), tt(2, 32, 11790, prefetch=4), tt(8, 1, None,
                                                                                                  status="failed")]
    assert threads_policy.fewest_near(trials, tolerance=0.05) == trials[2:4]
    assert policy.select(trials) is trials[2]
    assert threads_policy.fewest_near([tt(2, 1, None, status="failed")], tolerance=0.05) == []


def test_max_threads_per_process_is_a_batch_measured():
    measured = TrialResult(config=LoaderConfig(4, 2), samples_per_s=1000.0, batches=50, window_s=1.6)  # 32 a batch
    assert threads_policy.max_threads_per_process(measured, batch_size=1) == 32  # a batch_sampler decided the batches
    assert threads_policy.max_threads_per_process(tt(4, 1, 1000.0), batch_size=16) == 16
    assert threads_policy.max_threads_per_process(tt(4, 1, 1000.0), batch_size=512) == threads_policy.MAX_THREADS


def test_disk_ceiling():
    # 500 MB/s and 100 KB read per sample: 5,000 samples/s
    assert policy.disk_ceiling(read_bytes_per_sample=100e3, seq_read_mb_s=500.0) == pytest.approx(5000.0)
    assert policy.disk_ceiling(read_bytes_per_sample=0.0, seq_read_mb_s=500.0) is None
    assert policy.disk_ceiling(read_bytes_per_sample=100e3, seq_read_mb_s=None) is None


def test_policy_holds_the_process_decisions_and_threads_policy_the_thread_ones():
    # thread_search reads threads_policy directly; policy only borrows least_memory for select
    thread_only = ("busy_fraction", "thread_processes", "first_thread_config", "next_thread_config",
                   "max_threads_per_process", "threads_to_cover_wait", "MAX_THREADS", "MAX_THREAD_TRIALS", "waits",
                   "threads_first_processes", "first_threads_first", "climb_threads", "next_threads_first",
                   "fewest_near", "process_reference", "THREADS_FIRST_TRIALS")
    assert all(callable(getattr(threads_policy, n)) or isinstance(getattr(threads_policy, n), int)
               for n in thread_only)
    assert not set(thread_only) & set(policy.__all__)
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


def test_a_cpu_bound_climb_stops_at_the_cpu_ceiling():
    """The serial trial says 2 CPUs load at most 6,400 samples/s: 2 workers at 6,200 reach it, so the search proposes
    no 4 (it would without the ceiling), only the descent to 1."""
    rates = {0: 3200.0, 2: 6200.0}
    ceiling = policy.rate_ceiling(_serial(0.010, 0.010), batch_size=32, usable_cpus=2, consumer_samples_per_s=None)
    assert policy.next_worker_count(rates, cap=64) == 4
    assert policy.next_worker_count(rates, cap=policy.climb_cap(rates, cap=64, ceiling_samples_per_s=ceiling)) == 1
