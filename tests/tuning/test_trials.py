"""tune() end to end on small workloads: the regimes' choices (generous margins), budget, knobs, RNG, cleanup."""
import os
import random
import signal
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from autoloader import make_loader, tune
from autoloader.config import LoaderConfig
from autoloader.consumer import Consumer
from autoloader.measure.trial import run_trial
from autoloader.request import Request
from autoloader.results import TuneResult
from autoloader.search.candidates import fallback_result
from autoloader.tuning.trials import tune_with
from workloads import InMemory, LatencyBound


class Boom(Exception):
    pass


class RaisesAt(Dataset):
    def __init__(self, bad_index=3):
        self.bad_index = bad_index

    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == self.bad_index:
            raise Boom(f"sample {i} is corrupt")
        return torch.zeros(2)


def test_in_memory_data_chooses_zero_workers():
    result = tune(InMemory(), 64, budget=6)
    assert result.num_workers == 0
    assert result.prefetch_factor is None and result.persistent_workers is False
    assert result.source == "tuned"
    assert result.bottleneck == "ipc"
    assert any(t.config.num_workers > 0 and t.ok for t in result.trials), "workers must have been measured"
    zero = next(t for t in result.trials if t.config.num_workers == 0)
    assert zero.samples_per_s == result.samples_per_s


@pytest.mark.slow
def test_latency_bound_data_chooses_many_waiting_workers():
    """80 ms of waiting per batch and per worker: many workers pay, whatever the core count (how many more than the
    cores is machine-dependent: the benchmark table shows it)."""
    data = LatencyBound(latency_s=0.005)
    result = tune(data, 16, budget=12)
    one = run_trial(Request.checked(data, 16), LoaderConfig(1, 2), consumer=Consumer(None, torch.device("cpu")),
                    limit_s=3)
    assert result.num_workers >= 4 and result.samples_per_s > 3 * one.samples_per_s, (result.config, one)
    zero = next(t for t in result.trials if t.config.num_workers == 0)
    assert result.samples_per_s > 3 * zero.samples_per_s
    assert result.persistent_workers is True
    assert len(result.trials) <= 10, "model-guided: a handful of trials, not a sweep"


def test_slow_consumer_gets_the_fewest_workers_that_keep_up():
    # a worker makes a 16-sample batch in ~32 ms; the consumer eats one per 40 ms: 1-2 workers keep up
    result = tune(LatencyBound(latency_s=0.002), 16, step=0.04, budget=10)
    assert 1 <= result.num_workers <= 3
    assert result.bottleneck == "consumer"
    assert result.consumer_samples_per_s == pytest.approx(16 / 0.04, rel=0.3)


def test_dataset_error_surfaces_unchanged_and_leaves_no_process():
    with pytest.raises(Boom, match="sample 3 is corrupt"):
        tune(RaisesAt(), 4, budget=5)


def test_budget_is_respected_on_a_slow_dataset():
    started = time.monotonic()
    result = tune(LatencyBound(latency_s=0.05), 8, budget=3)
    spent = time.monotonic() - started
    # within one trial's limit (1.5 s at this budget) plus start-up/teardown slack
    assert spent < 3 + 1.5 + 4, spent
    assert result.seconds <= spent
    assert result.trials


def test_fixed_knobs_are_not_tuned():
    result = tune(LatencyBound(latency_s=0.001), 8, budget=4, num_workers=1, persistent_workers=False)
    assert {t.config.num_workers for t in result.trials} == {1}
    assert result.num_workers == 1 and result.persistent_workers is False


def test_max_workers_zero_runs_only_the_serial_trial():
    result = tune(LatencyBound(latency_s=0.001), 8, budget=4, max_workers=0)
    assert [t.config.num_workers for t in result.trials] == [0]


def test_max_workers_bounds_every_trial():
    result = tune(LatencyBound(latency_s=0.004), 8, budget=8, max_workers=3)
    assert max(t.config.num_workers for t in result.trials) <= 3


def test_tuning_leaves_the_global_rngs_as_they_were():
    data = InMemory(n=512)
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    tune(data, 32, shuffle=True, budget=3, max_workers=1)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_user_generator_is_not_advanced():
    generator = torch.Generator().manual_seed(7)
    state = generator.get_state().clone()
    tune(InMemory(n=512), 32, shuffle=True, budget=3, max_workers=1, generator=generator)
    assert torch.equal(generator.get_state(), state)


def test_progress_is_reported_per_trial():
    seen = []
    request = Request.checked(InMemory(n=2048), 64, device="cpu", budget=4, max_workers=1)
    result = tune_with(request, progress=lambda trial, elapsed, budget: seen.append((trial.config.num_workers, budget)))
    assert [n for n, _ in seen] == [t.config.num_workers for t in result.trials]
    assert all(b == 4 for _, b in seen)


@pytest.mark.parametrize("budget, error", [(0, ValueError), (-1, ValueError), ("10", TypeError), (True, TypeError)])
def test_bad_budget_raises_as_make_loader_does(budget, error):
    with pytest.raises(error, match="budget") as raised:
        tune(InMemory(n=8), 4, budget=budget)
    with pytest.raises(error, match="budget") as through_make_loader:
        make_loader(InMemory(n=8), 4, budget=budget, cache=False)
    assert str(raised.value) == str(through_make_loader.value)


def test_result_round_trips_through_json_and_prints():
    result = tune(InMemory(n=2048), 64, budget=3, max_workers=1)
    again = TuneResult.from_dict(result.to_dict())
    assert again == result
    text = str(result)
    assert "workers" in text and "samples/s" in text


def test_fallback_result_keeps_the_users_knobs():
    result = fallback_result({"num_workers": 3}, device=torch.device("cpu"), reason="x")
    assert (result.num_workers, result.prefetch_factor, result.source) == (3, 2, "fallback")
    result = fallback_result({}, device=torch.device("cpu"), reason="x")
    assert (result.num_workers, result.prefetch_factor, result.pin_memory) == (0, None, False)


def test_a_ctrl_c_python_drops_between_two_trials_still_stops_tuning(monkeypatch):
    """Outside a trial's guard, a Ctrl-C landing in a finaliser (the collector freeing the last trial's queues) is
    printed as "Exception ignored" and lost, and tuning went on: the search runs under one guard, which keeps it."""
    import autoloader.tuning.trials as trials_module
    from autoloader.results import TrialResult

    calls = []

    class Finalised:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs in this frame, where Python drops what it raises

    def trial(request, config, **kwargs):
        calls.append(config.num_workers)
        if len(calls) == 2:
            Finalised()
        return TrialResult(config, samples_per_s=100.0 + len(calls), batches=20)

    monkeypatch.setattr(trials_module, "run_trial", trial)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            tune(InMemory(n=64), batch_size=4, budget=5, max_workers=4)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(calls) == 2, f"tuning went on after the Ctrl-C: {len(calls)} trials"
