"""An epoch's order as Ray's tasks read it (autoloader/ray/order.py): a chunk reads back every batch exactly as the
sampler yielded it (Python ints from int64 arrays, anything else pickled), and the drawer draws an epoch, resumed or
not, into consecutive chunks on the calling thread: the same batches a plain DataLoader's sampler yields, the
sampler's draws and ``drawn`` as the epoch counts them, nothing held beyond the chunk being drawn. No Ray needed."""
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, Sampler

from autoloader.loader.slices import EpochSlicer
from autoloader.ray.order import Chunk, Drawer, chunk_of


class Sized(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _read_all(chunk):
    reader = chunk.batches()
    return [reader.read(chunk.start + j) for j in range(chunk.count)]


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 2 ** 62), max_size=6), max_size=12), start=st.integers(0, 10 ** 9))
def test_a_chunk_of_int_batches_is_arrays_and_reads_back_as_lists_of_python_ints(batches, start):
    chunk = chunk_of(batches, start=start, batched=True)
    assert chunk.objects is None and chunk.indices.dtype == np.int64 and len(chunk.offsets) == len(batches) + 1
    back = _read_all(chunk)
    assert back == batches and all(type(i) is int for batch in back for i in batch)
    assert chunk.nbytes == 8 * (sum(map(len, batches)) + len(batches) + 1)


@pytest.mark.parametrize("batches, batched", [
    ([["a", "b"], ["c"]], True),                         # string keys
    ([[np.int64(3), 4]], True),                          # a numpy integer: the dataset gets it as it was
    ([[2 ** 70]], True),                                 # past int64
    ([(1, 2), (3,)], True),                              # tuples, not lists
    ([[True, 1]], True),                                 # a bool is not an int index
    (["k", 3], False),
])
def test_anything_but_python_int_indices_is_sent_pickled_and_read_back_unchanged(batches, batched):
    chunk = chunk_of(batches, start=5, batched=batched)
    assert chunk.indices is None and chunk.objects is not None
    back = _read_all(chunk)
    assert back == batches and [type(b) for b in back] == [type(b) for b in batches]
    if batched:
        assert [[type(i) for i in b] for b in back] == [[type(i) for i in b] for b in batches]


def test_single_indices_read_back_as_python_ints_and_a_position_outside_the_chunk_is_refused():
    chunk = chunk_of([7, 0, 3], start=10, batched=False)
    assert chunk.offsets is None and _read_all(chunk) == [7, 0, 3] and type(_read_all(chunk)[0]) is int
    with pytest.raises(IndexError, match="batch 13 is not in the chunk of batches 10 to 12"):
        chunk.batches().read(13)
    assert pickle.loads(pickle.dumps(chunk)).batches().read(11) == 0


def _draw(epoch, batched, sizes, bite=None):
    drawer = Drawer(epoch, batched=batched)
    chunks = []
    for count in sizes:
        if drawer.exhausted:
            break
        drawer.begin(count)
        if bite:
            while not drawer.ready:
                drawer.pull(bite)
        chunk = drawer.finish()
        if chunk is not None:
            chunks.append(chunk)
    return drawer, chunks


@pytest.mark.parametrize("batch_size, drop_last", [(3, False), (3, True), (None, False), (1, False)])
@pytest.mark.parametrize("bite", [None, 2])
def test_the_drawer_draws_the_plain_dataloaders_epoch_into_consecutive_chunks(batch_size, drop_last, bite):
    dataset = Sized(20)
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=drop_last,
                       generator=torch.Generator().manual_seed(4))
    want = [batch.tolist() if batch_size is not None else int(batch) for batch in plain]  # the dataset is the index
    slicer = EpochSlicer(DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=drop_last,
                                    generator=torch.Generator().manual_seed(4)))
    epoch = slicer.epoch()
    drawer, chunks = _draw(epoch, batch_size is not None, [2, 3, 100, 100], bite)
    assert [c.start for c in chunks] == [0, 2, 5][:len(chunks)] and sum(c.count for c in chunks) == len(want)
    assert [b for c in chunks for b in _read_all(c)] == want
    assert drawer.exhausted and drawer.position == len(want)
    assert epoch.drawn == len(want), "never asked past the end: a plain epoch asks at its last next()"
    epoch.finish()
    assert epoch.drawn == len(want) + 1 and epoch.done


def test_the_drawer_continues_a_resumed_epoch_after_its_skipped_batches():
    plain = DataLoader(Sized(12), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1))
    want = [batch.tolist() for batch in plain]
    epoch = EpochSlicer(DataLoader(Sized(12), batch_size=2, shuffle=True,
                                   generator=torch.Generator().manual_seed(1))).epoch()
    epoch.skip(2, drawn=4)  # the saver had pulled two batches ahead: they are held, not drawn again
    _, chunks = _draw(epoch, True, [3, 10])
    assert [b for c in chunks for b in _read_all(c)] == want[2:] and chunks[0].start == 0


class Endless(Sampler):
    """A batch sampler without len(): its epoch ends when it runs out."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_a_sampler_without_len_is_drawn_until_it_runs_out():
    batches = [[0, 1], [2], [3, 4, 5]]
    epoch = EpochSlicer(DataLoader(Sized(6), batch_sampler=Endless(batches))).epoch()
    drawer, chunks = _draw(epoch, True, [2, 2, 2])
    assert [b for c in chunks for b in _read_all(c)] == batches and drawer.exhausted
    assert drawer.remaining is None and epoch.done


def test_a_chunk_being_drawn_is_given_back_when_the_run_is_left():
    epoch = EpochSlicer(DataLoader(Sized(10), batch_size=2)).epoch()
    drawer = Drawer(epoch, batched=True)
    drawer.begin(3)
    assert drawer.pull(1) == 1 and drawer.open and not drawer.ready
    drawer.close()
    assert not drawer.open and epoch.position == 0
    drawer.begin(2)
    assert _read_all(drawer.finish()) == [[0, 1], [2, 3]], "the given-back batch comes first"


def test_the_drawer_refuses_a_second_open_chunk_and_a_finish_without_one():
    drawer = Drawer(EpochSlicer(DataLoader(Sized(10), batch_size=2)).epoch(), batched=True)
    with pytest.raises(RuntimeError, match="begin"):
        drawer.finish()
    drawer.begin(2)
    with pytest.raises(RuntimeError, match="finish"):
        drawer.begin(2)
    with pytest.raises(ValueError, match="at least one batch"):
        Drawer(EpochSlicer(DataLoader(Sized(10), batch_size=2)).epoch(), batched=True).begin(0)


def test_a_million_indices_are_eight_megabytes_with_no_object_per_batch():
    epoch = EpochSlicer(DataLoader(Sized(10 ** 6), batch_size=64)).epoch()
    _, chunks = _draw(epoch, True, [10 ** 6])
    (chunk,) = chunks
    assert isinstance(chunk, Chunk) and chunk.count == 15625 and chunk.nbytes == 8 * (10 ** 6 + 15626)
    assert chunk.batches().read(15624) == list(range(10 ** 6 - 64, 10 ** 6))
