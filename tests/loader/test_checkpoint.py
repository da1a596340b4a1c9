"""autoloader/loader/resume/checkpoint.py: ``Checkpoints``, the prefetcher's bookkeeping, driven by hand: the state
it writes mid-epoch and between epochs, the rest of the epoch it begins after a load, and the states it refuses before
a batch is served, each with the fix."""
from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from autoloader.loader.epochs import EpochClock
from autoloader.loader.resume.checkpoint import Checkpoints, ends_epoch
from autoloader.loader.source import PlainSource

N, BATCH = 30, 4  # 8 batches, the last one short


def make(n: int = N, **kwargs) -> PlainSource:
    return PlainSource(DataLoader(range(n), batch_size=BATCH, shuffle=True,
                                  generator=torch.Generator().manual_seed(7), **kwargs))


def saved_after(k: int, source: PlainSource, *, done: bool = False, ahead: str = "nothing") -> tuple:
    """(the state ``Checkpoints`` writes after the loop got ``k`` batches of a fresh epoch, the batches after them)."""
    checkpoints = Checkpoints()
    it = checkpoints.begin(source, stream_dataset=None)
    clock = EpochClock(0, 0.0)
    for _ in range(k):
        next(it)
        clock.batches += 1
    clock.done = done
    state = checkpoints.state(source, clock=clock, next_epoch=1, ahead=ahead, sampler_record=None, epoch_set=False,
                              decision=None)
    return json.loads(json.dumps(state)), [b.tolist() for b in it]


def test_a_state_saved_mid_epoch_begins_the_rest_of_that_epoch():
    state, rest = saved_after(3, make())
    assert state["in_epoch"] and state["batches"] == 3 and state["length"] == 8
    checkpoints, source = Checkpoints(), make()
    parsed = checkpoints.load(state, source)
    assert checkpoints.pending is parsed and not ends_epoch(parsed)
    assert [b.tolist() for b in checkpoints.begin(source, stream_dataset=None)] == rest
    assert checkpoints.pending is None, "a loaded state is applied once"


def test_a_state_saved_between_epochs_begins_a_fresh_epoch():
    state, _ = saved_after(8, make(), done=True)
    assert not state["in_epoch"] and state["batches"] == 0 and state["epoch"] == 1
    checkpoints, source = Checkpoints(), make()
    checkpoints.load(state, source)
    assert len(list(checkpoints.begin(source, stream_dataset=None))) == 8


@pytest.mark.parametrize("k, ahead, pulls", [(3, "nothing", 3), (3, "item", 4), (8, "nothing", 8), (8, "end", 9)])
def test_what_was_fetched_ahead_counts_as_a_pull_of_the_sampler(k, ahead, pulls):
    """A batch fetched ahead, or after the last batch the epoch's end (the sampler asked past it, where a
    ``RandomSampler`` with a generator draws once more), was pulled before the save."""
    state, _ = saved_after(k, make(), ahead=ahead)
    assert state["drawn"] == pulls


def test_a_state_saved_after_the_last_batch_ends_its_epoch():
    state, rest = saved_after(8, make())
    assert rest == []
    parsed = Checkpoints().load(state, make())
    assert parsed.in_epoch and ends_epoch(parsed)


def test_a_loaded_state_not_iterated_yet_is_saved_again_unchanged():
    state, _ = saved_after(2, make())
    checkpoints, source = Checkpoints(), make()
    checkpoints.load(state, source)
    assert checkpoints.state(source, clock=None, next_epoch=0, ahead="nothing", sampler_record=None, epoch_set=False,
                             decision=None) == state


@pytest.mark.parametrize("other, names", [
    (dict(n=N + 8), "len\\(dataset\\)=30 but this loader has len\\(dataset\\)=38: pass the same dataset"),
    (dict(drop_last=True), "drop_last=False but this loader has drop_last=True: pass the same"),
])
def test_a_state_from_another_loader_is_refused_naming_what_changed_and_the_fix(other, names):
    state, _ = saved_after(2, make())
    checkpoints = Checkpoints()
    with pytest.raises(ValueError, match=names):
        checkpoints.load(state, make(**other))
    assert checkpoints.pending is None


def test_an_edited_state_is_refused_by_its_digest():
    state, _ = saved_after(2, make())
    state["batches"] = 5
    with pytest.raises(ValueError, match="does not match its digest.*load the saved state unchanged"):
        Checkpoints().load(state, make())


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(6))


def test_a_stream_without_its_own_state_cannot_be_saved():
    source = PlainSource(DataLoader(Stream(), batch_size=2))
    with pytest.raises(ValueError, match="cannot be resumed exactly: .*no state_dict\\(\\)/load_state_dict\\(\\)"):
        Checkpoints().state(source, clock=None, next_epoch=0, ahead="nothing", sampler_record=None, epoch_set=False,
                            decision=None)
