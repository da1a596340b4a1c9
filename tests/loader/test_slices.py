"""Epoch slices (autoloader/loader/slices.py): a sequence of candidate DataLoaders yields exactly a plain DataLoader's
epochs.

Every test compares against a plain ``DataLoader`` built with the same arguments and seeds, over 3 epochs, and checks
the user's generator and the global RNG end each epoch in the same state. ``EpochSlicer`` takes the plain DataLoader
whose epochs it serves; each candidate is built as slices.py says (``part.expect``, ``**part.sampling()``,
``part.private_generator()``, ``in_order=True``): by ``Recipe`` here, by ``Request.data_loader`` in the library
(``ThroughRequest``). The last section iterates a ``BatchSlice`` by hand as its DataLoader would: at most ``limit``
batches, the undelivered ones given back in order, only as many kept as its lookahead, ``cap`` reserving the tail,
the DataLoader arguments and the private generator it gives.
"""
from __future__ import annotations

import gc
import re
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, SequentialSampler, SubsetRandomSampler,
                              WeightedRandomSampler)

from autoloader.config import LoaderConfig, in_flight
from autoloader.request import Request
from autoloader.loader.slices import BatchSlice, EpochSlicer, EpochSource, SliceRecord
from slice_data import CountingSampler, DieInWorker, EagerChunks, Indices, Stream

EPOCHS = 3
GLOBAL_SEED = 1234
Step = Tuple[Optional[int], int, Optional[int]]  # (slice limit, num_workers, stop after this many batches)
SERIAL: Sequence[Step] = ((3, 0, None), (5, 0, 2), (0, 0, None), (1, 0, None), (None, 0, None))
# 2 workers x prefetch 2 pull 4 batches at iter() and one more per batch yielded: stopped after 1, the candidate
# re-issues 4; the next one pulls 2 of those and is stopped before its first batch (as when its workers die at
# start): they go back in front of the other two.
MIXED: Sequence[Step] = ((2, 0, None), (6, 2, 1), (2, 2, 0), (4, 0, None), (None, 2, None))
SAMPLING = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator")
"""The DataLoader arguments that decide an epoch's batches: the plain loader's; a candidate takes its slice's."""


def as_list(batch: Any) -> Any:
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


def rng_state(generator: Optional[torch.Generator]) -> List[torch.Tensor]:
    return [torch.get_rng_state()] + ([generator.get_state()] if generator is not None else [])


class Recipe:
    """The user's DataLoader arguments: ``plain``, the DataLoader an ``EpochSlicer`` serves the epochs of, and each
    slice's candidate DataLoader, built by hand as slices.py's docstring says."""

    def __init__(self, dataset: Any, kwargs: Dict[str, Any]) -> None:
        self.dataset = dataset
        self.plain = DataLoader(dataset, **{k: v for k, v in kwargs.items() if k in SAMPLING})
        self.other = {k: v for k, v in kwargs.items() if k not in SAMPLING}

    def candidate(self, part: BatchSlice, num_workers: int, prefetch_factor: Optional[int] = None,
                  **extra: Any) -> DataLoader:
        prefetch = (prefetch_factor or 2) if num_workers else None
        part.expect(in_flight(num_workers, prefetch))
        return DataLoader(self.dataset, num_workers=num_workers, prefetch_factor=prefetch, **self.other, **extra,
                          **part.sampling(), generator=part.private_generator(), in_order=True)


class ThroughRequest:
    """The same, built as the library builds them (``OnlineLoader``): ``Request.data_loader`` for the plain loader of
    a configuration, and with ``sampling=part.sampling()`` for a candidate."""

    def __init__(self, dataset: Any, kwargs: Dict[str, Any]) -> None:
        kwargs = dict(kwargs)
        batch_size, shuffle = kwargs.pop("batch_size", 1), kwargs.pop("shuffle", False)
        self.request = Request.checked(dataset, batch_size, shuffle=shuffle, dataloader_kwargs=kwargs)
        self.plain = self.request.data_loader(LoaderConfig(0))

    def candidate(self, part: BatchSlice, num_workers: int, prefetch_factor: Optional[int] = None) -> DataLoader:
        config = LoaderConfig(num_workers, (prefetch_factor or 2) if num_workers else None)
        part.expect(config.in_flight())
        return self.request.data_loader(config, sampling=part.sampling(), generator=part.private_generator(),
                                        in_order=True, persistent_workers=False)


