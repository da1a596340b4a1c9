"""autoloader/loader/resume/redraw.py: the rest of an interrupted epoch, redrawn from its starting RNG states with
the yielded batches skipped by index; a sampler whose order the states do not decide, or a source that cannot be
redrawn, refused with the fix; which IterableDataset can resume through its own state."""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from autoloader.loader.resume.redraw import ended_at, redrawn, same_order, stream_rule
from autoloader.loader.resume.rng import RngState, parts_of
from autoloader.loader.source import IterableSource, PlainSource

N, BATCH = 23, 4


def as_lists(batches) -> list:
    return [b.tolist() if isinstance(b, torch.Tensor) else list(b) for b in batches]


def served(epoch) -> list:
    """Every batch of an ``EpochSource`` not yet served, through one slice iterated as a batch sampler."""
    part = epoch.take(None)
    batches = list(part)
    part.delivered(len(batches))
    return batches


def interrupted(make, k: int):
    """A run of ``make()``'s loader stopped after ``k`` batches: (its start states, its state then, the batches it
    yields after k, the RNG draws its loop makes after k)."""
    loader = make()
    parts = parts_of(loader)
    start = RngState.take(parts, samplers=True)
    it = iter(loader)
    for _ in range(k):
        next(it)
    now = RngState.take(parts, samplers=False)
    rest = as_lists(it)
    now.put(parts)
    return start, now, rest, torch.rand(2).tolist()


def shuffled() -> DataLoader:
    return DataLoader(range(N), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("make", [shuffled, lambda: DataLoader(range(N), batch_size=BATCH, shuffle=True)],
                         ids=["generator", "global-rng"])
def test_the_rest_of_an_epoch_is_redrawn_and_the_rngs_left_as_at_the_save(make):
    k = 2
    start, now, rest, draws_after = interrupted(make, k)
    torch.manual_seed(999)  # a fresh process's RNG
    source = PlainSource(make())
    epoch = redrawn(source, start=start, batches=k, drawn=k, now=now)
    assert torch.rand(2).tolist() == draws_after, "the loop's draws go on from the saved ones"
    assert as_lists(served(epoch)) == rest


class PrivateRng(Sampler):
    """A sampler whose order comes from a ``random.Random`` no saved state holds."""

    def __init__(self, n: int) -> None:
        self.n, self.rng = n, random.Random()

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.rng.sample(range(self.n), self.n))


def test_an_order_the_saved_states_do_not_decide_is_refused_with_the_fix():
    loader = DataLoader(range(N), batch_size=BATCH, sampler=PrivateRng(N))
    parts = parts_of(loader)
    with pytest.raises(ValueError, match="give the sampler state_dict\\(\\)/load_state_dict\\(\\)"):
        same_order(PlainSource(loader).slicer, parts, RngState.take(parts, samplers=True), 2)


def test_an_order_drawn_twice_alike_keeps_the_batches_it_drew():
    loader = shuffled()
    parts = parts_of(loader)
    states = RngState.take(parts, samplers=True)
    expected = as_lists(loader)
    epoch = same_order(PlainSource(loader).slicer, parts, states, 2)
    assert epoch.drawn == 2
    assert as_lists(served(epoch)) == expected


def test_an_iterable_cannot_be_redrawn_mid_epoch():
    source = IterableSource([torch.zeros(2)])
    state = RngState.take(parts_of(source.template), samplers=True)
    with pytest.raises(TypeError, match="wrap a torch.utils.data.DataLoader"):
        redrawn(source, start=state, batches=1, drawn=1, now=state)
    assert ended_at(source, start=state, batches=1, drawn=1) is False


class Unsized(Sampler):
    """A shuffled order of ``n`` indices without ``__len__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


def test_an_epoch_without_len_ends_where_no_batch_follows_and_the_rngs_stay():
    loader = DataLoader(range(10), batch_size=5, sampler=Unsized(10))
    source = PlainSource(loader)
    start = RngState.take(parts_of(loader), samplers=True)
    draws = torch.rand(3).tolist()
    start.put(parts_of(loader))
    assert ended_at(source, start=start, batches=2, drawn=3)
    assert not ended_at(source, start=start, batches=1, drawn=2)
    assert torch.rand(3).tolist() == draws


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


class StatefulStream(Stream):
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


def test_which_stream_resumes_through_its_own_state():
    assert stream_rule(DataLoader(range(4))) == (None, "")
    dataset, why = stream_rule(DataLoader(Stream()))
    assert dataset is None and "give it both" in why
    dataset, why = stream_rule(DataLoader(StatefulStream(), num_workers=2))
    assert dataset is None and "use num_workers=0" in why
    stream = StatefulStream()
    assert stream_rule(DataLoader(stream)) == (stream, "")
