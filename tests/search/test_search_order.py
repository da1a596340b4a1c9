"""The order in which ``Search`` asks for candidates with ``threads=True`` (issue 23), driven with fake measurements
from a model of the data: no trial runs, no clock matters (the budget is never reached)."""
import dataclasses
import math
from typing import Callable

import pytest

from autoloader.config import LoaderConfig
from autoloader.probe import probe_machine
from autoloader.request import Request
from autoloader.results import TrialResult
from autoloader.search import threads_policy
from autoloader.search.search import Search
from helpers import drive_search
from workloads import LatencyBound

BATCH = 32


def waiting(config: LoaderConfig) -> TrialResult:
    """4 ms of sleep per sample, no CPU: a batch in flight per thread, up to 12,000 samples/s (the hand-over)."""
    in_flight = max(1, config.num_workers) * config.threads
    rate = min(12000.0, in_flight * 250.0)
    return fake(config, rate, util=min(1.0, 0.01 * config.threads))


def gil_bound(config: LoaderConfig) -> TrialResult:
    """A Python loop per sample: threads add nothing, processes do up to 2 CPUs."""
    rate = 900.0 * min(2, max(1, config.num_workers))
    return fake(config, rate, util=0.97)


def threads_never_pay(config: LoaderConfig) -> TrialResult:
    """Waits (2 % CPU serial) but a process serves one sample at a time whatever its threads: a lock inside."""
    rate = min(12000.0, max(1, config.num_workers) * 250.0)
    return fake(config, rate, util=0.02)


def threads_cost_cpu(config: LoaderConfig) -> TrialResult:
    """1 ms waits: each thread's hand-off costs CPU a waiting process does not; 2 processes of threads reach 19,000
    samples/s, 64 processes 36,000 (issue 23's benchmark, 1 KB samples at batch 128 on 2 cores)."""
    if config.threads > 1:
        return fake(config, min(19000.0, 9500.0 * config.num_workers, 1000.0 * config.threads * config.num_workers),
                    util=0.6)
    return fake(config, min(36000.0, 900.0 * max(1, config.num_workers)), util=0.05)


def fake(config: LoaderConfig, rate: float, *, util: float) -> TrialResult:
    batches = 40
    serial = config.num_workers == 0
    fetch_s = BATCH / rate
    return TrialResult(config=config, samples_per_s=rate, batches=batches, window_s=batches * BATCH / rate,
                       consumer_s_per_batch=1e-5, fetch_s_per_batch=fetch_s if serial else None,
                       fetch_cpu_s_per_batch=fetch_s * util if serial else None,
                       worker_cpu_util=None if serial else util)


def drive(model: Callable[[LoaderConfig], TrialResult], *, budget: float = 30.0, start=None, threads=True):
    request = Request.checked(LatencyBound(latency_s=0.004), BATCH, device="cpu", max_workers=64, threads=threads)
    profile = probe_machine(disk=False, gpus=False)
    # no memory budget: the guard would otherwise size a worker by this process's RSS (large late in a test run)
    profile = dataclasses.replace(profile, memory=dataclasses.replace(profile.memory, budget_bytes=None))
    search = Search(request, profile, budget=budget, start=start)
    return drive_search(search, model)


def pairs(configs):
    return [(c.num_workers, c.threads) for c in configs]


def test_waiting_data_gets_threads_first_and_no_process_climb():
    asked, result = drive(waiting)
    assert pairs(asked)[0] == (0, 1)
    process_only = [(n, t) for n, t in pairs(asked)[1:] if t == 1 and n > 4]
    assert process_only == [(64, 1)], f"no process-only climb, one reference: {pairs(asked)}"
    assert result.threads > 1 and result.num_workers <= 4, result
    control = [c for c in asked if c.threads == 1 and c.num_workers == result.num_workers]
    assert control, "the choice was checked against its control"
    assert len(asked) <= 1 + threads_policy.THREADS_FIRST_TRIALS


def test_threads_that_do_not_pay_fall_back_to_the_process_climb():
    asked, result = drive(threads_never_pay)
    threaded = [i for i, c in enumerate(asked) if c.threads > 1]
    assert threaded and threaded[0] == 1, "threads first"
    assert max(c.num_workers for c in asked if c.threads == 1) >= 32, f"then the process climb: {pairs(asked)}"
    assert result.threads == 1 and result.num_workers >= 32, result