def plain_epochs(dataset, kwargs: Dict[str, Any], on_epoch: Callable[[int], None] = lambda e: None):
    torch.manual_seed(GLOBAL_SEED)
    loader = DataLoader(dataset, **kwargs)
    epochs, states = [], []
    for e in range(EPOCHS):
        on_epoch(e)
        epochs.append([as_list(b) for b in loader])
        states.append(rng_state(kwargs.get("generator")))
    return epochs, states


def run_slices(slicer: EpochSlicer, build: Any,
               plan: Sequence[Step]) -> Tuple[List[Any], EpochSource, List[SliceRecord]]:
    """One epoch served by the plan's candidates (``Recipe.candidate``), the last one to the epoch's end, and what
    each slice served."""
    source, out, records = slicer.epoch(), [], []
    for limit, workers, stop in plan:
        part = source.take(limit)
        loader = build.candidate(part, workers, 2 if workers else None)
        it, got = iter(loader), 0
        try:
            while stop is None or got < stop:
                out.append(as_list(next(it)))
                got += 1
        except StopIteration:
            pass
        del it, loader  # shuts its workers down
        records.append(part.delivered(got))
    assert source.done
    return out, source, records


def sliced_epochs(dataset, kwargs: Dict[str, Any], plan: Sequence[Step],
                  on_epoch: Callable[[int], None] = lambda e: None, *, builder: Callable[..., Any] = Recipe):
    torch.manual_seed(GLOBAL_SEED)
    build = builder(dataset, kwargs)
    slicer = EpochSlicer(build.plain)
    assert len(slicer) == len(build.plain)
    epochs, states, reissued = [], [], []
    for e in range(EPOCHS):
        on_epoch(e)
        out, source, records = run_slices(slicer, build, plan)
        assert source.position == len(out) and [r.number for r in records] == list(range(len(plan)))
        epochs.append(out)
        states.append(rng_state(kwargs.get("generator")))
        reissued.append([r.reissued for r in records])
    return epochs, states, reissued


def assert_same_run(plain, sliced) -> None:
    (p_epochs, p_states), (s_epochs, s_states) = plain, sliced[:2]
    for e in range(EPOCHS):
        assert s_epochs[e] == p_epochs[e], f"epoch {e} differs"
        for p, s in zip(p_states[e], s_states[e]):
            assert torch.equal(p, s), f"RNG state after epoch {e} differs"
    assert p_epochs[0] != p_epochs[1] or not any(isinstance(x, list) for x in p_epochs[0])


def check(make_kwargs: Callable[[], Dict[str, Any]], plan: Sequence[Step] = SERIAL, n: int = 103, *,
          builder: Callable[..., Any] = Recipe, **worker_args: Any) -> List[List[int]]:
    """Returns each epoch's re-issued count per slice. ``worker_args``: the user's arguments that a plain loader
    without workers rejects; only the sliced run gets them."""
    dataset = Indices(n)
    plain = plain_epochs(dataset, make_kwargs())
    sliced = sliced_epochs(dataset, dict(make_kwargs(), **worker_args), plan, builder=builder)
    assert_same_run(plain, sliced)
    return sliced[2]


@pytest.mark.parametrize("drop_last", [False, True])
def test_shuffle_with_generator_ragged_last_batch(drop_last):
    check(lambda: dict(batch_size=4, shuffle=True, drop_last=drop_last, generator=torch.Generator().manual_seed(7)))


def test_shuffle_global_rng_with_workers_pulling_ahead():
    # 2 workers x prefetch 2 pull 4 batches at iter(); the candidate stopped after 1 re-issues 4 (see MIXED).
    reissued = check(lambda: dict(batch_size=4, shuffle=True), plan=MIXED)
    assert reissued == [[0, 4, 2, 0, 0]] * EPOCHS


