"""autoloader/loader/build.py: the one constructor of a DataLoader, with exactly the knobs it is given (torch's
worker-count warning silenced only for a count autoloader measured), and the rest of a user's epoch rebuilt with the
user's settings over another sampling."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from autoloader.loader.build import build, rebuilt

MANY = 4096  # more workers than any machine's CPUs: torch warns at construction (no process starts)


def collate(batch):
    return torch.tensor(batch) * 10


def init(worker_id: int) -> None:
    return None


def test_build_makes_the_dataloader_with_the_given_knobs():
    loader = build(range(10), tuned_workers=False, batch_size=4, drop_last=True, collate_fn=collate,
                   num_workers=0, pin_memory=False)
    assert type(loader) is DataLoader
    assert (loader.batch_size, loader.drop_last, loader.collate_fn, loader.num_workers) == (4, True, collate, 0)
    assert [b.tolist() for b in loader] == [[0, 10, 20, 30], [40, 50, 60, 70]]


@pytest.mark.parametrize("tuned, warned", [(False, True), (True, False)])
def test_the_worker_count_warning_is_silenced_only_for_a_measured_count(tuned, warned):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = build(range(10), tuned_workers=tuned, num_workers=MANY)
    assert loader.num_workers == MANY
    assert any("This DataLoader will create" in str(w.message) for w in caught) is warned


def test_a_rebuilt_loader_keeps_the_users_settings_over_the_new_sampling():
    user = DataLoader(range(12), batch_size=3, shuffle=True, collate_fn=collate, num_workers=2, prefetch_factor=5,
                      persistent_workers=True, worker_init_fn=init, timeout=30, in_order=False)
    order = BatchSampler(SequentialSampler(range(6, 12)), 2, drop_last=False)
    generator = torch.Generator()
    loader = rebuilt(user, sampling={"batch_sampler": order}, generator=generator)
    assert loader.dataset is user.dataset and loader.batch_sampler is order and loader.generator is generator
    assert (loader.collate_fn, loader.num_workers, loader.prefetch_factor, loader.worker_init_fn, loader.timeout) == \
        (collate, 2, 5, init, 30)
    assert loader.in_order and not loader.persistent_workers, "in order, not persistent"


def test_a_rebuilt_loader_without_workers_serves_the_new_sampling():
    user = DataLoader(range(12), batch_size=5, collate_fn=collate)
    loader = rebuilt(user, sampling={"sampler": [11, 3], "batch_size": None}, generator=None)
    assert [b.tolist() for b in loader] == [110, 30]
