"""The re-tune rules (``search.retune``), as tables: when an epoch served by a decision starts a new search, and which
worker counts a search that only goes down proposes."""
from __future__ import annotations

import pytest

from autoloader.search.policy import next_count_down
from autoloader.search.retune import IDLE_STALL, retune


@pytest.mark.parametrize("decided_rate, reference_rate, decided_stall, workers, rate, stall, tried, expected", [
    (1000.0, None, 0.0, 8, 1000.0, 0.08, False, None),             # nothing moved, the loop waited a little
    (1000.0, None, 0.0, 8, 1100.0, 0.08, False, None),             # +10 %: within RETUNE_RATE_CHANGE
    (1000.0, None, 0.0, 8, 1200.0, 0.08, False, ("+20%", True)),   # the data got cheaper (warm cache): down only
    (1000.0, 900.0, 0.0, 8, 1200.0, 0.08, False, ("+33%", True)),  # against the smaller of the two
    (1000.0, None, 0.0, 8, 700.0, 0.08, False, None),              # slower, the loop hardly waited: the step slowed
    (1000.0, None, 0.25, 8, 700.0, 0.30, False, None),             # slower than a window only: no search (noise)
    (1000.0, 1000.0, 0.25, 8, 700.0, 0.30, False, ("-30%", False)),  # slower than a whole epoch, waiting: either way
    (1000.0, None, 0.0, 8, 700.0, 0.30, False, ("waited for data 30%", False)),
    (1000.0, None, 0.02, 8, 950.0, 0.25, False, ("waited for data 25%", False)),  # loading became the bottleneck
    (1000.0, None, 0.20, 8, 950.0, 0.25, False, None),             # it already was when the decision was measured
    (1000.0, None, 0.83, 8, 1000.0, 0.96, False, None),            # loading-bound already, the same rate
    (1000.0, None, 0.39, 8, 1000.0, 0.51, False, None),
    (1000.0, None, 0.0, 8, 1000.0, 0.0, False, ("8 workers: trying fewer", True)),  # never waited: fewer may do
    (1000.0, None, 0.0, 8, 1000.0, IDLE_STALL, False, ("trying fewer", True)),
    (1000.0, None, 0.0, 8, 1000.0, 0.0, True, None),               # a search already went down from this decision
    (1000.0, None, 0.0, 1, 1000.0, 0.0, False, None),              # one worker: 0 is for the first search to find
    (1000.0, None, 0.0, 8, 1300.0, 0.0, True, ("+30%", True)),     # cheaper again: down, even after a search down
    (1000.0, None, 0.0, 0, 1300.0, 0.0, False, None),              # cheaper with no workers: nothing below to try
    (None, None, None, 8, 1000.0, 0.0, False, ("trying fewer", True)),  # a cached placeholder's first epoch
    (None, None, None, 8, 1000.0, 0.5, False, None),
    (1000.0, None, 0.0, 8, None, None, False, None),               # the epoch was too short to measure
])
def test_retune(decided_rate, reference_rate, decided_stall, workers, rate, stall, tried, expected):
    again = retune(decided_samples_per_s=decided_rate, reference_samples_per_s=reference_rate,
                   decided_stall=decided_stall, num_workers=workers,
                   epoch_samples_per_s=rate, epoch_stall=stall, tried_fewer=tried)
    if expected is None:
        assert again is None
    else:
        assert again is not None and expected[0] in again.why and again.down is expected[1], again


@pytest.mark.parametrize("rates, expected", [
    ({}, None),
    ({8: 100.0}, 4),                             # only the configuration in force: halve, never climb to 16
    ({8: 100.0, 4: 99.0}, 2),                    # 4 keeps up: halve again
    ({8: 100.0, 4: 99.0, 2: 60.0}, 3),           # 2 does not: bisect between 2 and 4
    ({8: 100.0, 4: 99.0, 2: 60.0, 3: 90.0}, None),   # 4 is the fewest that keep up
    ({8: 100.0, 4: 70.0}, 6),                    # 4 is too few: between 4 and 8
    ({8: 100.0, 4: 70.0, 6: 99.0}, None),        # 6..8 within a factor 1.5: done
    ({2: 100.0, 1: 100.0}, 0),                   # the main process alone may do
    ({2: 100.0, 1: 100.0, 0: 100.0}, None),
    ({8: 100.0, 4: None}, 6),                    # 4 failed (killed, out of memory): between 4 and 8
])
def test_next_count_down(rates, expected):
    assert next_count_down(rates, cap=64) == expected


def test_next_count_down_never_proposes_more_than_measured():
    rates = {4: 100.0}
    seen = []
    while True:
        proposal = next_count_down(rates, cap=64)
        if proposal is None:
            break
        assert proposal < 4
        seen.append(proposal)
        rates[proposal] = 100.0
    assert seen == [2, 1, 0]


@pytest.mark.parametrize("workers, stall, tried, expected", [
    (51, 0.21, False, ("measured in different epochs", True)),  # cold candidates, warm ones: fewer, in one regime
    (51, 0.21, True, None),                                    # a search already went down from this decision
    (1, 0.21, False, None),                                    # one worker: nothing but 0 below
    (8, 0.02, False, ("8 workers: trying fewer", True)),       # the idle rule says it first
])
def test_a_decision_whose_search_spanned_epochs_tries_fewer_once(workers, stall, tried, expected):
    """The online benchmark's simulated cold files: 8, 20, 40 workers measured in the cold epoch, 64 and 51 in the warm
    one; 51 chosen (stall 21 %) ran the warm epochs at 0.72-0.84 of 1 worker's speed, and no other rule fired."""
    again = retune(decided_samples_per_s=5643.0, reference_samples_per_s=None, decided_stall=0.21, num_workers=workers, epoch_samples_per_s=4857.0,
                   epoch_stall=stall, tried_fewer=tried, spanned=True)
    if expected is None:
        assert again is None
    else:
        assert again is not None and expected[0] in again.why and again.down is expected[1], again
    assert retune(decided_samples_per_s=5643.0, reference_samples_per_s=None, decided_stall=0.21, num_workers=51, epoch_samples_per_s=4857.0,
                  epoch_stall=0.21, tried_fewer=False) is None, "the same epoch without spanning: kept"