def test_processes_faster_than_threads_at_the_same_samples_in_flight_fall_back_to_the_process_climb():
    asked, result = drive(threads_cost_cpu)
    assert pairs(asked)[1][1] > 1, "threads first"
    assert result.threads == 1 and result.num_workers >= 32, (pairs(asked), result)


def test_gil_bound_data_never_tries_threads_first():
    asked, result = drive(gil_bound)
    assert asked[1].threads == 1, "the serial trial keeps a CPU busy: processes first"
    assert result.threads == 1, result


def test_online_from_a_configuration_with_threads_climbs_from_it():
    asked, result = drive(waiting, budget=math.inf, start=LoaderConfig(2, 2, threads=16))
    assert pairs(asked)[:2] == [(2, 16), (2, 32)], pairs(asked)
    assert result.threads > 1, result


@pytest.mark.parametrize("model", [waiting, threads_never_pay, threads_cost_cpu, gil_bound])
def test_every_candidate_is_asked_once_within_the_bound(model):
    asked, _ = drive(model)
    trials = [c for c in asked if c.prefetch_factor in (None, 2)]
    assert all(c.num_workers <= 64 for c in asked)
    assert len(asked) <= 16, pairs(asked)
    assert len(set(trials)) >= len(trials) - 1, f"at most the control repeats: {pairs(asked)}"


def test_no_candidate_climbs_past_one_that_keeps_up_with_the_step():
    """A step of 8 ms a batch (4,000 samples/s): once a candidate keeps up with it, no larger one is started (the
    climb would double to it), only fewer; 16 waiting workers are the fewest that keep up (issue 22)."""
    def step_bound(config: LoaderConfig) -> TrialResult:
        trial = fake(config, min(4000.0, max(1, config.num_workers) * 250.0), util=0.01)
        return dataclasses.replace(trial, consumer_s_per_batch=BATCH / 4000.0)

    asked, result = drive(step_bound, threads=False)
    counts = [c.num_workers for c in asked]
    first_up = next(i for i, n in enumerate(counts) if n and min(4000.0, n * 250.0) >= 0.95 * 4000.0)
    assert all(n < counts[first_up] for n in counts[first_up + 1:]), f"then only fewer: {counts}"
    assert result.num_workers == 16, counts


def handover_bound(config: LoaderConfig) -> TrialResult:
    """In-memory samples: the main process receiving batches is the limit, so workers are slower than none and idle
    (7 % CPU each), whatever their number (gpu_check's dict_batches_input_key on an H200: 16 workers at 9,037
    samples/s against 11,922 serial, then a 128-worker trial that could not start within its limit)."""
    return fake(config, 11922.0 if config.num_workers == 0 else 9037.0, util=0.07)


def test_workers_slower_than_none_are_not_extrapolated():
    asked, result = drive(handover_bound, threads=False)
    counts = [c.num_workers for c in asked]
    first = counts[1]
    assert max(counts) == first, f"no larger count after workers lost to none: {counts}"
    assert result.num_workers == 0, result


def spinning_serial(config: LoaderConfig) -> TrialResult:
    """Drawn seeds 17 and 22: samples that wait on storage; the serial trial's loading read 1.3x its wall time as CPU
    (torch's native pool in this process spins after each parallel region), its workers 16 % of a CPU each (limited to
    one native thread: no spinning). The rate rises with the workers up to 4,000 samples/s."""
    n = config.num_workers
    trial = fake(config, 376.0 if n == 0 else min(4000.0, 340.0 * n), util=0.16)
    if n == 0:
        return dataclasses.replace(trial, fetch_cpu_s_per_batch=1.3 * trial.fetch_s_per_batch)
    return dataclasses.replace(trial, main_cpu_util=0.1)


def test_a_measured_pools_cpu_not_the_serial_model_bounds_the_climb():
    """The serial trial's CPU made 2 workers look like the ceiling of 2 CPUs (the climb stopped at them, 0.19x the best
    count); the 2 workers measured their CPU: 0.42 of 2 CPUs busy, room for about 4x their rate."""
    request = Request.checked(LatencyBound(latency_s=0.004), BATCH, device="cpu", max_workers=64, threads=False)
    profile = probe_machine(disk=False, gpus=False)
    profile = dataclasses.replace(profile, memory=dataclasses.replace(profile.memory, budget_bytes=None),
                                  cpu=dataclasses.replace(profile.cpu, usable=2))
    asked, result = drive_search(Search(request, profile, budget=30.0), spinning_serial)
    counts = [c.num_workers for c in asked]
    assert counts[:2] == [0, 2], counts
    assert result.num_workers >= 8, (counts, result.num_workers)
