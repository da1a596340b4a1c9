"""What Ray's worker processes run (autoloader/ray/work.py): ``load_block`` reads its positions of the run's chunk and
returns the batches a plain DataLoader yields for them, a batch that raised as its exception with the rest of the
block loaded; ``kept`` keeps the last ``KEEP`` objects a process was sent, fetching one from Ray only the first time;
a module missing on the worker is ``MissingModule``, naming it and the fix. No Ray needed: kept objects are never
fetched, and a stand-in ``ray`` module counts the fetches of the others (the real ``ray.get`` is in
tests/integrations/test_ray_engine.py). ``fetch`` itself is checked against torch's fetcher in test_make.py."""
import pickle
import sys
import types

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader.ray import work
from autoloader.ray.order import chunk_of

pytest.importorskip("pyarrow", reason="pyarrow comes with Ray Data: pip install '.[ray]'")

from autoloader.ray.transport import Failure, unpack  # noqa: E402


class Squares(Dataset):
    def __init__(self, bad=None):
        self.bad = bad

    def __len__(self):
        return 11

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"sample {i}")
        return {"x": torch.tensor([i * i]), "i": i}


class Ref:
    """What ``kept`` reads of a Ray ``ObjectRef``: its ``hex()``."""

    def __init__(self, key):
        self.key = key

    def hex(self):
        return self.key


@pytest.fixture(autouse=True)
def fresh_kept():
    saved = work._KEPT.copy()
    work._KEPT.clear()
    yield work._KEPT
    work._KEPT.clear()
    work._KEPT.update(saved)


@pytest.fixture
def stand_in_ray(monkeypatch):
    """A ``ray`` module whose ``get`` hands out the values of ``store`` (raising an exception it holds) and records
    each key asked."""
    module = types.ModuleType("ray")
    module.store, module.asked = {}, []

    def get(ref):
        module.asked.append(ref.hex())
        value = module.store[ref.hex()]
        if isinstance(value, BaseException):
            raise value
        return value

    module.get = get
    module.get_runtime_context = lambda: types.SimpleNamespace(get_node_id=lambda: "n1")
    monkeypatch.setitem(sys.modules, "ray", module)
    return module


@pytest.mark.parametrize("batch_size", [4, None])
def test_a_block_is_the_plain_dataloaders_batches_at_its_positions(batch_size, fresh_kept):
    dataset = Squares()
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(5))
    batched = plain.batch_sampler is not None
    indices = list(plain.batch_sampler if batched else plain.sampler)
    fresh_kept["p"] = (dataset, plain.collate_fn)
    fresh_kept["c"] = chunk_of(indices, start=3, batched=batched).batches()
    (table,) = list(work.load_block(Ref("p"), Ref("c"), 4, 3 + len(indices), batched))
    got = list(unpack(table))
    assert [pos for pos, _ in got] == list(range(4, 3 + len(indices)))
    same = DataLoader(dataset, batch_sampler=indices) if batched else DataLoader(dataset, None, sampler=indices)
    want = list(same)[1:]  # a plain DataLoader over those very indices, from the block's first position
    assert repr([batch for _, batch in got]) == repr(want)


def test_a_batch_that_raises_is_its_exception_and_the_rest_of_the_block_is_loaded(fresh_kept):
    dataset = Squares(bad=5)
    fresh_kept["p"] = (dataset, DataLoader(dataset).collate_fn)
    fresh_kept["c"] = chunk_of([[4], [5], [6]], start=0, batched=True).batches()
    (table,) = list(work.load_block(Ref("p"), Ref("c"), 0, 3, True))
    (_, first), (_, failed), (_, last) = list(unpack(table))
    assert first["i"].tolist() == [4] and last["i"].tolist() == [6]
    assert isinstance(failed, Failure) and isinstance(failed.error, KeyError) and "sample 5" in failed.message
    assert "__getitem__" in failed.traceback


def test_a_kept_object_is_never_fetched_again(fresh_kept, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # importing ray now fails: a kept object must not need it
    value = (Squares(), None)
    fresh_kept["a"] = value
    fresh_kept["b"] = ("other", None)
    assert work.kept(Ref("a")) is value
    assert list(fresh_kept) == ["b", "a"], "the object used last is the last evicted"


def test_a_process_keeps_the_last_KEEP_objects_it_used_and_a_chunk_as_its_reader(stand_in_ray, fresh_kept):
    keys = [f"k{n}" for n in range(work.KEEP + 1)]
    stand_in_ray.store.update({key: (key, None) for key in keys})
    for key in keys[:work.KEEP]:
        assert work.kept(Ref(key)) == (key, None)
    assert work.kept(Ref(keys[0])) == (keys[0], None)  # kept: used again, so the most recent
    assert stand_in_ray.asked == keys[:work.KEEP]
    work.kept(Ref(keys[-1]))  # one more than KEEP: the least recently used goes
    assert len(fresh_kept) == work.KEEP and list(fresh_kept)[-2:] == [keys[0], keys[-1]]
    assert keys[1] not in fresh_kept
    work.kept(Ref(keys[1]))
    assert stand_in_ray.asked == keys[:work.KEEP] + [keys[-1], keys[1]], "an evicted object is fetched again"
    stand_in_ray.store["chunk"] = chunk_of([["a"], ["b"]], start=0, batched=True)
    assert work.kept(Ref("chunk")).read(1) == ["b"], "a chunk is kept as its reader: unpickled once"


def test_a_module_missing_on_the_worker_is_named_with_the_fix_and_travels_as_itself(stand_in_ray):
    system_error = type("RaySystemError", (Exception,), {"__module__": "ray.exceptions"})
    stand_in_ray.store["p"] = system_error("System error: No module named 'mydata'\ntraceback: ...")
    with pytest.raises(work.MissingModule) as info:
        work.kept(Ref("p"))
    message = str(info.value)
    assert info.value.module == "mydata" and "on node n1 cannot import the module 'mydata'" in message
    assert "Install it on every node" in message and "runtime_env={'py_modules'" in message
    assert isinstance(info.value, ImportError)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is work.MissingModule and str(again) == message
    stand_in_ray.store["q"] = system_error("System error: disk full")
    with pytest.raises(system_error):
        work.kept(Ref("q"))
