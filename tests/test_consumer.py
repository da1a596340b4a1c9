"""The step trials are timed against (autoloader.consumer): what a step may be, what each kind does to a batch, and
the step timed alone. CPU only here; the CUDA spin and pacing are checked on a GPU by scripts/gpu_check.py."""
from __future__ import annotations

import math
import time

import pytest
import torch

from autoloader.consumer import Consumer, check_step

CPU = torch.device("cpu")


@pytest.mark.parametrize("step", [None, 0, 0.05, 2, print])
def test_none_a_number_of_seconds_or_a_callable_is_a_step(step):
    check_step(step)


@pytest.mark.parametrize("step, error, says", [
    ("fast", TypeError, "step=0.05 to simulate"), (True, TypeError, "got bool"), ([1], TypeError, "got list"),
    (-0.1, ValueError, ">= 0"), (math.inf, ValueError, "finite"), (math.nan, ValueError, "finite")])
def test_anything_else_is_refused_with_the_fix(step, error, says):
    with pytest.raises(error, match=says):
        check_step(step)
    with pytest.raises(error):
        Consumer(step, CPU)


def test_a_callable_gets_each_batch_and_a_zero_step_does_nothing():
    seen = []
    Consumer(seen.append, CPU)("batch")
    assert seen == ["batch"]
    for idle in (None, 0, 0.0):
        consumer = Consumer(idle, CPU)
        assert consumer.is_noop and consumer.seconds_per_batch("batch") == 0.0
    assert not Consumer(seen.append, CPU).is_noop and not Consumer(0.01, CPU).is_noop


def test_a_simulated_step_sleeps_its_seconds_and_is_timed_alone():
    consumer = Consumer(0.02, CPU)
    start = time.perf_counter()
    consumer("batch")
    assert time.perf_counter() - start >= 0.02
    assert 0.02 <= consumer.seconds_per_batch("batch", seconds=0.05, max_calls=3) < 1.0  # generous: a loaded host


def test_timing_stops_at_max_calls_and_never_before_two():
    calls = []
    consumer = Consumer(calls.append, CPU)
    consumer.seconds_per_batch("b", seconds=0.0, max_calls=20)
    assert len(calls) == 1 + 2  # one warm-up call, then at least two timed ones
    calls.clear()
    consumer.seconds_per_batch("b", seconds=60.0, max_calls=5)
    assert len(calls) == 1 + 5


def test_pacing_and_synchronising_are_no_ops_on_the_cpu():
    consumer = Consumer(0, CPU)
    for _ in range(5):
        consumer.pace()
    consumer.synchronize()
    assert len(consumer._events) == 0
