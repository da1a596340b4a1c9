"""autoloader/loader/resume/rng.py: the random states that decide a loader's epochs, taken, put back, written as
JSON-safe text and read back; a damaged one refused with the place it is damaged."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from autoloader.loader.resume.rng import (Ambient, RngState, StateError, generators, parts_of, parts_of_kwargs,
                                          preserved, stateful_samplers)


def ambient_draws() -> tuple:
    return torch.rand(3).tolist(), [random.random() for _ in range(3)], np.random.rand(3).tolist()


class OwnState(torch.utils.data.Sampler):
    """A sampler whose order comes from its own ``random.Random``, saved by its ``state_dict()``."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, random.Random(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.rng.sample(range(self.n), self.n))

    def state_dict(self) -> dict:
        return {"state": list(self.rng.getstate()[1]), "version": 3}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate((state["version"], tuple(state["state"]), None))


def test_the_ambient_rngs_taken_and_put_back_draw_the_same_again():
    taken = Ambient.take()
    first = ambient_draws()
    taken.put()
    assert ambient_draws() == first


def test_the_ambient_rngs_survive_json_text():
    random.gauss(0, 1)  # a cached Gaussian is part of Python's state
    text = json.dumps(Ambient.take().to_json())
    first = ambient_draws()
    Ambient.from_json(json.loads(text), "state['now']['ambient']").put()
    assert ambient_draws() == first


def test_a_loaders_generators_are_taken_once_each_and_put_back():
    g = torch.Generator().manual_seed(3)
    loader = DataLoader(range(10), sampler=RandomSampler(range(10), generator=g), generator=g)
    parts = parts_of(loader)
    assert list(generators(parts)) == ["loader"], "one generator, under the first role holding it"
    state = RngState.take(parts, samplers=True)
    first = [list(loader.sampler)]
    torch.rand(2)
    state.put(parts)
    assert [list(loader.sampler)] == first


def test_a_samplers_own_state_dict_is_taken_and_loaded():
    sampler = OwnState(20, seed=1)
    parts = parts_of(DataLoader(range(20), sampler=sampler))
    assert list(stateful_samplers(parts)) == ["sampler"]
    state = RngState.take(parts, samplers=True)
    first = list(sampler)
    state.put(parts)
    assert list(sampler) == first
    without = RngState.take(parts, samplers=False)
    assert without.samplers is None
    second = list(sampler)
    without.put(parts)
    assert list(sampler) != second, "a state taken without the samplers' leaves their RNG where it is"


def test_a_whole_state_survives_json_text():
    g = torch.Generator().manual_seed(5)
    parts = parts_of(DataLoader(range(30), shuffle=True, generator=g))
    state = RngState.take(parts, samplers=True)
    first = torch.randperm(30, generator=g).tolist(), ambient_draws()
    back = RngState.from_json(json.loads(json.dumps(state.to_json())), "state['now']")
    back.put(parts)
    assert (torch.randperm(30, generator=g).tolist(), ambient_draws()) == first


def test_putting_a_generator_back_where_there_is_none_names_the_fix():
    state = RngState.take(parts_of(DataLoader(range(4), generator=torch.Generator())), samplers=True)
    with pytest.raises(ValueError, match="pass the same generator="):
        state.put(parts_of(DataLoader(range(4))))


def test_a_sampler_rejecting_its_saved_state_is_a_value_error_naming_the_fix():
    parts = parts_of(DataLoader(range(20), sampler=OwnState(20, seed=1)))
    state = RngState.take(parts, samplers=True)
    damaged = RngState(state.ambient, state.generators, {"sampler": {"version": 3}})
    with pytest.raises(ValueError, match="rejected its saved state .KeyError.*load the saved state unchanged"):
        damaged.put(parts)
    with pytest.raises(ValueError, match="has no load_state_dict"):
        state.put(parts_of(DataLoader(range(20))))


@pytest.mark.parametrize("damage, where", [
    (lambda s: s["generators"].update(loader="AAAA"), r"\['generators'\]\['loader'\] holds 3 bytes"),
    (lambda s: s["generators"].update(elsewhere=s["generators"]["loader"]), "names 'elsewhere'"),
    (lambda s: s["ambient"].update(torch="not base64!"), r"\['ambient'\]\['torch'\] is not base64"),
    (lambda s: s["ambient"]["numpy"].update(pos=10_000), r"\['numpy'\] is not a state of numpy"),
    (lambda s: s["ambient"]["python"].update(version=2), r"\['python'\] is not a state of Python"),
    (lambda s: s.pop("samplers"), "has no 'samplers'"),
])
def test_a_damaged_state_is_refused_with_where_it_is_damaged(damage, where):
    text = RngState.take(parts_of(DataLoader(range(4), generator=torch.Generator())), samplers=True).to_json()
    damage(text)
    with pytest.raises(StateError, match=where):
        RngState.from_json(text, "state['now']")


def test_preserved_leaves_every_state_as_it_found_it_however_the_block_ends():
    g = torch.Generator().manual_seed(9)
    parts = parts_of(DataLoader(range(10), shuffle=True, generator=g))
    before = RngState.take(parts, samplers=True)
    first = torch.randperm(10, generator=g).tolist(), ambient_draws()
    before.put(parts)
    with pytest.raises(KeyError):
        with preserved(parts):
            torch.randperm(10, generator=g)
            ambient_draws()
            raise KeyError("the block failed")
    assert (torch.randperm(10, generator=g).tolist(), ambient_draws()) == first


def test_keywords_not_yet_a_dataloader_hold_the_same_parts():
    g = torch.Generator()
    sampler = RandomSampler(range(5))
    kwargs = {"generator": g, "batch_sampler": torch.utils.data.BatchSampler(sampler, 2, False)}
    parts = parts_of_kwargs(kwargs)
    assert parts["sampler"] is None and parts["batch_sampler.sampler"] is sampler
    assert generators(parts) == {"loader": g}
