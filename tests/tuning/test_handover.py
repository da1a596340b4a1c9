"""A stage of an online epoch and its hand-over (autoloader/tuning/handover.py): the tail a measured candidate loads
past its window, a stage's report with its workers' pools, and an aborted stage giving its batches back."""
import json

import pytest

from autoloader.config import LoaderConfig
from autoloader.loader.native import NativeLimit
from autoloader.probe._pools import NativePool
from autoloader.results import TrialResult
from autoloader.tuning.handover import SERIAL_TAIL, Stage, tail_extra


@pytest.mark.parametrize("config, extra", [
    (LoaderConfig(0), SERIAL_TAIL), (LoaderConfig(1, 2), 0), (LoaderConfig(8, 4), 0)])
def test_a_serial_candidate_loads_a_short_tail_a_worker_one_serves_what_it_holds(config, extra):
    assert tail_extra(config) == extra


class _Run:
    def __init__(self, config):
        self.config, self.stopped = config, []

    def stop(self, error):
        self.stopped.append(error)


class _Slice:
    def __init__(self):
        self.delivered_counts = []

    def delivered(self, count):
        self.delivered_counts.append(count)


def test_an_aborted_stage_stops_its_run_and_gives_every_batch_back():
    run, batch_slice = _Run(LoaderConfig(2, 2)), _Slice()
    stage = Stage(batch_slice, run, None)
    error = KeyboardInterrupt()
    stage.abort(error)
    assert run.stopped == [error] and batch_slice.delivered_counts == [0]
    assert stage.config == LoaderConfig(2, 2), "a stage's configuration is its run's"


def test_a_report_carries_the_pools_its_first_worker_found(tmp_path):
    """The stage's DataLoader's ``worker_init_fn`` (a ``NativeLimit``) had its workers append what they found to a
    file; the measurement the search is told carries worker 0's pools."""
    report = tmp_path / "pools.jsonl"
    pools = [NativePool("libgomp", "openmp", "openmp", 8, 1), NativePool("libscipy_openblas", "blas", "openblas", 8, 1)]
    lines = [{"worker": 1, "threads": 1, "pools": [pools[0].to_dict()]},
             {"worker": 0, "threads": 1, "pools": [p.to_dict() for p in pools]}]
    report.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"worker": 2, "po')  # one mid-write
    stage = Stage(_Slice(), _Run(LoaderConfig(2, 2)), None, pools=NativeLimit(1, report=str(report)))
    result = TrialResult(config=LoaderConfig(2, 2), samples_per_s=100.0)
    with_pools = stage.with_pools(result)
    assert with_pools.native_pools == tuple(pools), "worker 0's, the lowest id"
    assert with_pools.samples_per_s == 100.0 and with_pools.config == result.config
    assert Stage(_Slice(), _Run(LoaderConfig(0)), None).with_pools(result).native_pools is None, "no report: unknown"
