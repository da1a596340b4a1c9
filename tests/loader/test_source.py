"""autoloader/loader/source.py: what a PrefetchLoader wraps, declared. A DataLoader is a ``PlainSource`` (its own
epochs; the rest of an interrupted one rebuilt over the redrawn order), any other iterable an ``IterableSource`` (its
epochs as they come; no resume), a ``Source`` itself; anything else refused; a failed batch's marker."""
from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch
from torch.utils.data import DataLoader

from autoloader.loader.slices import EpochSlicer
from autoloader.loader.source import BatchError, IterableSource, PlainSource, Source, as_source


class Own(Source):
    template = in_force = None

    def epoch(self) -> Iterator[Any]:
        return iter(())


def loader() -> DataLoader:
    return DataLoader(range(10), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(2))


def test_as_source_declares_what_it_wraps():
    plain = loader()
    source = as_source(plain)
    assert type(source) is PlainSource and source.template is plain and source.in_force is plain
    batches = [[1, 2], [3]]
    assert type(as_source(batches)) is IterableSource and as_source(batches).template is batches
    own = Own()
    assert as_source(own) is own
    with pytest.raises(TypeError, match="loader must be an iterable of batches .e.g. a DataLoader., got int"):
        as_source(42)


def test_a_plain_source_serves_its_dataloaders_epochs():
    source = PlainSource(loader())
    reference = loader()
    for _ in range(2):
        assert [b.tolist() for b in source.epoch()] == [b.tolist() for b in reference]
    assert isinstance(source.slicer, EpochSlicer) and source.slicer is source.slicer
    assert source.slicer.reference is source.template


def test_a_plain_source_resumes_the_rest_of_a_redrawn_epoch():
    source = PlainSource(loader())
    whole = [b.tolist() for b in loader()]
    redrawn = source.slicer.epoch()
    redrawn.skip(2)
    assert [b.tolist() for b in source.resume(redrawn)] == whole[2:]


def test_an_iterable_source_iterates_as_it_is_and_cannot_resume():
    source = IterableSource((x for x in "ab"))
    assert list(source.epoch()) == ["a", "b"] and list(source.epoch()) == [], "a generator's one pass"
    assert source.slicer is None and source.epoch_source is None and source.decisions == ()
    with pytest.raises(TypeError, match="a wrapped generator cannot be resumed mid-epoch; wrap a torch.utils"):
        source.resume(EpochSlicer(loader()).epoch())


def test_a_batch_error_wraps_an_exception_only():
    error = ValueError("sample 3")
    assert BatchError(error).exception is error and repr(BatchError(error)) == "BatchError(ValueError('sample 3'))"
    with pytest.raises(TypeError, match="KeyboardInterrupt and SystemExit propagate at once"):
        BatchError(KeyboardInterrupt())