def test_candidates_the_library_builds_drop_worker_only_arguments_and_keep_order():
    # As OnlineLoader builds them (Request.data_loader): the user's worker-only arguments (timeout) are dropped for
    # 0-worker candidates, and their in_order=False is overridden (the plain loader keeps it; the slicer logs it).
    reissued = check(lambda: dict(batch_size=4, shuffle=True, in_order=False), plan=MIXED, builder=ThroughRequest,
                     timeout=30)
    assert reissued == [[0, 4, 2, 0, 0]] * EPOCHS


@pytest.mark.parametrize("make_sampler", [
    lambda n: WeightedRandomSampler(torch.rand(n, generator=torch.Generator().manual_seed(3)), 60, replacement=True),
    lambda n: SubsetRandomSampler(list(range(0, n, 2)), generator=torch.Generator().manual_seed(5)),
], ids=["weighted-global-rng", "subset-own-generator"])
def test_user_sampler(make_sampler):
    check(lambda: dict(batch_size=5, sampler=make_sampler(103)))


def test_user_batch_sampler_drawing_eagerly_in_iter():
    # EagerChunks draws at iter(), which torch does before the base seed: the order of the two draws is tested here.
    check(lambda: dict(batch_sampler=EagerChunks(103)))


def test_unbatched():
    check(lambda: dict(batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(9)), n=17)


@pytest.mark.parametrize("rank", [0, 1])
def test_distributed_sampler_set_epoch(rank):
    dataset = Indices(103)

    def run(runner, *args):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=11)
        return runner(dataset, dict(batch_size=4, sampler=sampler), *args, on_epoch=sampler.set_epoch)

    assert_same_run(run(plain_epochs), run(sliced_epochs, SERIAL))


def test_base_seed_draw_order_matches_torch():
    """A torch change to what iter(DataLoader) draws, or when, fails here first."""
    for gen in (None, torch.Generator()):
        def kwargs():
            if gen is not None:
                gen.manual_seed(21)
            torch.manual_seed(GLOBAL_SEED)
            return dict(batch_size=4, shuffle=True, generator=gen)

        it = iter(DataLoader(Indices(30), **kwargs()))
        after_iter = rng_state(gen)
        first = as_list(next(it))
        after_first = rng_state(gen)
        build = Recipe(Indices(30), kwargs())
        source = EpochSlicer(build.plain).epoch()
        assert all(torch.equal(a, b) for a, b in zip(after_iter, rng_state(gen)))
        part = source.take(2)
        loader = build.candidate(part, num_workers=0)
        assert loader.generator is not gen and loader.generator is not None
        assert as_list(next(iter(loader))) == first
        assert all(torch.equal(a, b) for a, b in zip(after_first, rng_state(gen)))
        part.delivered(1)


def test_worker_death_reissues_undelivered_batches():
    dataset, kwargs = DieInWorker(40, at=13), dict(batch_size=4)  # index 13 is in batch 3
    expected = [as_list(b) for b in DataLoader(Indices(40), **kwargs)]
    build = Recipe(dataset, kwargs)
    source, out = EpochSlicer(build.plain).epoch(), []
    part = source.take(None)
    it = iter(build.candidate(part, num_workers=2, prefetch_factor=2))
    message = None
    try:
        for batch in it:
            out.append(as_list(batch))
    except RuntimeError as err:  # torch words it by which of its checks saw the death first
        message = str(err)
        traceback.clear_frames(err.__traceback__)  # the iterator's frames: it must go with ``del it``
    assert message is not None and re.search("exited unexpectedly|killed by signal", message), message
    del it
    record = part.delivered(len(out))
    assert record.reissued >= 1 and record.start == 0
    rest = source.take(None)
    out += [as_list(b) for b in build.candidate(rest, num_workers=0)]
    last = rest.delivered(len(out) - record.delivered)
    assert out == expected and source.done
    assert (record.number, last.number, last.delivered) == (0, 1, len(expected) - record.delivered)


def test_persistent_workers_reuse_one_slice_across_slices_and_epochs():
    g = torch.Generator()
    make = lambda: dict(batch_size=4, shuffle=True, generator=g.manual_seed(3))  # noqa: E731
    dataset = Indices(50)
    plain = plain_epochs(dataset, make())
    torch.manual_seed(GLOBAL_SEED)
    assert_same_run(plain, persistent_epochs(Recipe(dataset, make()), g))


