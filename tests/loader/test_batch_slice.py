"""autoloader/loader/slices.py: a ``BatchSlice`` iterated by hand as its DataLoader would: at most ``limit``
batches, the undelivered ones given back in order, only as many kept as its lookahead, ``cap`` reserving the tail,
the DataLoader arguments and the private generator it gives (NOTE [ Exact epochs across candidates ] in
loader/slices.py)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from autoloader.loader.slices import BatchSlice, SliceRecord
from autoloader.loader.slices import EpochSource


def epoch(n: int = 10, batch: int = 2) -> EpochSource:
    return EpochSource(BatchSampler(SequentialSampler(range(n)), batch, drop_last=False))


def firsts(batches) -> list:
    return [b[0] for b in batches]


def test_a_slice_hands_out_at_most_its_limit_and_gives_back_what_was_not_delivered():
    source = epoch()
    part = source.take(3)
    assert len(part) == 3 and firsts(part) == [0, 2, 4]
    record = part.delivered(1)
    assert record == SliceRecord(number=0, start=0, limit=3, pulled=3, delivered=1) and record.reissued == 2
    rest = source.take(None)
    assert rest.number == 1 and len(rest) == 4 and firsts(rest) == [2, 4, 6, 8], "given back first, in order"
    rest.delivered(4)
    assert source.done and source.position == 5


def test_a_slice_keeps_only_its_lookahead_and_says_so_when_more_went_undelivered():
    part = epoch().take(None)
    part.expect(0)  # keeps the last 2
    pulled = list(part)
    assert len(pulled) == 5
    with pytest.raises(RuntimeError, match="kept only its last 2 batches but 4 are undelivered"):
        part.delivered(1)
    part.delivered(3)


def test_cap_reserves_the_tail_so_the_next_slice_starts_after_it():
    source = epoch()
    part = source.take(None)
    it = iter(part)
    next(it)
    assert part.cap(2) == 3 and part.capped and source.unclaimed == 2
    after = source.take(None)
    assert firsts(after) == [6, 8]
    assert firsts(it) == [2, 4], "the capped slice serves its reserved tail"
    part.delivered(3)
    after.delivered(2)
    assert source.done


def test_the_items_pass_through_but_the_batches_themselves_are_reissued():
    source = epoch()
    part = source.take(2)
    part.through = lambda batch: ("seen", batch)
    assert list(part) == [("seen", [0, 1]), ("seen", [2, 3])]
    part.delivered(0)
    assert list(source.take(1)) == [[0, 1]]


def test_the_dataloader_arguments_follow_the_epochs_batching():
    part = epoch().take(None)
    assert part.sampling() == {"batch_sampler": part}
    unbatched = EpochSource(SequentialSampler(range(4)), batched=False).take(None)
    assert unbatched.sampling() == {"sampler": unbatched, "batch_size": None}


def test_each_slice_has_a_private_generator_of_its_own_that_leaves_the_users_rng():
    source = epoch()
    first = source.take(1)
    state = torch.get_rng_state()
    draw = torch.rand(3, generator=first.private_generator()).tolist()
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.rand(3, generator=first.private_generator()).tolist() == draw, "the same slice, the same seed"
    list(first)
    first.delivered(1)
    assert torch.rand(3, generator=source.take(1).private_generator()).tolist() != draw


def test_a_reused_slice_is_bound_again_and_its_old_iterator_refused():
    source = epoch()
    part = source.take(2)
    old = iter(part)
    next(old)
    part.delivered(1)
    assert source.take(2, reuse=part) is part and part.number == 1
    with pytest.raises(RuntimeError, match="closed by delivered"):
        next(old)
    assert firsts(part) == [2, 4]


def test_an_unbound_slice_says_where_to_get_one():
    with pytest.raises(RuntimeError, match="get one from EpochSource.take"):
        len(BatchSlice())
