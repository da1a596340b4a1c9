"""Contract (d), README, Integrations, "torchrun": across the ranks of a job, every epoch serves each sample once (a
``DistributedSampler`` pads to equal shares, or drops the remainder with its ``drop_last``), whatever each rank's
configuration, and also when every rank was interrupted at its own batch and resumed with another configuration.
Ranks are simulated in one process: one loader per rank over ``DistributedSampler(num_replicas, rank)``."""
from __future__ import annotations

import collections
import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import build, closed, datas, modes, run, seed_all
from helpers import wait_no_children

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning", "ignore::UserWarning")


def served(data, saver, resumer, *, epoch: int, k: int) -> list:
    """The indices one rank serves in ``epoch``: ``k`` batches from ``saver``, then the rest from ``resumer`` after
    a checkpoint (``k`` past the epoch's end: no interruption)."""
    seed_all(data.seed)
    saving = build(data, saver)
    length = len(saving)
    before, state = run(saving, epoch + 1, stop=(epoch, k))
    closed(saving)
    if state is None:
        return [i for batch in before.indices[epoch] for i in batch]
    resumed = build(data, resumer)
    try:
        resumed.load_state_dict(state)
        rest, _ = run(resumed, 1)
    finally:
        closed(resumed)
    mine = before.indices[epoch] if epoch < len(before.indices) else []
    rest_of_epoch = rest.indices[0] if k < length else []  # saved after the last batch: the next pass is the next epoch
    return [i for batch in mine + rest_of_epoch for i in batch]


@given(st.data())
def test_every_sample_once_per_epoch_across_ranks(draw):
    data = draw.draw(datas(streams=False, private=False), label="data")
    world = draw.draw(st.integers(2, 3), label="world")
    sampler_drop = draw.draw(st.booleans(), label="sampler drop_last")
    data = dataclasses.replace(data, sampler="distributed", replicas=world, drop_last=False)
    epoch = draw.draw(st.integers(0, 1), label="epoch")
    counts: collections.Counter = collections.Counter()
    for rank in range(world):
        mine = dataclasses.replace(data, rank=rank)
        saver, resumer = draw.draw(modes(data=mine), label=f"saver {rank}"), draw.draw(modes(data=mine),
                                                                                          label=f"resumer {rank}")
        counts.update(served(_dropping(mine, sampler_drop), saver, resumer, epoch=epoch,
                             k=draw.draw(st.integers(0, 12), label=f"k {rank}")))
    n = data.n
    if sampler_drop:
        assert sum(counts.values()) == (n // world) * world and max(counts.values(), default=1) == 1, counts
    else:
        assert set(counts) == set(range(n)), f"samples missing: {sorted(set(range(n)) - set(counts))}"
        assert sum(counts.values()) == math.ceil(n / world) * world, counts
    assert wait_no_children() == []


def _dropping(data, sampler_drop: bool):
    """``data`` whose DistributedSampler drops the remainder (``drop_last`` on the sampler, not on the loader)."""
    return dataclasses.replace(data, sampler="distributed-drop") if sampler_drop else data
