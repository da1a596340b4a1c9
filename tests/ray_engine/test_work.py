"""What Ray's worker processes run (autoloader/ray/work.py): ``load_block`` turns rows (place, pickled indices) into
the pickled batches a plain DataLoader yields, and ``_payload`` keeps the last ``KEEP`` payloads a process was sent,
fetching one from Ray only the first time. No Ray needed: a payload already kept is never fetched, and a stand-in
``ray`` module counts the fetches of the others (the real ``ray.get`` is in tests/integrations/test_ray_engine.py).
``fetch`` itself is checked against torch's fetcher in test_make.py."""
import pickle
import sys
import types

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader.ray import work


class Squares(Dataset):
    def __len__(self):
        return 11

    def __getitem__(self, i):
        return {"x": torch.tensor([i * i]), "i": i}


class Ref:
    """What ``_payload`` reads of a Ray ``ObjectRef``: its ``hex()``."""

    def __init__(self, key):
        self.key = key

    def hex(self):
        return self.key


@pytest.fixture(autouse=True)
def fresh_payloads():
    saved = work._PAYLOADS.copy()
    work._PAYLOADS.clear()
    yield work._PAYLOADS
    work._PAYLOADS.clear()
    work._PAYLOADS.update(saved)


@pytest.fixture
def stand_in_ray(monkeypatch):
    """A ``ray`` module whose ``get`` hands out the values of ``store`` and records each key asked."""
    module = types.ModuleType("ray")
    module.store, module.asked = {}, []

    def get(ref):
        module.asked.append(ref.hex())
        return module.store[ref.hex()]

    module.get = get
    monkeypatch.setitem(sys.modules, "ray", module)
    return module


def _rows(batches):
    return {"pos": np.arange(3, 3 + len(batches)),
            "idx": np.array([pickle.dumps(b) for b in batches], dtype=object)}


@pytest.mark.parametrize("batch_size", [4, None])
def test_a_block_is_the_plain_dataloaders_batches_pickled_with_their_places(batch_size, fresh_payloads):
    dataset = Squares()
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(5))
    batched = plain.batch_sampler is not None
    indices = list(plain.batch_sampler if batched else plain.sampler)
    fresh_payloads["p"] = (dataset, plain.collate_fn)
    out = work.load_block(_rows(indices), Ref("p"), batched)
    assert out["pos"].tolist() == list(range(3, 3 + len(indices)))
    assert out["batch"].dtype == object and len(out["batch"]) == len(indices)
    got = [pickle.loads(raw) for raw in out["batch"]]
    same = DataLoader(dataset, batch_sampler=indices) if batched else DataLoader(dataset, None, sampler=indices)
    want = list(same)  # a plain DataLoader over those very indices
    assert len(want) == len(indices) and repr(got) == repr(want)


def test_a_kept_payload_is_never_fetched_again(fresh_payloads, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # importing ray now fails: a kept payload must not need it
    value = (Squares(), None)
    fresh_payloads["a"] = value
    fresh_payloads["b"] = ("other", None)
    assert work._payload(Ref("a")) is value
    assert list(fresh_payloads) == ["b", "a"], "the payload used last is the last evicted"


def test_a_process_keeps_the_last_KEEP_payloads_it_used(stand_in_ray, fresh_payloads):
    keys = [f"k{n}" for n in range(work.KEEP + 1)]
    stand_in_ray.store.update({key: (key, None) for key in keys})
    for key in keys[:work.KEEP]:
        assert work._payload(Ref(key)) == (key, None)
    assert work._payload(Ref(keys[0])) == (keys[0], None)  # kept: used again, so the most recent
    assert stand_in_ray.asked == keys[:work.KEEP]
    work._payload(Ref(keys[-1]))  # one more than KEEP: the least recently used goes
    assert len(fresh_payloads) == work.KEEP and list(fresh_payloads)[-2:] == [keys[0], keys[-1]]
    assert keys[1] not in fresh_payloads
    work._payload(Ref(keys[1]))
    assert stand_in_ray.asked == keys[:work.KEEP] + [keys[-1], keys[1]], "an evicted payload is fetched again"
