"""Which candidates ``Search`` measures for the native thread pools' limit (search/native_search.py), driven with fake
measurements: no trial runs. The machine has 8 usable CPUs here, so each worker's share differs with the count."""
import dataclasses
import math

import pytest

from autoloader.config import LoaderConfig
from autoloader.probe import probe_machine
from autoloader.probe._pools import NativePool
from autoloader.request import Request
from autoloader.results import TrialResult
from autoloader.search import native_policy
from autoloader.search.search import Search
from helpers import drive_search
from workloads import CpuBound

BATCH = 16
CPUS = 8


def blas_pools(config: LoaderConfig, found: int = CPUS):
    kept = found if config.native_threads is None else min(found, config.native_threads)
    return (NativePool("libscipy_openblas", "blas", "openblas", found, kept),)


def model(*, unlimited_gain: float = 1.0, serial_cpu: float = 1.8, found: int = CPUS):
    """A batch of BLAS work: the serial trial's loading takes ``serial_cpu`` x its wall time in CPU; workers add up
    to 4 x, and without their limit they are ``unlimited_gain`` x as fast."""
    def measure(config: LoaderConfig) -> TrialResult:
        n = config.num_workers
        if n == 0:
            rate = 400.0
            fetch_s = BATCH / rate
            return TrialResult(config=config, samples_per_s=rate, batches=40, window_s=40 * fetch_s,
                               consumer_s_per_batch=1e-5, fetch_s_per_batch=fetch_s,
                               fetch_cpu_s_per_batch=serial_cpu * fetch_s)
        rate = 400.0 * min(n, 4) * (unlimited_gain if config.native_threads is None else 1.0)
        return TrialResult(config=config, samples_per_s=rate, batches=40, window_s=40 * BATCH / rate,
                           consumer_s_per_batch=1e-5, worker_cpu_util=0.95, native_pools=blas_pools(config, found))
    return measure


def drive(measure, *, native_threads=None, start=None, **kwargs):
    request = Request.checked(CpuBound(cost_s=0.001), BATCH, device="cpu", max_workers=16,
                              native_threads=native_threads, dataloader_kwargs=kwargs)
    profile = probe_machine(disk=False, gpus=False)
    profile = dataclasses.replace(profile, memory=dataclasses.replace(profile.memory, budget_bytes=None),
                                  cpu=dataclasses.replace(profile.cpu, usable=CPUS))
    return drive_search(Search(request, profile, budget=math.inf if start else 30.0, start=start), measure)


def unlimited_asked(asked):
    return [c for c in asked if c.num_workers > 0 and c.native_threads is None]


def test_every_candidate_with_workers_is_limited_to_its_share():
    asked, result = drive(model(serial_cpu=1.0))
    assert all(c.native_threads == native_policy.share(CPUS, c.num_workers) for c in asked if c.num_workers)
    assert not unlimited_asked(asked), "the serial trial ran no native threads: nothing to measure without"
    assert result.native_threads == native_policy.share(CPUS, result.num_workers)


def test_the_limit_is_measured_against_none_and_kept_when_as_fast():
    asked, result = drive(model(unlimited_gain=1.02))
    without = unlimited_asked(asked)
    assert len(without) == 1 and without[0].num_workers == result.num_workers
    after = asked[asked.index(without[0]) + 1]
    assert after == dataclasses.replace(without[0], native_threads=native_policy.share(CPUS, after.num_workers)), \
        "the limited one is measured again beside it"
    assert result.native_threads == native_policy.share(CPUS, result.num_workers), "within the tie: the limit stays"
    assert "measured without a limit" in str(result) and "measured at least as fast as without" in result.reason


def test_the_limit_is_dropped_when_measured_slower():
    asked, result = drive(model(unlimited_gain=1.5))
    assert unlimited_asked(asked) and result.num_workers > 0 and result.native_threads is None, result
    assert "not limited" in str(result) and "faster without than limited to" in result.reason


@pytest.mark.parametrize("setting, expected", [(2, 2), (False, None)])
def test_the_users_setting_is_every_candidates_and_never_measured_without(setting, expected):
    asked, result = drive(model(unlimited_gain=1.5), native_threads=setting)
    assert all(c.native_threads == expected for c in asked if c.num_workers)
    assert result.native_threads == expected


def test_pools_the_limit_does_not_change_are_not_measured_without_it():
    asked, result = drive(model(unlimited_gain=1.5, found=1))
    assert not unlimited_asked(asked) and result.native_threads == native_policy.share(CPUS, result.num_workers)


def test_without_a_serial_trial_the_limit_stays_unmeasured():
    asked, result = drive(model(unlimited_gain=1.5), num_workers=2)
    assert not unlimited_asked(asked) and result.native_threads == native_policy.share(CPUS, 2)


def test_a_search_from_a_decision_without_the_limit_keeps_it_off():
    asked, _ = drive(model(), start=LoaderConfig(4, 2, native_threads=None))
    assert asked and all(c.native_threads is None for c in asked if c.num_workers), asked
    asked, _ = drive(model(), start=LoaderConfig(4, 2, native_threads=1))
    assert all(c.native_threads is not None for c in asked if c.num_workers), asked
