"""Contracts (b) and (c), README "What epoch 1 does and costs" and "Checkpoint and resume": tuning is invisible to the training loop.
(b) Every epoch of a loader tuned online (candidates switching mid-epoch), or made after trials, yields the batches the
plain DataLoader with the same sampling arguments yields, and the loop's draws match. (c) ``make_loader`` and
``tune`` leave every RNG as they found it (torch's, Python's, numpy's, the generators, the samplers' own states), also
when the step draws; and after every epoch the RNGs are where the plain DataLoader's epoch leaves them."""
from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from autoloader import make_loader, tune
from contracts import Data, Mode, Record, agree, build, closed, compare, datas, seed_all
from helpers import wait_no_children

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning", "ignore::UserWarning")


def rng_states(loader) -> dict:
    """Every RNG state that decides ``loader``'s epochs and the loop's draws, as plain values (read here, not with
    autoloader's own code)."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    found = {"torch": torch.get_rng_state().tolist(), "python": random.getstate(),
             "numpy": [v.tolist() if isinstance(v, np.ndarray) else v for v in np.random.get_state()]}
    for role, part in (("loader", loader), ("sampler", sampler), ("batch_sampler", batch_sampler),
                       ("inner", getattr(batch_sampler, "sampler", None))):
        gen = getattr(part, "generator", None)
        if isinstance(gen, torch.Generator):
            found[f"{role}.generator"] = gen.get_state().tolist()
        if callable(getattr(part, "state_dict", None)) and role != "loader":
            found[f"{role}.state_dict"] = part.state_dict()
    return found


def epochs(loader, count: int, *, set_epoch: bool = False):
    """``count`` epochs of the loop, the RNG states after each (those of the DataLoader in force, for a tuned one).
    ``set_epoch``: call it on the sampler first, as a loop over a plain DataLoader should (a PrefetchLoader advances
    a sampler's epoch itself when nobody did: README, Integrations, "torchrun")."""
    record, states = Record(), []
    for epoch in range(count):
        if set_epoch and callable(getattr(loader.sampler, "set_epoch", None)):
            loader.sampler.set_epoch(epoch)
        record.epoch()
        for batch in loader:
            record.add(batch)
        states.append(rng_states(getattr(loader, "loader", loader)))
    return record, states


def plain(data: Data) -> DataLoader:
    """The plain DataLoader with ``data``'s sampling arguments (no workers), not wrapped."""
    return build(data, Mode("plain", 0)).loader


@given(st.data())
def test_tuned_epochs_are_the_plain_dataloaders(draw):
    data = draw.draw(datas(streams=False, private=False), label="data")
    mode = draw.draw(st.sampled_from([Mode("online", None), Mode("online", None, threads=2), Mode("trials", None),
                                      Mode("trials", 2, persistent=True)]), label="mode")
    check_tuned(data, mode, draw.draw(st.integers(1, 3), label="epochs"))


def check_tuned(data: Data, mode: Mode, count: int) -> None:
    seed_all(data.seed)
    reference = plain(data)
    want, want_states = epochs(reference, count, set_epoch=True)
    seed_all(data.seed)
    loader = build(data, mode)
    try:
        got, got_states = epochs(loader, count)
    finally:
        closed(loader)
    parts = agree(data, mode, Mode("plain", 0))
    compare(got, want, parts, f"{data} tuned as {mode}")
    if parts["draws"]:
        for epoch, (mine, theirs) in enumerate(zip(got_states, want_states)):
            assert mine == theirs, f"RNG states differ after epoch {epoch}: {data} tuned as {mode}"
    assert wait_no_children() == []


def drawing_step(batch) -> None:
    """A step that draws, as dropout and augmentation on the device do."""
    torch.rand(3)
    random.random()
    np.random.rand()


@given(st.data())
def test_tuning_leaves_every_rng_as_it_found_it(draw):
    data = draw.draw(datas(streams=False, private=False), label="data")
    how = draw.draw(st.sampled_from(["make_loader", "tune"]), label="how")
    seed_all(data.seed)
    loader = build(data, Mode("plain", 0))  # the user's objects: its sampler, generator
    before = rng_states(loader.loader)
    user = loader.loader
    if data.sampler in ("batch-sampler", "chunks"):
        batch_size, kwargs = 1, {"batch_sampler": user.batch_sampler}
    else:
        batch_size, kwargs = data.batch_size, {"sampler": user.sampler, "drop_last": user.drop_last}
    if user.generator is not None:
        kwargs["generator"] = user.generator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "tune":
            tune(user.dataset, batch_size, step=drawing_step, budget=0.6, max_workers=2, **kwargs)
        else:
            closed(make_loader(user.dataset, batch_size, step=drawing_step, tuning="trials", budget=0.6,
                               max_workers=2, cache=False, **kwargs))
    assert rng_states(loader.loader) == before, f"{how} moved an RNG: {data}"
    closed(loader)
    assert wait_no_children() == []
