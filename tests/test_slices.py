"""Epoch slices (autoloader/slices.py): a sequence of candidate DataLoaders yields exactly a plain DataLoader's epochs.

Every test compares against a plain ``DataLoader`` built with the same arguments and seeds, over 3 epochs, and checks
the user's generator and the global RNG end each epoch in the same state.
"""
from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, SequentialSampler, SubsetRandomSampler,
                              WeightedRandomSampler)

from autoloader.slices import BatchSlice, EpochSlicer, EpochSource
from slice_data import CountingSampler, DieInWorker, EagerChunks, Indices, Stream

EPOCHS = 3
GLOBAL_SEED = 1234
Step = Tuple[Optional[int], int, Optional[int]]  # (slice limit, num_workers, stop after this many batches)
SERIAL: Sequence[Step] = ((3, 0, None), (5, 0, 2), (0, 0, None), (1, 0, None), (None, 0, None))
# 2 workers x prefetch 2 pull 4 batches at iter() and one more per batch yielded: stopped after 1, the candidate
# re-issues 4; the next one pulls 2 of those and is stopped before its first batch (as when its workers die at
# start): they go back in front of the other two.
MIXED: Sequence[Step] = ((2, 0, None), (6, 2, 1), (2, 2, 0), (4, 0, None), (None, 2, None))


def as_list(batch: Any) -> Any:
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


def rng_state(generator: Optional[torch.Generator]) -> List[torch.Tensor]:
    return [torch.get_rng_state()] + ([generator.get_state()] if generator is not None else [])


def plain_epochs(dataset, kwargs: Dict[str, Any], on_epoch: Callable[[int], None] = lambda e: None):
    torch.manual_seed(GLOBAL_SEED)
    loader = DataLoader(dataset, **kwargs)
    epochs, states = [], []
    for e in range(EPOCHS):
        on_epoch(e)
        epochs.append([as_list(b) for b in loader])
        states.append(rng_state(kwargs.get("generator")))
    return epochs, states


def run_slices(slicer: EpochSlicer, plan: Sequence[Step]) -> Tuple[List[Any], EpochSource]:
    """One epoch served by the plan's candidates, the last one to the epoch's end."""
    source, out = slicer.epoch(), []
    for limit, workers, stop in plan:
        part = source.take(limit)
        loader = slicer.loader(part, num_workers=workers, prefetch_factor=2 if workers else None)
        it, got = iter(loader), 0
        try:
            while stop is None or got < stop:
                out.append(as_list(next(it)))
                got += 1
        except StopIteration:
            pass
        del it, loader  # shuts its workers down
        part.delivered(got)
    assert source.done
    return out, source


def sliced_epochs(dataset, kwargs: Dict[str, Any], plan: Sequence[Step],
                  on_epoch: Callable[[int], None] = lambda e: None):
    torch.manual_seed(GLOBAL_SEED)
    slicer = EpochSlicer(dataset, **kwargs)
    epochs, states, reissued = [], [], []
    for e in range(EPOCHS):
        on_epoch(e)
        out, source = run_slices(slicer, plan)
        assert source.position == len(out) and [r.number for r in source.slices] == list(range(len(plan)))
        epochs.append(out)
        states.append(rng_state(kwargs.get("generator")))
        reissued.append([r.reissued for r in source.slices])
    return epochs, states, reissued


def assert_same_run(plain, sliced) -> None:
    (p_epochs, p_states), (s_epochs, s_states) = plain, sliced[:2]
    for e in range(EPOCHS):
        assert s_epochs[e] == p_epochs[e], f"epoch {e} differs"
        for p, s in zip(p_states[e], s_states[e]):
            assert torch.equal(p, s), f"RNG state after epoch {e} differs"
    assert p_epochs[0] != p_epochs[1] or not any(isinstance(x, list) for x in p_epochs[0])


def check(make_kwargs: Callable[[], Dict[str, Any]], plan: Sequence[Step] = SERIAL, n: int = 103,
          **worker_args: Any) -> List[List[int]]:
    """Returns each epoch's re-issued count per slice. ``worker_args``: the user's arguments that a plain loader
    without workers rejects; only the slicer gets them."""
    dataset = Indices(n)
    plain = plain_epochs(dataset, make_kwargs())
    sliced = sliced_epochs(dataset, dict(make_kwargs(), **worker_args), plan)
    assert_same_run(plain, sliced)
    return sliced[2]


@pytest.mark.parametrize("drop_last", [False, True])
def test_shuffle_with_generator_ragged_last_batch(drop_last):
    check(lambda: dict(batch_size=4, shuffle=True, drop_last=drop_last, generator=torch.Generator().manual_seed(7)))


def test_shuffle_global_rng_with_workers_pulling_ahead():
    # 2 workers x prefetch 2 pull 4 batches at iter(); the candidate stopped after 1 re-issues 3. Worker-only user
    # arguments are dropped for 0-worker candidates; in_order=False is overridden.
    reissued = check(lambda: dict(batch_size=4, shuffle=True, in_order=False), plan=MIXED, timeout=30)
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
        slicer = EpochSlicer(Indices(30), **kwargs())
        source = slicer.epoch()
        assert all(torch.equal(a, b) for a, b in zip(after_iter, rng_state(gen)))
        part = source.take(2)
        loader = slicer.loader(part, num_workers=0)
        assert loader.generator is not gen and loader.generator is not None
        assert as_list(next(iter(loader))) == first
        assert all(torch.equal(a, b) for a, b in zip(after_first, rng_state(gen)))
        part.delivered(1)