def persistent_epochs(build: Recipe, g: torch.Generator):
    """Slices 0 and 2 of every epoch share one persistent-worker DataLoader, and one BatchSlice rebound each time."""
    fast: Optional[BatchSlice] = None
    fast_loader = loader = None
    epochs, states = [], []
    slicer = EpochSlicer(build.plain)
    try:
        for _ in range(EPOCHS):
            source, out, records = slicer.epoch(), [], []
            for limit, use_fast, stop in ((5, True, 2), (3, False, None), (None, True, None)):
                if use_fast:
                    fast = source.take(limit, reuse=fast)
                    if fast_loader is None:
                        fast_loader = build.candidate(fast, 2, 2, persistent_workers=True)
                    part, loader = fast, fast_loader
                else:
                    part = source.take(limit)
                    loader = build.candidate(part, num_workers=0)
                got = 0
                for batch in loader:  # the persistent iterator lives on after a break; the next iter() resets it
                    out.append(as_list(batch))
                    got += 1
                    if got == stop:
                        break
                records.append(part.delivered(got))
            assert source.done and records[0].reissued == 3
            epochs.append(out)
            states.append(rng_state(g))
    finally:
        fast_loader = loader = None  # its persistent workers go with it, even when the test fails
        gc.collect()
    return epochs, states


def test_lazy_and_lengths():
    sampler = CountingSampler(1000)
    build = Recipe(Indices(1000), dict(batch_size=10, sampler=sampler, drop_last=True))
    slicer = EpochSlicer(build.plain)
    assert slicer.reference is build.plain and slicer.index_sampler is build.plain.batch_sampler
    assert len(slicer) == len(DataLoader(Indices(1000), batch_size=10, drop_last=True)) == 100
    source = slicer.epoch()
    assert len(source) == 100 and source.remaining == 100 and sampler.pulled == 0
    part = source.take(3)
    loader = build.candidate(part, num_workers=0)
    assert len(part) == len(loader) == 3
    assert [as_list(b)[0] for b in loader] == [0, 10, 20] and sampler.pulled == 30
    part.delivered(2)  # the loop got 2: batch [20..29] is re-issued first
    rest = source.take(500)
    assert len(rest) == 98 and source.remaining == 98
    assert as_list(next(iter(build.candidate(rest, num_workers=0))))[0] == 20 and sampler.pulled == 30
    rest.delivered(1)
    assert not source.done and source.position == 3


def test_misuse_says_the_fix():
    with pytest.raises(ValueError, match="IterableDataset cannot be sliced"):
        EpochSlicer(DataLoader(Stream()))
    build = Recipe(Indices(8), dict(batch_size=2))
    slicer = EpochSlicer(build.plain)
    source = slicer.epoch()
    with pytest.raises(ValueError, match="limit must be >= 0"):
        source.take(-1)
    part = source.take(2)
    with pytest.raises(RuntimeError, match="still open"):
        source.take(1)
    with pytest.raises(ValueError, match="in_flight must be an int >= 0"):
        part.expect(-1)
    it = iter(build.candidate(part, num_workers=0))
    next(it)
    with pytest.raises(RuntimeError, match="call expect"):
        part.expect(4)
    with pytest.raises(ValueError, match="handed out only 1"):
        part.delivered(2)
    part.delivered(1)
    with pytest.raises(RuntimeError, match="already closed"):
        part.delivered(1)
    with pytest.raises(RuntimeError, match="closed by delivered"):
        next(it)
    for unbound in (BatchSlice().sampling, BatchSlice().private_generator):
        with pytest.raises(RuntimeError, match="not bound"):
            unbound()
    assert list(BatchSampler(SequentialSampler(range(8)), 2, False))[1] == as_list(
        next(iter(build.candidate(source.take(None), num_workers=0))))


