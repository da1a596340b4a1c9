"""What a search knows before it measures anything (search/settings.py: ``Settings``, from a request and the machine)
and what it has measured since (``Findings``); the epoch's length the copy-on-read forecast reads."""
import dataclasses

import pytest
import torch
from torch.utils.data import IterableDataset

from autoloader.config import LoaderConfig
from autoloader.request import Request
from autoloader.search.bounds import worker_bounds
from autoloader.search.settings import Findings, Settings, epoch_samples
from helpers import full_profile
from workloads import LatencyBound

GIB = 2**30


class _Endless(IterableDataset):
    def __iter__(self):
        return iter(())


def test_epoch_samples_is_the_ranks_share():
    data = LatencyBound(n=1000)
    assert epoch_samples(Request.checked(data, 8, device="cpu")) == 1000
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=4, rank=1, shuffle=False)
    assert epoch_samples(Request.checked(data, 8, device="cpu", dataloader_kwargs={"sampler": sampler})) == 250
    assert epoch_samples(Request.checked(_Endless(), 8, device="cpu")) is None, "no length: unknown"


def settings(profile=None, *, start=None, descend=False, **kwargs):
    request = Request.checked(LatencyBound(n=1000), 32, device="cpu", **kwargs)
    profile = profile or full_profile()
    bounds = worker_bounds(profile, max_workers=request.max_workers, dataset=request.dataset)
    return Settings.of(request, profile, bounds=bounds, budget=12.0, trial_limit=2.4, tolerance=0.05, start=start,
                       descend=descend)


@pytest.mark.parametrize("start, prefetch, pin, why", [
    (None, 2, False, "a search from scratch: the defaults"),
    (LoaderConfig(8, prefetch_factor=4, pin_memory=True), 4, True, "a re-tune: the configuration in force's"),
    (LoaderConfig(0), 2, False, "a re-tune from serial: no worker knobs to keep"),
])
def test_a_re_tune_searches_the_family_of_the_configuration_in_force(start, prefetch, pin, why):
    """A re-tune measures the configuration in force first (online_plan.py): its candidates keep its prefetch_factor
    and pin_memory, which the first search chose (a deeper prefetch, pinning) and a re-tune must not drop."""
    made = settings(start=start)
    assert (made.prefetch, made.pin) == (prefetch, pin), why


@pytest.mark.parametrize("kwargs, field, expected, why", [
    ({}, "batch_size", 32, "the request's"),
    ({}, "usable", 3, "the profile's usable CPUs"),
    ({"max_workers": 5}, "cap", 5, "the user's max_workers bounds every candidate"),
    ({"max_workers": 5}, "cap_reason", "", "the user's own bound needs no reason"),
    ({}, "budget", 12.0, "the seconds given"),
    ({}, "trial_limit", 2.4, "each candidate's limit, as given (candidates.trial_limit)"),
    ({}, "epoch_samples", 1000, "the dataset's length"),
    ({}, "disk_mb_s", 640.0, "the saved profile's sequential read speed"),
    ({}, "shm_free", None, "free /dev/shm as the probe read it (not known here)"),
    ({}, "prefetch", 2, "the default prefetch_factor"),
    ({"dataloader_kwargs": {"prefetch_factor": 6}}, "prefetch", 6, "the user's"),
    ({}, "pin", False, "no CUDA device: no pinning"),
    ({}, "tune_threads", False, "threads=False"),
    ({"threads": True}, "tune_threads", True, "threads=True: (processes, threads) candidates"),
    ({"threads": 4}, "threads", 4, "threads=4 fixes every candidate's threads"),
    ({"threads": 4}, "tune_threads", False, "... and none is searched"),
    ({}, "threads", 1, "otherwise one thread a process"),
    ({"native_threads": 2}, "native_setting", 2, "native_threads= as given"),
])
def test_the_settings_of_a_request(kwargs, field, expected, why):
    assert getattr(settings(**kwargs), field) == expected, why


@pytest.mark.parametrize("memory_budget, expected, source, why", [
    (GIB, GIB, "user", "bytes as given"),
    (None, 7 * GIB // 2, "available", "half of what the profile says may still be allocated"),
    (0.25, 7 * GIB // 4, "available", "the user's fraction of it"),
])
def test_the_memory_budget_is_resolved_once(memory_budget, expected, source, why):
    got = settings(memory_budget=memory_budget)
    assert (got.memory_budget, got.memory.bytes, got.memory.source) == (expected, expected, source), why


def test_the_start_and_the_direction_are_kept():
    start = LoaderConfig(8, 2)
    got = settings(start=start, descend=True)
    assert got.start == start and got.descend
    assert settings().start is None and not settings().descend
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.cap = 1  # type: ignore[misc]


def test_findings_start_empty_and_apart():
    one, two = Findings(), Findings()
    one.trials.append(object())
    one.by_config[LoaderConfig(0)] = object()
    assert two.trials == [] and two.by_config == {}, "each search's findings are its own"
    assert (two.serial, two.consumer_rate, two.ceiling, two.batch_bytes, two.per_worker_bytes) == (None,) * 5
    assert not two.memory_limited
