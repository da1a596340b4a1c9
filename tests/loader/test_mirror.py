"""autoloader/loader/mirror.py: ``DataLoaderMirror`` answers what frameworks read of a DataLoader as the wrapped one
(None for an iterable without it), keeps autoloader's worker_init_fn limit hidden and in force, and numbers epochs:
``set_epoch`` reaches every sampler, and without it each epoch advances them by one."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from autoloader.loader.mirror import SETTINGS, DataLoaderMirror
from autoloader.loader.native import NativeLimit
from autoloader.loader.source import IterableSource, PlainSource


def mine(worker_id: int) -> None:
    return None


def lightnings(worker_id: int) -> None:
    return None


def mirrored(**kwargs) -> DataLoaderMirror:
    return DataLoaderMirror(PlainSource(DataLoader(range(10), batch_size=3, **kwargs)))


def test_the_dataloaders_attributes_read_through():
    generator = torch.Generator()
    mirror = mirrored(drop_last=True, generator=generator)
    loader = mirror._template
    assert len(mirror) == 3 and mirror.dataset is loader.dataset and mirror.batch_size == 3
    assert mirror.sampler is loader.sampler and mirror.batch_sampler is loader.batch_sampler
    for name in SETTINGS:
        assert getattr(mirror, name) is getattr(loader, name), name
    assert mirror.drop_last is True and mirror.generator is generator
    with pytest.raises(AttributeError):
        mirror.num_workers = 4


def test_an_iterable_without_them_reads_none():
    mirror = DataLoaderMirror(IterableSource([1, 2]))
    assert len(mirror) == 2
    assert (mirror.dataset, mirror.sampler, mirror.batch_size, mirror.num_workers, mirror._iterator) == (None,) * 5


def test_worker_init_fn_shows_the_users_and_setting_it_keeps_the_limit():
    mirror = mirrored(worker_init_fn=NativeLimit(2, then=mine))
    assert mirror.worker_init_fn is mine
    mirror.worker_init_fn = lightnings
    installed = mirror._template.worker_init_fn
    assert mirror.worker_init_fn is lightnings
    assert isinstance(installed, NativeLimit) and installed.threads == 2 and installed.then is lightnings


def test_the_persistent_iterator_is_forwarded():
    mirror = mirrored()
    mirror._iterator = "iterator"
    assert mirror._template._iterator == "iterator" and mirror._iterator == "iterator"


def sharded() -> DataLoaderMirror:
    return DataLoaderMirror(PlainSource(DataLoader(range(8), sampler=DistributedSampler(range(8), num_replicas=2,
                                                                                           rank=0))))


def test_set_epoch_numbers_the_next_epoch_and_tells_the_samplers():
    mirror = sharded()
    mirror.set_epoch(5)
    assert mirror.sampler.epoch == 5 and mirror._next_epoch == 5
    with pytest.raises(TypeError, match="epoch must be an int, got True"):
        mirror.set_epoch(True)


def test_each_epoch_advances_the_samplers_unless_set_epoch_numbered_it():
    mirror = sharded()
    seen = []
    for number in (None, None, 7, None):
        if number is not None:
            mirror.set_epoch(number)
        mirror._advance_epoch()
        seen.append(mirror.sampler.epoch)
    assert seen == [0, 1, 7, 8]
