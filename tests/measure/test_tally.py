"""An epoch served by the decision, counted without a mark per batch (autoloader/measure/tally.py): its rate and
stall after the same start-up burst a window skips."""
import pytest
import torch

from autoloader.config import LoaderConfig
from autoloader.measure.tally import Tally


def _served(config, waits, *, step_s=0.01, start=0.0):
    tally, now = Tally(config, batch_size=4), start
    for wait in waits:
        now += wait
        tally.add(torch.zeros(4, 2), wait_s=wait, t_got=now)
        now += step_s
    return tally, now


def test_the_rate_and_stall_leave_out_the_start_up_burst():
    config = LoaderConfig(2, 2)
    assert config.burst_batches() == 6
    # a slow start-up burst (1 s), then 20 batches of 10 ms step + 5 ms wait
    tally, end = _served(config, [1.0] + [0.0] * 5 + [0.005] * 20)
    rate, stall = tally.rate_and_stall(end)
    opened = 1.0 + 5 * 0.01 + 0.01  # the 6th batch came at the end of the burst
    span = end - (opened - 0.01 + 0.0)
    assert rate == pytest.approx(20 * 4 / span, rel=1e-6)
    assert stall == pytest.approx(20 * 0.005 / span, rel=1e-6)
    assert rate > 200, "the 1 s burst is not counted"


def test_too_few_batches_after_the_burst_say_nothing():
    config = LoaderConfig(2, 2)
    tally, end = _served(config, [0.1] * (config.burst_batches() + 2))
    assert tally.rate_and_stall(end) == (None, None)
    tally, end = _served(LoaderConfig(0), [0.001] * 10)
    rate, stall = tally.rate_and_stall(end)
    assert rate is not None and stall is not None, "without workers only the first batch is the burst"
