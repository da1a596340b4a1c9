"""An epoch of a PrefetchLoader as the loop iterates it (autoloader.loader.epoch_iter): a batch that raises is raised
by ``next()`` and the epoch goes on when its source's iterator does (NOTE [ A batch that raises ] in source.py), the
``BatchError`` marker of generator sources, what a checkpoint counts, Ctrl-C while reading ahead, and no reference
cycle that would keep a DataLoader's workers alive."""
from __future__ import annotations

import gc
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader

import autoloader.loader.prefetch as _prefetch
from autoloader import PrefetchLoader
from autoloader.loader.source import BatchError, consumed
from conformance_data import Numbers
from helpers import drain, live_children, wait_no_children


class Flaky:
    """An iterator over ``items`` that raises each ``Exception`` in it in place, and survives, as a DataLoader's."""

    def __init__(self, items):
        self.items = list(items)

    def __iter__(self):
        return self

    def __next__(self):
        if not self.items:
            raise StopIteration
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


class Batches:
    """An iterable of batches whose every epoch is a new ``Flaky``."""

    def __init__(self, *items):
        self.items = items

    def __iter__(self):
        return Flaky(self.items)


def generator_source(*items):
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item


def test_an_error_from_a_surviving_iterator_is_raised_and_the_epoch_goes_on():
    loader = PrefetchLoader(Batches(torch.tensor(0), ValueError("one"), torch.tensor(2), KeyError("three")))
    assert drain(loader) == [("tensor", "torch.int64", 0), ("raised", "ValueError", "one"),
                             ("tensor", "torch.int64", 2), ("raised", "KeyError", "three")]
    assert loader.stats.batches == 2, "stats count the batches handed out"


def test_an_error_ends_a_generators_epoch():
    loader = PrefetchLoader(generator_source(torch.tensor(0), ValueError("one"), torch.tensor(2)))
    assert drain(loader) == [("tensor", "torch.int64", 0), ("raised", "ValueError", "one")]


def test_a_batch_error_marker_is_raised_and_the_generator_goes_on():
    error = ValueError("two")
    loader = PrefetchLoader(generator_source(torch.tensor(0), BatchError(error), torch.tensor(2)))
    it = iter(loader)
    assert int(next(it)) == 0
    with pytest.raises(ValueError) as caught:
        next(it)
    assert caught.value is error, "the exception itself, unchanged"
    assert int(next(it)) == 2
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(TypeError, match="KeyboardInterrupt and SystemExit propagate"):
        BatchError(KeyboardInterrupt())


def test_an_error_in_opening_the_epoch_ends_it():
    class Broken:
        def __iter__(self):
            raise OSError("cannot open")

    it = iter(PrefetchLoader(Broken()))
    with pytest.raises(OSError):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_which_errors_used_up_their_batch():
    assert consumed(ValueError("sample 3 is corrupt")) and consumed(RuntimeError("Caught ValueError in DataLoader "
                                                                                 "worker process 0."))
    assert not consumed(RuntimeError("DataLoader timed out after 5 seconds"))
    assert not consumed(RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly"))
    assert not consumed(RuntimeError("DataLoader worker (pid 123) is killed by signal: Killed. "))
    assert not consumed(KeyboardInterrupt())


@pytest.mark.parametrize("ahead", [False, True])
def test_a_checkpoint_counts_a_failed_batch_as_passed(ahead):
    """Saved right after the error, the resume serves the batch after the failed one, as the saver's next ``next()``
    would (the failed batch's indices were used)."""
    with mock.patch.object(_prefetch, "reads_ahead", lambda stream: ahead):
        saver = PrefetchLoader(DataLoader(Numbers(10, bad=(3,)), batch_size=2))
        it = iter(saver)
        next(it)
        with pytest.raises(ValueError):
            next(it)
        state = saver.state_dict()
        assert state["batches"] == 2
        resumed = PrefetchLoader(DataLoader(Numbers(10, bad=(3,)), batch_size=2))
        resumed.load_state_dict(state)
        assert [b.view(-1).tolist() for b in resumed] == [[4, 5], [6, 7], [8, 9]]


def test_ctrl_c_while_reading_ahead_hands_out_the_batch_it_held_next():
    class Interrupting(Batches):
        def __iter__(self):
            return Flaky(self.items)

    with mock.patch.object(_prefetch, "reads_ahead", lambda stream: True):
        loader = PrefetchLoader(Interrupting(torch.tensor(0), torch.tensor(1), KeyboardInterrupt(), torch.tensor(3)))
        it = iter(loader)
        assert int(next(it)) == 0
        with pytest.raises(KeyboardInterrupt):  # raised at once, while batch 1 was held
            next(it)
        assert [int(b) for b in it] == [1, 3]


@pytest.mark.parametrize("ahead", [False, True])
def test_a_workers_error_leaves_no_cycle_holding_the_workers(ahead):
    """torch re-raises a worker's error from a frame that holds it (a reference cycle through the DataLoader
    iterator): a loop that caught it and stopped must not keep the workers until a garbage collection."""
    gc.collect()
    gc.disable()
    try:
        with mock.patch.object(_prefetch, "reads_ahead", lambda stream: ahead):
            loader = PrefetchLoader(DataLoader(Numbers(20, bad=(4, 6)), batch_size=2, num_workers=2,
                                               persistent_workers=True))
            it = iter(loader)
            for _ in range(4):
                try:
                    next(it)
                except ValueError:
                    pass
            assert live_children()
            del it, loader
            assert wait_no_children(5) == [], "the workers outlived their loader"
    finally:
        gc.enable()


@pytest.mark.parametrize("ahead", [False, True])
def test_close_ends_the_epoch_releases_the_workers_and_a_state_saved_before_resumes(ahead):
    """``close()`` (a generator's, which ``iter(loader)`` was before it went on after errors): later ``next()`` calls
    end, the workers go while the loader and the iterator are still referenced, and a state saved before the close
    resumes after the last batch handed out."""
    with mock.patch.object(_prefetch, "reads_ahead", lambda stream: ahead):
        loader = PrefetchLoader(DataLoader(Numbers(20), batch_size=2, num_workers=2))
        it = iter(loader)
        assert [next(it).view(-1).tolist() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
        state = loader.state_dict()
        assert live_children()
        it.close()
        it.close()  # twice: nothing more
        with pytest.raises(StopIteration):
            next(it)
        assert wait_no_children(10) == [], "close() left the epoch's workers running"
        resumed = PrefetchLoader(DataLoader(Numbers(20), batch_size=2, num_workers=2))
        resumed.load_state_dict(state)
        assert [b.view(-1).tolist() for b in resumed] == [[2 * i, 2 * i + 1] for i in range(3, 10)]
        assert [len(b) for b in loader] == [2] * 10  # the next epoch is whole


def test_close_before_the_first_batch_opens_nothing():
    loader = PrefetchLoader(DataLoader(Numbers(4), batch_size=2, num_workers=2))
    it = iter(loader)
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert live_children() == [], "closed before its first next(), the epoch started workers"
    assert [len(b) for b in loader] == [2, 2]
