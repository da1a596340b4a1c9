"""The decisions about threads inside each loading process (search/threads_policy.py, NOTE [ Processes x threads ])
on tables of fake trials: how busy a process is, how many threads cover its wait, whether serial loading waits, the
first (processes, threads) candidate and the next, after the process-only search and threads first. No process, no
clock."""
import dataclasses
import itertools

import pytest

from autoloader.search import policy, threads_policy
from autoloader.search.threads_policy import threads_to_cover_wait
from search_fakes import tt


@pytest.mark.parametrize("cpu_util, cap, expected", [
    (1.0, 8, 1), (1.7, 8, 1), (0.5, 8, 2), (0.34, 16, 3), (1 / 3, 16, 3), (0.3, 8, 4), (0.25, 8, 4), (0.2, 16, 5),
    (0.1, 16, 10), (0.05, 8, 8), (0.05, 64, 20), (0.001, 64, 64), (0.0, 8, 8), (0.5, 1, 1),
])
def test_threads_to_cover_wait(cpu_util, cap, expected):
    assert threads_to_cover_wait(cpu_util, cap=cap) == expected


@pytest.mark.parametrize("cpu_util, cap", [(float("nan"), 8), (float("inf"), 8), (-0.1, 8), (0.5, 0), (0.5, True)])
def test_threads_to_cover_wait_refuses(cpu_util, cap):
    with pytest.raises(ValueError, match="must be"):
        threads_to_cover_wait(cpu_util, cap=cap)


@pytest.mark.parametrize("trial_, expected", [
    (tt(4, 1, 100, util=0.25), 0.25),
    (tt(0, 1, 100, fetch=0.1, cpu=0.02), pytest.approx(0.2)),
    (tt(0, 1, 100, fetch=0.1, cpu=0.3), 1.0),     # several threads of the main process: capped at one CPU
    (dataclasses.replace(tt(0, 1, 100, fetch=0.1, cpu=0.02), fetch_delay_s_per_batch=0.06), pytest.approx(0.5)),
    (dataclasses.replace(tt(0, 1, 100, fetch=0.1, cpu=0.05), fetch_delay_s_per_batch=0.05), 1.0),  # CPU-bound, busy box
    (dataclasses.replace(tt(0, 1, 100, fetch=0.1, cpu=0.05), fetch_delay_s_per_batch=0.09), 1.0),  # clocks disagree
    (tt(4, 1, 100), None),
    (tt(4, 1, None, status="failed", util=0.1), None),
])
def test_busy_fraction(trial_, expected):
    assert threads_policy.busy_fraction(trial_) == expected


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


def test_fewest_near_is_what_select_chooses_among():
    trials = [tt(4, 32, 12334), tt(4, 1, 744), tt(2, 32, 11800), tt(2, 32, 11790, prefetch=4), tt(8, 1, None,
                                                                                                  status="failed")]
    assert threads_policy.fewest_near(trials, tolerance=0.05) == trials[2:4]
    assert policy.select(trials) is trials[2]
    assert threads_policy.fewest_near([tt(2, 1, None, status="failed")], tolerance=0.05) == []


@pytest.mark.parametrize("trial_, expected, why", [
    (tt(2, 4, 1234.5), 1234.5, "an ok trial: its rate"),
    (tt(0, 1, 0.0), 0.0, "a measured rate of zero is still a rate"),
])
def test_rate(trial_, expected, why):
    assert threads_policy.rate(trial_) == expected, why


@pytest.mark.parametrize("trial_", [tt(4, 1, None, status="failed"), tt(4, 1, None, status="skipped")])
def test_rate_refuses_a_trial_without_one(trial_):
    with pytest.raises(ValueError, match="measured no rate"):
        threads_policy.rate(trial_)


@pytest.mark.parametrize("tried, most, max_threads, consumer, expected, why", [
    ([tt(2, 8, 4000, util=0.2)], 4, 32, None, (2, 16), "the only candidate, idle CPU, threads below the batch: more"),
    ([tt(2, 8, 4000, util=0.9)], 4, 32, None, (4, 8), "a saturated process: more processes at the same threads"),
    ([tt(2, 32, 4000, util=0.2)], 4, 32, None, (4, 32), "threads at the batch's size: more processes"),
    ([tt(4, 32, 4000, util=0.2)], 4, 32, None, None, "threads at the batch's size and the processes' bound: done"),
    ([tt(2, 8, 4000, util=0.9)], 2, 32, None, None, "saturated at the processes' bound: nowhere to climb"),
    ([tt(2, 8, 4000, util=0.2)], 4, 32, 3900.0, None, "the consumer is fed: no climb"),
    ([tt(2, 8, 4000, util=0.2), tt(2, 1, 500)], 4, 32, None, None, "a control ran: the climb is over"),
    ([tt(2, 8, None, status="failed")], 4, 32, None, None, "a failed candidate: the caller falls back"),
    ([tt(2, 8, 4000, util=0.2), tt(2, 16, 4100, util=0.2)], 4, 32, None, (4, 16),
     "more threads gained under half the tolerance: more processes at the best's threads, once"),
    ([tt(2, 8, 4000, util=0.2), tt(2, 16, 4100, util=0.2), tt(4, 16, 4120, util=0.2)], 4, 32, None, None,
     "more processes were tried at no gain: the climb is over"),
    ([tt(2, 8, 4000, util=0.2), tt(2, 16, 6000, util=0.2)], 4, 32, None, (2, 32),
     "doubling the threads gained 50 %: double them again"),
])
def test_climb_threads(tried, most, max_threads, consumer, expected, why):
    assert threads_policy.climb_threads(tried, most_processes=most, max_threads=max_threads, tolerance=0.05,
                                        consumer_samples_per_s=consumer) == expected, why