def test_worker_death_reissues_undelivered_batches():
    dataset, kwargs = DieInWorker(40, at=13), dict(batch_size=4)  # index 13 is in batch 3
    expected = [as_list(b) for b in DataLoader(Indices(40), **kwargs)]
    slicer = EpochSlicer(dataset, **kwargs)
    source, out = slicer.epoch(), []
    part = source.take(None)
    it = iter(slicer.loader(part, num_workers=2, prefetch_factor=2))
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        for batch in it:
            out.append(as_list(batch))
    del it
    record = part.delivered(len(out))
    assert record.reissued >= 1 and record.start == 0
    rest = source.take(None)
    out += [as_list(b) for b in slicer.loader(rest, num_workers=0)]
    rest.delivered(len(out) - record.delivered)
    assert out == expected and source.done
    assert [r.delivered for r in source.slices] == [record.delivered, len(expected) - record.delivered]


def test_persistent_workers_reuse_one_slice_across_slices_and_epochs():
    g = torch.Generator()
    make = lambda: dict(batch_size=4, shuffle=True, generator=g.manual_seed(3))  # noqa: E731
    dataset = Indices(50)
    plain = plain_epochs(dataset, make())
    torch.manual_seed(GLOBAL_SEED)
    assert_same_run(plain, persistent_epochs(EpochSlicer(dataset, persistent_workers=True, **make()), g))


def persistent_epochs(slicer: EpochSlicer, g: torch.Generator):
    """Slices 0 and 2 of every epoch share one persistent-worker DataLoader, and one BatchSlice rebound each time."""
    fast: Optional[BatchSlice] = None
    fast_loader = loader = None
    epochs, states = [], []
    try:
        for _ in range(EPOCHS):
            source, out = slicer.epoch(), []
            for limit, use_fast, stop in ((5, True, 2), (3, False, None), (None, True, None)):
                if use_fast:
                    fast = source.take(limit, reuse=fast)
                    if fast_loader is None:
                        fast_loader = slicer.loader(fast, num_workers=2, prefetch_factor=2)
                    part, loader = fast, fast_loader
                else:
                    part = source.take(limit)
                    loader = slicer.loader(part, num_workers=0)
                got = 0
                for batch in loader:  # the persistent iterator lives on after a break; the next iter() resets it
                    out.append(as_list(batch))
                    got += 1
                    if got == stop:
                        break
                part.delivered(got)
            assert source.done and source.slices[0].reissued == 3
            epochs.append(out)
            states.append(rng_state(g))
    finally:
        fast_loader = loader = None  # its persistent workers go with it, even when the test fails
        gc.collect()
    return epochs, states


def test_lazy_and_lengths():
    sampler = CountingSampler(1000)
    slicer = EpochSlicer(Indices(1000), batch_size=10, sampler=sampler, drop_last=True)
    assert len(slicer) == len(DataLoader(Indices(1000), batch_size=10, drop_last=True)) == 100
    source = slicer.epoch()
    assert len(source) == 100 and source.remaining == 100 and sampler.pulled == 0
    part = source.take(3)
    loader = slicer.loader(part, num_workers=0)
    assert len(part) == len(loader) == 3
    assert [as_list(b)[0] for b in loader] == [0, 10, 20] and sampler.pulled == 30
    part.delivered(2)  # the loop got 2: batch [20..29] is re-issued first
    rest = source.take(500)
    assert len(rest) == 98 and source.remaining == 98
    assert as_list(next(iter(slicer.loader(rest, num_workers=0))))[0] == 20 and sampler.pulled == 30
    rest.delivered(1)
    assert not source.done and source.position == 3


def test_misuse_says_the_fix():
    with pytest.raises(ValueError, match="IterableDataset cannot be sliced"):
        EpochSlicer(Stream())
    with pytest.raises(TypeError, match="not DataLoader arguments"):
        EpochSlicer(Indices(4), batchsize=2)
    slicer = EpochSlicer(Indices(8), batch_size=2)
    source = slicer.epoch()
    part = source.take(2)
    with pytest.raises(RuntimeError, match="still open"):
        source.take(1)
    it = iter(slicer.loader(part, num_workers=0))
    next(it)
    with pytest.raises(ValueError, match="handed out only 1"):
        part.delivered(2)
    part.delivered(1)
    with pytest.raises(RuntimeError, match="already closed"):
        part.delivered(1)
    with pytest.raises(RuntimeError, match="closed by delivered"):
        next(it)
    with pytest.raises(RuntimeError, match="not bound"):
        slicer.loader(BatchSlice(), num_workers=0)
    assert list(BatchSampler(SequentialSampler(range(8)), 2, False))[1] == as_list(
        next(iter(slicer.loader(source.take(None), num_workers=0))))
