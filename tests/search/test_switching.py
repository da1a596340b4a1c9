"""Whether an online switch repays itself before the epoch ends, and how long a candidate's window may last
(search/switching.py, NOTE [ Online convergence ], 2. and 4., in search/online_policy.py), on tables. No clock."""
import math

import pytest

from autoloader.search import switching
from autoloader.search.capacity import DEFAULT_TOLERANCE, FORK_S


@pytest.mark.parametrize("remaining_s, gain, workers, window_s, expected", [
    (10.0, 0.5, 16, 0.3, True),     # 5 s gained against 0.32 s of forks
    (0.5, 0.5, 16, 0.3, False),     # 0.1 s gained against 0.32 s of forks: next epoch
    (20.0, 0.0, 4, 0.3, True),      # only saves workers: worth the tolerance of 20 s = 1 s
    (1.0, 0.0, 4, 0.3, False),
    (None, 0.0, 64, 4.0, True),     # an epoch of unknown length
])
def test_a_switch_repays_itself_before_the_epoch_ends(remaining_s, gain, workers, window_s, expected):
    assert switching.repays(remaining_s=remaining_s, gain=gain, workers=workers, window_s=window_s) is expected


@pytest.mark.parametrize("epoch_s, bound", [
    (None, switching.MAX_WINDOW_BOUND_S), (math.inf, switching.MAX_WINDOW_BOUND_S), (3.0, switching.MIN_WINDOW_BOUND_S),
    (60.0, 1.8), (600.0, switching.MAX_WINDOW_BOUND_S)])
def test_a_window_lasts_a_few_percent_of_the_epoch(epoch_s, bound):
    assert switching.window_bound_s(epoch_s) == pytest.approx(bound)


@pytest.mark.parametrize("remaining_s, gain, workers, window_s, expected, why", [
    (1.0, 0.5, 10, 0.0, True, "0.5 s gained, exactly 10 forks of 20 ms + no window: it repays, just"),
    (1.0, 0.5, 26, 0.0, False, "26 forks (0.52 s) cost more than the 0.5 s gained"),
    (0.2, 0.5, 0, 0.3, False, "a window longer than what is left gains nothing and risks the tolerance"),
    (0.0, 1.0, 0, 0.0, True, "an unmeasured candidate costing nothing at the epoch's end: nothing lost"),
    (10.0, -0.3, 4, 0.3, True, "a predicted loss is still worth the tolerance: fewer workers at the same rate"),
])
def test_what_a_switch_is_worth(remaining_s, gain, workers, window_s, expected, why):
    assert switching.repays(remaining_s=remaining_s, gain=gain, workers=workers, window_s=window_s) is expected, why


@pytest.mark.parametrize("gain, fork_s, tolerance, expected, why", [
    (0.15, FORK_S, DEFAULT_TOLERANCE, True, "0.18 s gained over 1.2 s against 8 forks of 20 ms and 5 % of the window"),
    (0.15, 0.05, DEFAULT_TOLERANCE, False, "a process holding gigabytes forks slowly: 0.4 s of forks"),
    (0.12, FORK_S, DEFAULT_TOLERANCE, False, "0.144 s gained: short of 0.175 s"),
    (0.0, FORK_S, 0.01, False, "only saving workers, worth 1 % of 1.2 s: not the forks"),
    (0.0, FORK_S, 0.5, True, "a wide tolerance values saving workers at half the time left"),
])
def test_forks_and_the_windows_risk_are_the_price(gain, fork_s, tolerance, expected, why):
    assert switching.repays(remaining_s=1.5, gain=gain, workers=8, window_s=0.3, tolerance=tolerance,
                            fork_s=fork_s) is expected, why


@pytest.mark.parametrize("epoch_s, bound, why", [
    (10.0, switching.MIN_WINDOW_BOUND_S * 1.2, "3 % of 10 s is 0.3 s, above the floor"),
    (8.0, switching.MIN_WINDOW_BOUND_S, "3 % of 8 s is 0.24 s: the floor"),
    (-math.inf, switching.MAX_WINDOW_BOUND_S, "a length that is no number: the upper bound"),
    (0.0, switching.MIN_WINDOW_BOUND_S, "an empty epoch: still a few batches"),
])
def test_a_windows_bound_at_its_edges(epoch_s, bound, why):
    assert switching.window_bound_s(epoch_s) == pytest.approx(bound), why


