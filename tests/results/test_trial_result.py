"""One candidate's record (autoloader.results.trial_result): its JSON round trip, what it refuses, and its row in a
tuning's table."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from autoloader.config import LoaderConfig
from autoloader.probe._pools import NativePool
from autoloader.results.trial_result import TrialResult, trial_row
from helpers import trial

POOL = NativePool("libgomp", "openmp", "openmp", found=8, limited_to=2)


def test_a_trial_round_trips_through_json_with_its_pools():
    measured = replace(trial(2, 900.0, worker_uss_total_bytes=3 << 20), native_pools=(POOL,),
                       config=LoaderConfig(2, 2, False, False, native_threads=2))
    again = TrialResult.from_dict(json.loads(json.dumps(measured.to_dict())))
    assert again == measured and again.native_pools == (POOL,) and again.native_limit_held is True


@pytest.mark.parametrize("change, says", [({"colour": 1}, "unknown TrialResult fields"),
                                          ({"status": "lost"}, "bad trial status"),
                                          ({"native_pools": 3}, "native_pools must be a list")])
def test_from_dict_refuses_what_to_dict_never_writes(change, says):
    with pytest.raises(ValueError, match=says):
        TrialResult.from_dict({**trial(2, 900.0).to_dict(), **change})


def test_ok_needs_a_measured_rate_and_workers_own_memory():
    assert trial(2, 900.0).ok and not trial(2, None, status="skipped").ok
    assert trial(0, 500.0).worker_memory_bytes == 0  # no worker processes: nothing of their own
    assert trial(2, 900.0).worker_memory_bytes is None and trial(2, 9.0, worker_uss_total_bytes=5).worker_memory_bytes == 5


def _row(result: TrialResult, **flags) -> list:
    columns = dict(threads=False, native=True, memory=False, footprint=False)
    columns.update(flags)
    return trial_row(result, 1000.0, True, **columns)


def test_a_row_marks_the_choice_its_share_of_the_best_and_its_status():
    row = _row(trial(2, 900.0))
    assert row[0] == "*" and row[1] == "2" and "900" in row and "90%" in row and row[-1] == "ok"
    skipped = trial_row(trial(8, None, status="skipped", reason="memory"), 1000.0, False, threads=False,
                        native=False, memory=False, footprint=False)
    assert skipped[0] == "" and skipped[-1] == "skipped: memory" and skipped.count("-") >= 3


def test_the_native_cell_never_claims_a_limit_not_seen_held():
    held = replace(trial(2, 900.0), config=LoaderConfig(2, 2, False, False, native_threads=2), native_pools=(POOL,))
    unseen = replace(held, native_pools=None)  # threadpoolctl missing: the limit was not seen applied
    assert _row(held)[4] == "2" and _row(unseen)[4] == "2?"
    assert _row(trial(2, 900.0))[4] == "off" and _row(trial(0, 500.0, prefetch=None))[4] == "-"
