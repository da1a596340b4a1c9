"""``procs.drop``: letting go of a DataLoader iterator runs its shutdown at once, and pays for a full garbage
collection only when a reference cycle holds the iterator (NOTE [ Process cleanup ], step 2)."""
from __future__ import annotations

import gc
import weakref

import pytest
from torch.utils.data import DataLoader

from autoloader.measure import procs
from workloads import LatencyBound


@pytest.fixture
def collections(monkeypatch):
    """Every ``gc.collect()`` call, counted; each still collects."""
    calls = []
    real = gc.collect

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(gc, "collect", counted)
    return calls


def _loader() -> DataLoader:
    return DataLoader(LatencyBound(n=16, latency_s=0.0), batch_size=4)


def test_an_iterator_freed_by_its_last_reference_costs_no_collection_even_if_its_loader_is_kept(collections):
    loader = _loader()
    iterator = iter(loader)
    gone = weakref.ref(iterator)
    references = [iterator, loader]
    del iterator
    procs.drop(references)
    assert gone() is None and references == []
    assert collections == [], "a full collection ran for a loader the caller still holds"


def test_an_iterator_held_by_a_reference_cycle_is_collected(collections):
    iterator = iter(_loader())
    iterator.itself = iterator  # a cycle, as a traceback's frames make
    gone = weakref.ref(iterator)
    references = [iterator]
    del iterator
    procs.drop(references)
    assert collections and gone() is None


@pytest.mark.parametrize("references", [[], [None], [None, object()]], ids=["nothing", "no-iterator", "loader-only"])
def test_nothing_to_free_costs_no_collection(references, collections):
    procs.drop(references)
    assert references == [] and collections == []