def test_skip_fast_forwards_a_fresh_epoch_by_index_only():
    plain = DataLoader(range(23), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(1))
    whole = [b.tolist() for b in DataLoader(range(23), batch_size=5, shuffle=True,
                                            generator=torch.Generator().manual_seed(1))]
    source = EpochSlicer(plain).epoch()
    source.skip(2)
    assert source.position == 2 and source.remaining == 3
    part = source.take(None)
    assert [b.tolist() for b in DataLoader(range(23), **part.sampling())] == whole[2:]
    part.delivered(3)
    assert source.done
    with pytest.raises(RuntimeError, match="fresh epoch"):
        source.skip(1)
    with pytest.raises(ValueError, match="has only 5 batches"):
        EpochSlicer(plain).epoch().skip(6)
    with pytest.raises(ValueError, match="int >= 0"):
        EpochSlicer(plain).epoch().skip(-1)


# ------------------------------------------------------------------ two open slices (a hidden switch)

def hidden_switch_epoch(build: Recipe, slicer: EpochSlicer, *, first_workers: int, extra: int,
                        fail_in_tail: bool = False) -> Tuple[List[Any], EpochSource]:
    """An epoch as online tuning's hidden switch serves it (NOTE [ Hidden switch ] in tuning/handover.py): the first
    candidate hands out 3 batches, is capped (its in-flight batches and ``extra`` more), the second one is started
    before the first serves its tail; ``fail_in_tail``: the first stops after one tail batch (its workers died), so
    the second is stopped unused and both give batches back, the later slice first."""
    source, out = slicer.epoch(), []
    first = source.take(None)
    it = iter(build.candidate(first, first_workers))
    out += [as_list(next(it)) for _ in range(3)]
    limit = first.cap(extra)
    assert limit == first.pulled + extra, "the extra batches are reserved at once"
    second = source.take(None)
    second_it = iter(build.candidate(second, 2))  # starts its workers: they pull batches after the first's tail
    assert second.pulled == 4 and len(second) == len(source) - limit
    if fail_in_tail:
        out.append(as_list(next(it)))
        del it, second_it
        with pytest.raises(RuntimeError, match="close the later slice first"):
            first.delivered(4)
        second.delivered(0)
        first.delivered(4)
        rest = source.take(None)
        out += [as_list(b) for b in build.candidate(rest, 0)]
        rest.delivered(len(out) - 4)
    else:
        out += [as_list(b) for b in it]  # the tail, to its end: the capped slice ends the DataLoader
        assert len(out) == limit
        with pytest.raises(RuntimeError, match="taken before it"):
            second.delivered(1)
        first.delivered(limit)
        out += [as_list(b) for b in second_it]
        second.delivered(len(out) - limit)
    assert source.done
    return out, source


@pytest.mark.parametrize("first_workers, extra", [(0, 2), (2, 0), (2, 3)])
@pytest.mark.parametrize("fail_in_tail", [False, True], ids=["tail-served", "tail-failed"])
def test_a_capped_slice_serves_its_tail_while_the_next_one_prefetches(first_workers, extra, fail_in_tail):
    g = torch.Generator()
    make = lambda: dict(batch_size=3, shuffle=True, generator=g.manual_seed(9))  # noqa: E731
    dataset = Indices(61)
    expected, _ = plain_epochs(dataset, make())
    torch.manual_seed(GLOBAL_SEED)
    build = Recipe(dataset, make())
    slicer = EpochSlicer(build.plain)
    for e in range(EPOCHS):
        out, source = hidden_switch_epoch(build, slicer, first_workers=first_workers, extra=extra,
                                          fail_in_tail=fail_in_tail)
        assert out == expected[e], f"epoch {e}"
        assert source.position == len(out)


def test_cap_and_take_errors():
    build = Recipe(Indices(40), dict(batch_size=4))
    source = EpochSlicer(build.plain).epoch()
    part = source.take(None)
    with pytest.raises(RuntimeError, match="still open"):
        source.take(None)
    with pytest.raises(ValueError, match="extra must be an int >= 0"):
        part.cap(-1)
    assert part.cap(100) == 10 and source.unclaimed == 0, "a cap reserves no more than the epoch holds"
    last = source.take(None)
    assert len(last) == 0 and last.limit is None
    last.delivered(0)
    part.delivered(0)
    with pytest.raises(RuntimeError, match="cap\\(\\) a slice whose DataLoader is still iterating"):
        part.cap(0)
    rest = source.take(None)
    assert [as_list(b) for b in build.candidate(rest, 0)][0] == [0, 1, 2, 3], "all given back, in order"
    rest.delivered(10)
    assert source.done


