"""Walking nested batches (autoloader.loader.batch): map_tensors, iter_tensors, batch_nbytes."""
from __future__ import annotations

import collections
import collections.abc
from types import MappingProxyType

import torch

from autoloader.loader.batch import batch_nbytes, iter_tensors, map_tensors

Pair = collections.namedtuple("Pair", ["left", "right"])


def test_map_tensors_keeps_structure_and_passes_other_objects():
    t = torch.ones(2)
    batch = {"a": Pair(t, [t, "s", 3]), "b": (t, None), "c": collections.OrderedDict(z=t)}
    out = map_tensors(lambda x: x * 2, batch)
    assert type(out["a"]) is Pair and type(out["c"]) is collections.OrderedDict
    assert out["a"].right[1:] == ["s", 3] and out["b"][1] is None
    assert all(torch.equal(x, t * 2) for x in iter_tensors(out))
    assert len(list(iter_tensors(out))) == 4
    assert map_tensors(lambda x: x, "plain") == "plain"


def test_map_tensors_rebuilds_mappings():
    t = torch.zeros(1)
    factory = collections.defaultdict(list, a=t)
    out = map_tensors(lambda x: x + 1, factory)
    assert type(out) is collections.defaultdict and out.default_factory is list and out["a"].item() == 1
    proxy = map_tensors(lambda x: x + 1, MappingProxyType({"a": t}))
    assert type(proxy) is MappingProxyType and proxy["a"].item() == 1
    odd = map_tensors(lambda x: x + 1, Frozen("label", {"a": t}))
    assert type(odd) is dict and odd["a"].item() == 1


class Frozen(collections.abc.Mapping):
    """A read-only mapping whose constructor does not take a dict alone."""

    def __init__(self, name, data):
        self.name, self.data = name, dict(data)

    def __getitem__(self, key):
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def test_batch_nbytes():
    batch = (torch.zeros(4, dtype=torch.float32), {"b": torch.zeros(3, dtype=torch.uint8)}, "x")
    assert batch_nbytes(batch) == 4 * 4 + 3
    assert batch_nbytes("nothing") == 0
