"""What a trial reveals about the user's dataset (autoloader.measure.advice), decided from its measurements alone:
copy-on-read growth (NOTE [ Copy-on-read ]) told from noise, big batches and big workers; a stream every worker repeats
told from sharded or merely constant data (``RepeatCheck``); the fix named. The trials that feed them, and the warning
told once per dataset, are in test_failures.py."""
from __future__ import annotations

import pytest
import torch

from autoloader.config import LoaderConfig
from autoloader.measure.advice import RepeatCheck, copy_on_read_advice, repeated_stream_advice, same_batches
from autoloader.results import TrialResult

MiB = 2**20


@pytest.mark.parametrize("growth, uss, batch_bytes, workers, warns", [
    (100 * MiB, 120 * MiB, 4096, 2, True),          # copy-on-read: the worker is mostly growth
    (40 * MiB, 60 * MiB, None, 4, True),            # just over the floor, batch size unknown
    (10 * MiB, 30 * MiB, 4096, 2, False),           # noise
    (100 * MiB, 2048 * MiB, 4096, 2, False),        # churn in a worker that legitimately holds 2 GiB
    (100 * MiB, 200 * MiB, 32 * MiB, 2, False),     # two prefetched 32 MiB batches per worker explain it
    (None, 120 * MiB, 4096, 2, False),              # not measured
    (100 * MiB, 120 * MiB, 4096, 0, False),         # no workers
])
def test_copy_on_read_decision(growth, uss, batch_bytes, workers, warns):
    config = LoaderConfig(workers, 2 if workers else None)
    trial = TrialResult(config=config, samples_per_s=100.0, worker_uss_growth_bytes=growth, worker_uss_bytes=uss,
                        batch_bytes=batch_bytes, elapsed_s=2.0)
    advice = copy_on_read_advice(trial, dataset_name="Records")
    assert (advice is not None) == warns
    if warns:
        assert "Records" in advice and "numpy" in advice and f"{growth // MiB} MiB" in advice


def _check(batches, horizon=8):
    check = RepeatCheck(horizon)
    for batch in batches:
        check.see(batch)
    return check


def _t(*values):
    return torch.tensor(values)


def test_a_stream_every_worker_repeats_is_found_once_a_later_batch_differs():
    two_workers = [_t(0, 1), _t(0, 1), _t(2, 3), _t(2, 3)]  # round-robin: each worker's first, then each one's second
    check = _check(two_workers)
    assert check.repeated and not check.suspect and check.first is None


@pytest.mark.parametrize("batches", [
    [_t(0, 1), _t(2, 3), _t(4, 5), _t(6, 7)],  # sharded: worker 1's first batch differs from worker 0's
    [_t(7, 7)] * 6,                            # constant data: equal, but nothing ever differs
])
def test_sharded_or_constant_data_is_not_a_repeated_stream(batches):
    assert not _check(batches).repeated


def test_the_check_stops_at_its_horizon_and_keeps_no_batch():
    check = _check([_t(0), _t(0), _t(0), _t(1)], horizon=3)
    assert not check.repeated and check.seen == 3 and check.first is None


def test_the_first_batch_is_copied_not_held():
    first = _t(0, 1)
    check = RepeatCheck(4)
    check.see(first)
    first.add_(10)  # the loop may reuse its buffer
    check.see(_t(0, 1))
    assert check.suspect


def test_same_batches_compares_every_tensor_of_nested_batches():
    a = {"x": _t(1, 2), "y": [_t(3)]}
    assert same_batches(a, {"x": _t(1, 2), "y": [_t(3)]})
    assert not same_batches(a, {"x": _t(1, 2), "y": [_t(4)]})
    assert not same_batches(a, {"x": _t(1, 2)}), "a tensor more on one side"
    assert not same_batches(_t(1, 2), _t(1, 2).double()), "same values, another dtype"
    assert not same_batches(["a"], ["a"]), "no tensor: nothing to compare"


def test_the_repeated_stream_advice_names_the_dataset_the_cost_and_the_fix():
    class Shards(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(())

    text = repeated_stream_advice(Shards(), 4)
    assert "IterableDataset Shards" in text and "loaded 4 times per epoch" in text
    assert "get_worker_info()" in text and "Shards.__iter__" in text and "num_workers=0" in text