# ---------------------------------------------------------------- a BatchSlice by hand

def sequential_source(n: int = 10, batch: int = 2) -> EpochSource:
    return EpochSource(BatchSampler(SequentialSampler(range(n)), batch, drop_last=False))


def firsts(batches) -> list:
    return [b[0] for b in batches]


def test_a_slice_hands_out_at_most_its_limit_and_gives_back_what_was_not_delivered():
    source = sequential_source()
    part = source.take(3)
    assert len(part) == 3 and firsts(part) == [0, 2, 4]
    record = part.delivered(1)
    assert record == SliceRecord(number=0, start=0, limit=3, pulled=3, delivered=1) and record.reissued == 2
    rest = source.take(None)
    assert rest.number == 1 and len(rest) == 4 and firsts(rest) == [2, 4, 6, 8], "given back first, in order"
    rest.delivered(4)
    assert source.done and source.position == 5


def test_a_slice_keeps_only_its_lookahead_and_says_so_when_more_went_undelivered():
    part = sequential_source().take(None)
    part.expect(0)  # keeps the last 2
    pulled = list(part)
    assert len(pulled) == 5
    with pytest.raises(RuntimeError, match="kept only its last 2 batches but 4 are undelivered"):
        part.delivered(1)
    part.delivered(3)


def test_cap_reserves_the_tail_so_the_next_slice_starts_after_it():
    source = sequential_source()
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
    source = sequential_source()
    part = source.take(2)
    part.through = lambda batch: ("seen", batch)
    assert list(part) == [("seen", [0, 1]), ("seen", [2, 3])]
    part.delivered(0)
    assert list(source.take(1)) == [[0, 1]]


def test_the_dataloader_arguments_follow_the_epochs_batching():
    part = sequential_source().take(None)
    assert part.sampling() == {"batch_sampler": part}
    unbatched = EpochSource(SequentialSampler(range(4)), batched=False).take(None)
    assert unbatched.sampling() == {"sampler": unbatched, "batch_size": None}


def test_each_slice_has_a_private_generator_of_its_own_that_leaves_the_users_rng():
    source = sequential_source()
    first = source.take(1)
    state = torch.get_rng_state()
    draw = torch.rand(3, generator=first.private_generator()).tolist()
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.rand(3, generator=first.private_generator()).tolist() == draw, "the same slice, the same seed"
    list(first)
    first.delivered(1)
    assert torch.rand(3, generator=source.take(1).private_generator()).tolist() != draw


def test_a_reused_slice_is_bound_again_and_its_old_iterator_refused():
    source = sequential_source()
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


@pytest.mark.parametrize("limit, start", [(None, 0), (None, 3), (4, 0), (20, 5)])
def test_a_slice_is_drawn_out_once_its_dataloader_pulled_every_batch_it_may_hand_out(limit, start):
    """``drawn_all`` (NOTE [ Trial timing ], 6. in measure/run.py): after the last batch the slice may hand out (its
    limit, or the epoch's end) was pulled, not before; never for a sampler without a len()."""
    loader = DataLoader(list(range(20)), batch_size=2)
    source = EpochSlicer(loader).epoch()
    if start:
        first = source.take(start)
        assert len(list(first)) == start
        first.delivered(start)
    part = source.take(limit)
    may = len(part)
    assert may == min(limit or 10, 10 - start)
    pulled = []
    assert not part.drawn_all
    for batch in part:
        pulled.append(batch)
        assert part.drawn_all == (len(pulled) == may), f"{len(pulled)} of {may} pulled"
    assert len(pulled) == may and part.drawn_all
    unsized = EpochSlicer(DataLoader(list(range(6)), batch_size=2, sampler=_Unsized(6))).epoch().take(None)
    assert len(list(unsized)) == 3 and not unsized.drawn_all, "no len(): never known"


class _Unsized(torch.utils.data.Sampler):
    """``range(n)`` without a len()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))