@pytest.mark.parametrize("workers, start_s, expected, why", [
    (0, 0.0, FORK_S, "nothing forked yet: the constant"),
    (16, 0.13, FORK_S, "8 ms a worker (2 cores): the constant stays the floor"),
    (16, 1.12, 0.07, "the H200's 16 workers: 70 ms each"),
    (2, 0.5, 0.25, "a slow start of a small pool counts too"),
])
def test_a_forks_cost_is_measured_never_below_the_constant(workers, start_s, expected, why):
    assert switching.fork_s(workers=workers, start_s=start_s) == pytest.approx(expected), why


@pytest.mark.parametrize("epoch_serial_s, cpus, cap, why", [
    (2.9, 2, 2, "960 samples of 3 ms (a 3 s epoch) on 2 CPUs: two spawned workers (30 took 32 s of the loop), not\n"
                "one, which makes what serial serving does"),
    (0.5, 2, 2, "a short epoch: still two"),
    (60.0, 2, 30, "a minute's epoch: 30 start in 15 s of CPU on 2 CPUs"),
    (60.0, 16, 240, "on 16 CPUs, eight times as many"),
    (None, 2, None, "an epoch of unknown length: no cap"),
])
def test_spawned_workers_start_in_a_quarter_of_a_serial_epoch(epoch_serial_s, cpus, cap, why):
    assert switching.spawn_cap(epoch_serial_s=epoch_serial_s, usable_cpus=cpus) == cap, why


def test_a_spawned_worker_is_priced_as_a_fresh_interpreter():
    assert switching.fork_s(workers=0, start_s=0.0, spawned=True, usable_cpus=2) == pytest.approx(0.5)
    assert switching.fork_s(workers=8, start_s=0.08, spawned=True, usable_cpus=2) == pytest.approx(0.5), \
        "iter() returns at once: its 10 ms each are not the start"
    assert switching.fork_s(workers=8, start_s=0.08) == pytest.approx(0.02)


@pytest.mark.parametrize("gain, best, now, expected, why", [
    (0.0, 16_836.0, 12_341.0, 0.364, "a count between a short one and the best, from the short one: what it lost"),
    (0.0, 16_836.0, 16_836.0, 0.0, "a count that only saves workers, from the best: nothing"),
    (0.25, 2_000.0, 2_000.0, 0.25, "a jump up from the best: its own gain"),
    (0.25, 2_000.0, 1_000.0, 1.5, "a jump up from a run at half the best"),
    (0.1, None, 1_000.0, 0.1, "no best known: the jump's own"),
    (0.1, 2_000.0, None, 0.1, "the run in force measured no rate: the jump's own"),
    (0.3, 1_000.0, 2_000.0, 0.3, "never below the jump's own gain"),
])
def test_a_switch_gains_over_the_run_in_force(gain, best, now, expected, why):
    assert switching.gain_over(gain=gain, best_samples_per_s=best, now_samples_per_s=now) == \
        pytest.approx(expected, abs=1e-3), why


@pytest.mark.parametrize("epoch_s, gain, workers, fork_s, expected, why", [
    (0.4, 0.06, 18, 0.036, False, "drawn seed 21: 6 % of a 0.4 s epoch against forking 18 workers: settle"),
    (0.08, 3.0, 4, 0.02, True, "a 5-batch epoch, workers four times faster: 0.24 s against 0.08 s: go on"),
    (10.0, 0.0, 16, 0.02, True, "a count that only saves workers is worth the tolerance: 0.5 s against 0.32 s"),
    (None, 0.0, 64, 1.0, True, "the epoch's length unknown: go on"),
])
def test_a_deferred_candidate_repays_its_start_over_the_next_epoch_or_the_search_settles(epoch_s, gain, workers,
                                                                                        fork_s, expected, why):
    assert switching.repays_next_epoch(epoch_s=epoch_s, gain=gain, workers=workers, fork_s=fork_s) is expected, why
