"""The one worker cap (autoloader.search.bounds): the default bound, the user's max_workers, the open-files limit and
an IterableDataset's shards, each winning where it is the smallest."""
from __future__ import annotations

import dataclasses

import pytest
from torch.utils.data import IterableDataset

from autoloader.search import bounds
from helpers import full_profile


class _Shards(IterableDataset):
    def __init__(self, n: int) -> None:
        self.num_shards = n

    def __iter__(self):
        return iter(())


@pytest.mark.parametrize("cpus, nofile, cap", [(1, None, 64), (16, None, 128), (16, 1024, 32), (16, 10, 1),
                                               (None, None, 64), (4, 4096, 64)])
def test_default_max_workers_is_64_or_8_per_cpu_unless_the_descriptors_run_short(cpus, nofile, cap):
    assert bounds.default_max_workers(usable_cpus=cpus, nofile=nofile) == cap


def test_the_open_files_limit_is_named_only_when_it_sets_the_cap(monkeypatch):
    monkeypatch.setattr(bounds, "open_files_limit", lambda: (1024, 4096))
    found = bounds.worker_bounds(full_profile(), max_workers=None, dataset=None)
    assert (found.cap, found.usable_cpus, found.by_open_files) == (32, 3, True) and "`ulimit -n` is 1024" in found.reason
    monkeypatch.setattr(bounds, "open_files_limit", lambda: (None, None))
    plain = bounds.worker_bounds(full_profile(), max_workers=None, dataset=None)
    assert (plain.cap, plain.reason, plain.by_open_files) == (64, "", False)


def test_max_workers_overrides_the_default_and_the_shards_cap_both(monkeypatch):
    monkeypatch.setattr(bounds, "open_files_limit", lambda: (1024, 4096))
    assert bounds.worker_bounds(full_profile(), max_workers=100, dataset=None) == bounds.Bounds(100, 3)
    capped = bounds.worker_bounds(full_profile(), max_workers=100, dataset=_Shards(6))
    assert capped.cap == 6 and capped.reason == "at most 6 workers: the dataset reads 6 shards"
    assert bounds.worker_bounds(full_profile(), max_workers=2, dataset=_Shards(6)).cap == 2


def test_usable_cpus_fall_back_to_the_logical_count_then_one():
    profile = full_profile()
    assert bounds.usable_cpus(profile) == 3
    no_usable = dataclasses.replace(profile, cpu=dataclasses.replace(profile.cpu, usable=None))
    assert bounds.usable_cpus(no_usable) == 8
    nothing = dataclasses.replace(profile, cpu=dataclasses.replace(profile.cpu, usable=None, logical=None))
    assert bounds.usable_cpus(nothing) == 1


def test_default_max_workers():
    assert bounds.default_max_workers(usable_cpus=2, nofile=20000) == 64
    assert bounds.default_max_workers(usable_cpus=32, nofile=None) == 256
    assert bounds.default_max_workers(usable_cpus=2, nofile=1024) == 32
    assert bounds.default_max_workers(usable_cpus=None, nofile=16) == 1
