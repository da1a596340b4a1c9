"""Fingerprints and cache keys (autoloader.cache.fingerprint): what changes a key, what does not, and what reading a
dataset's fingerprint costs."""
from __future__ import annotations

import collections
import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, RandomSampler, SequentialSampler

from autoloader.cache.fingerprint import (
    KEY_FORMAT,
    batch_signature,
    cache_key,
    callable_identity,
    dataset_fingerprint,
    machine_fingerprint,
    same_batches,
    step_descriptor,
)

GiB = 2**30
Pair = collections.namedtuple("Pair", ["left", "right"])


# ---------------------------------------------------------------- helpers


class CountingDataset(Dataset):
    def __init__(self, n=100, shape=(3, 8, 8)):
        self.n, self.shape, self.calls, self.pids = n, shape, 0, []

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.calls += 1
        self.pids.append(os.getpid())
        return torch.zeros(self.shape), index % 10


class NestedDataset(Dataset):
    def __init__(self, shape=(4, 4), value=0.0):
        self.shape, self.value = shape, value

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return {
            "image": torch.full(self.shape, self.value),
            "pair": Pair(np.zeros((2,), dtype=np.int64), "some text %s" % self.value),
            "meta": [1, 2.5, None, b"raw"],
        }


class Stream(IterableDataset):
    def __init__(self, n=50):
        self.n, self.yielded, self.closed, self.worker_infos = n, 0, False, []

    def __iter__(self):
        self.worker_infos.append(torch.utils.data.get_worker_info())
        try:
            for i in range(self.n):
                self.yielded += 1
                yield torch.arange(3, dtype=torch.float64) + i
        finally:
            self.closed = True


class SizedStream(Stream):
    def __len__(self):
        return self.n


class RootDataset(CountingDataset):
    def __init__(self, root, **kwargs):
        super().__init__(**kwargs)
        self.root = root


class FakeImage:
    def __init__(self, size, mode):
        self.size, self.mode = size, mode


class BrokenDataset(Dataset):
    def __len__(self):
        return 3

    def __getitem__(self, index):
        raise RuntimeError("user dataset is broken")


def train_step(batch):
    return None


def other_step(batch):
    return None


def custom_collate(batch):
    return batch


def profile(**changes):
    """A duck-typed stand-in for probe.MachineProfile."""
    values = dict(model="Intel Xeon Gold 6338", usable=16, budget=int(22.6 * GiB), total=int(23.3 * GiB), limit=None,
                  gpus=("NVIDIA H100", "NVIDIA A100"), torch_version="2.3.0", hostname="node-01")
    values.update(changes)
    gpus = values["gpus"]
    if gpus is not None:
        gpus = tuple(SimpleNamespace(name=name, total_bytes=80 * GiB) for name in gpus)
    return SimpleNamespace(
        cpu=SimpleNamespace(usable=values["usable"], model=values["model"]),
        memory=SimpleNamespace(budget_bytes=values["budget"], total_bytes=values["total"],
                               limit_bytes=values["limit"]),
        gpus=gpus,
        torch_version=values["torch_version"],
        hostname=values["hostname"],
    )


def key_inputs(dataset=None, **changes):
    dataset = dataset if dataset is not None else CountingDataset()
    loader = dict(collate_fn=None, sampler=None, batch_sampler=None, drop_last=False)
    loader.update({k: changes.pop(k) for k in list(changes) if k in loader})
    inputs = dict(dataset_fp=dataset_fingerprint(dataset), batch_size=32, loader_kwargs=loader, step=None,
                  device_type="cuda", machine_fp=machine_fingerprint(profile()), extra=None)
    inputs.update(changes)
    return inputs


# ---------------------------------------------------------------- cache keys


@pytest.mark.parametrize("change", [
    dict(batch_size=64),
    dict(step=0.01),
    dict(step=train_step),
    dict(collate_fn=custom_collate),
    dict(sampler=RandomSampler(range(100))),
    dict(batch_sampler=BatchSampler(SequentialSampler(range(100)), 32, False)),
    dict(drop_last=True),
    dict(device_type="cpu"),
    dict(extra={"num_workers": 4}),
    dict(dataset_fp=dataset_fingerprint(CountingDataset(n=200))),
    dict(dataset_fp=dataset_fingerprint(CountingDataset(), key="imagenet-train")),
], ids=lambda c: next(iter(c)) + ":" + type(next(iter(c.values()))).__name__)
def test_key_changes_with_each_input(change):
    base = cache_key(**key_inputs())
    assert cache_key(**key_inputs(**change)) != base
    assert cache_key(**key_inputs(**change)) == cache_key(**key_inputs(**change))


def test_key_step_kinds_are_distinct():
    keys = {cache_key(**key_inputs(step=s)) for s in (None, 0.01, 0.02, train_step, other_step)}
    assert len(keys) == 5
    assert cache_key(**key_inputs(step=1)) == cache_key(**key_inputs(step=1.0))


def test_key_sampler_identity_is_its_class_not_the_instance():
    first = cache_key(**key_inputs(sampler=SequentialSampler(range(100))))
    assert first == cache_key(**key_inputs(sampler=SequentialSampler(range(100))))
    assert first != cache_key(**key_inputs(sampler=RandomSampler(range(100))))


def test_key_user_key_replaces_the_dataset():
    named_a = cache_key(**key_inputs(dataset_fp=dataset_fingerprint(CountingDataset(n=10), key="a")))
    assert named_a == cache_key(**key_inputs(dataset_fp=dataset_fingerprint(CountingDataset(n=99), key="a")))
    assert named_a != cache_key(**key_inputs(dataset_fp=dataset_fingerprint(CountingDataset(n=10), key="b")))


def test_key_is_hex_and_rejects_non_json_extra():
    key = cache_key(**key_inputs())
    assert len(key) == 32 and int(key, 16) >= 0
    with pytest.raises(TypeError, match="extra"):
        cache_key(**key_inputs(extra={"normalize": object()}))
    with pytest.raises(TypeError, match="batch_size"):
        cache_key(**key_inputs(batch_size="32"))


@pytest.mark.parametrize("change", [
    dict(model="AMD EPYC 7763"), dict(usable=8), dict(gpus=("NVIDIA H100",)), dict(gpus=None),
    dict(torch_version="2.4.0"), dict(total=64 * GiB), dict(limit=8 * GiB),
], ids=lambda c: next(iter(c)))
def test_machine_fingerprint_changes_the_key(change):
    base = cache_key(**key_inputs(machine_fp=machine_fingerprint(profile())))
    assert cache_key(**key_inputs(machine_fp=machine_fingerprint(profile(**change)))) != base


def test_machine_fingerprint_ignores_hostname_free_memory_and_gpu_order(monkeypatch):
    base = machine_fingerprint(profile())
    monkeypatch.setattr(socket, "gethostname", lambda: "another-node")
    assert machine_fingerprint(profile(hostname="node-02")) == base
    # what is free moves run to run (here across 2**4.5 GiB, a log-bucket edge): it must not change the key
    assert machine_fingerprint(profile(budget=int(22.7 * GiB))) == base
    assert machine_fingerprint(profile(budget=int(3 * GiB))) == base
    assert machine_fingerprint(profile(total=int(23.4 * GiB))) == base
    assert machine_fingerprint(profile(gpus=("NVIDIA A100", "NVIDIA H100"))) == base
    assert "node-01" not in json.dumps(base)
    assert machine_fingerprint(profile(total=None))["memory_gib"] is None
    assert machine_fingerprint(profile(limit=8 * GiB))["memory_gib"] == 8


def test_key_is_stable_across_processes(tmp_path):
    code = (
        "import torch\n"
        "from torch.utils.data import TensorDataset, RandomSampler, default_collate\n"
        "from autoloader.cache.fingerprint import cache_key, dataset_fingerprint\n"
        "ds = TensorDataset(torch.zeros(10, 3), torch.ones(10, dtype=torch.long))\n"
        "loader = dict(collate_fn=default_collate, sampler=RandomSampler(ds), batch_sampler=None, drop_last=True)\n"
        "print(cache_key(dataset_fp=dataset_fingerprint(ds), batch_size=4, loader_kwargs=loader, step=0.5,\n"
        "                device_type='cpu', machine_fp={'cpu_usable': 2}, extra={'pin_memory': True}))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    ds = torch.utils.data.TensorDataset(torch.zeros(10, 3), torch.ones(10, dtype=torch.long))
    loader = dict(collate_fn=torch.utils.data.default_collate, sampler=RandomSampler(ds), batch_sampler=None,
                  drop_last=True)
    here = cache_key(dataset_fp=dataset_fingerprint(ds), batch_size=4, loader_kwargs=loader, step=0.5,
                     device_type="cpu", machine_fp={"cpu_usable": 2}, extra={"pin_memory": True})
    assert out.stdout.strip() == here


def test_key_reads_only_its_loader_arguments_and_their_defaults():
    # of the DataLoader's other arguments only collate_fn, sampler, batch_sampler and drop_last change the right
    # tuning; absent ones are DataLoader's defaults
    base = cache_key(**key_inputs())
    assert cache_key(**key_inputs(loader_kwargs={})) == base
    assert cache_key(**key_inputs(loader_kwargs={"timeout": 5, "generator": torch.Generator(),
                                                 "worker_init_fn": custom_collate, "drop_last": False})) == base
    assert cache_key(**key_inputs(loader_kwargs={"drop_last": True})) != base
    assert cache_key(**key_inputs(loader_kwargs={"collate_fn": custom_collate})) != base


def test_key_is_the_one_the_previous_entry_schema_used():
    # KEY_FORMAT is unchanged by the entry schema (3): a tuning cached in schema 2 sits under the same key, so it is
    # found and replaced rather than left behind. The value is what the schema-2 autoloader computed.
    key = cache_key(dataset_fp={"key": "imagenet-train"}, batch_size=32, loader_kwargs={"drop_last": True}, step=0.5,
                    device_type="cuda", machine_fp={"cpu_usable": 16, "memory_gib": 64},
                    extra={"fixed": {}, "shuffle": True})
    assert KEY_FORMAT == 2 and key == "4b2bd62231818d8237db6268fc7c037f"


# ---------------------------------------------------------------- dataset fingerprints


def test_fingerprint_reads_no_sample_and_starts_nothing():
    """NOTE [ Nothing before iter() ]: the key reads no sample, so a dataset that crashes or raises is reported by the
    DataLoader where the epoch reaches it."""
    ds = CountingDataset()
    before = psutil.Process().children(recursive=True)
    fp = dataset_fingerprint(ds)
    assert ds.calls == 0
    assert psutil.Process().children(recursive=True) == before == []
    assert fp["class"].endswith("test_fingerprint.CountingDataset")
    assert fp["len"] == 100 and fp["root"] is None and "sample" not in fp
    assert dataset_fingerprint(BrokenDataset())["len"] == 3


def test_fingerprint_with_key_reads_nothing():
    ds = CountingDataset()
    assert dataset_fingerprint(ds, key="mine") == {"key": "mine"}
    assert ds.calls == 0
    for bad in (3, b"bytes"):
        with pytest.raises(TypeError, match="key"):
            dataset_fingerprint(ds, key=bad)
    with pytest.raises(ValueError, match="key"):
        dataset_fingerprint(ds, key="")


def test_fingerprint_of_iterable_dataset():
    ds = Stream()
    fp = dataset_fingerprint(ds)
    assert ds.yielded == 0 and ds.worker_infos == []  # never iterated
    assert fp["len"] is None and fp["iterable"] is True
    assert dataset_fingerprint(SizedStream(n=7))["len"] == 7


def test_fingerprint_of_dataset_with_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fp = dataset_fingerprint(RootDataset("data/train"))
    assert fp["root"] == str((tmp_path / "data" / "train").resolve())
    assert dataset_fingerprint(RootDataset(tmp_path / "data" / "train"))["root"] == fp["root"]
    assert dataset_fingerprint(RootDataset("data/val")) != fp


def test_batch_signature_records_structure_and_bytes_not_values_nor_sizes():
    batch = NestedDataset()[0]
    signature = batch_signature(batch)
    structure = signature["structure"]
    assert structure["type"] == "builtins.dict"
    assert structure["items"]["'image'"] == {"type": "torch.Tensor", "ndim": 2, "dtype": "torch.float32"}
    pair = structure["items"]["'pair'"]
    assert pair["type"].endswith("test_fingerprint.Pair")
    assert pair["fields"]["left"] == {"type": "numpy.ndarray", "ndim": 1, "dtype": "int64"}
    assert pair["fields"]["right"] == {"type": "builtins.str"}
    assert structure["items"]["'meta'"] == {"type": "builtins.list", "first": {"type": "builtins.int"}}
    assert signature["bytes"] == 4 * 4 * 4 + 2 * 8
    assert batch_signature(NestedDataset(value=7.0)[0]) == signature
    assert batch_signature(NestedDataset(shape=(4, 5))[0])["structure"] == structure  # padding: another size
    assert batch_signature([FakeImage((3, 3), "L")])["structure"]["first"]["mode"] == "L"


@pytest.mark.parametrize("seen, same", [
    (torch.zeros(64, 3, 32, 32), True),                         # another shuffle, the same batch
    (torch.zeros(64, 3, 40, 40), True),                         # padded to another size, within twice the bytes
    (torch.zeros(64, 3, 64, 64), False),                        # another resolution: four times the bytes
    (torch.zeros(64, 3, 32, 32, dtype=torch.uint8), False),     # another dtype
    ((torch.zeros(64, 3, 32, 32),), False),                     # another structure
])
def test_same_batches(seen, same):
    stored = batch_signature(torch.zeros(64, 3, 32, 32))
    assert same_batches(stored, batch_signature(seen)) is same
    assert same_batches(json.loads(json.dumps(stored)), batch_signature(seen)) is same  # as read from an entry
    for malformed in (None, {"structure": stored["structure"]}, {**stored, "bytes": "many"}, {**stored, "bytes": -1}):
        assert not same_batches(malformed, batch_signature(seen))
    assert same_batches(batch_signature(["a"]), batch_signature(["b", "c"]))  # no tensors: bytes 0 both


def test_callable_identity():
    assert callable_identity(None) is None
    assert callable_identity(custom_collate) == f"{__name__}.custom_collate"
    assert callable_identity(CountingDataset) == f"{__name__}.CountingDataset"
    assert callable_identity(CountingDataset()) == callable_identity(CountingDataset(n=5))
    assert callable_identity(CountingDataset()) == f"{__name__}.CountingDataset"
    assert callable_identity(len) == "builtins.len"
    assert callable_identity(lambda b: b).endswith("test_callable_identity.<locals>.<lambda>")
    assert callable_identity(CountingDataset().__getitem__) == f"{__name__}.CountingDataset.__getitem__"
    part = callable_identity(functools.partial(custom_collate, 3, pad=(0, 1)))
    assert part == f"partial({__name__}.custom_collate, 3, pad=(0, 1))"
    assert callable_identity(functools.partial(custom_collate, 4)) != part
    assert "0x" not in callable_identity(functools.partial(custom_collate, object()))


def test_step_descriptor():
    assert step_descriptor(None) == "none"
    assert step_descriptor(0.01) == "sleep:0.01"
    assert step_descriptor(np.float32(0.5)) == "sleep:0.5"
    assert step_descriptor(train_step) == f"callable:{__name__}.train_step"
    for bad in ("0.01", True, [1]):
        with pytest.raises(TypeError, match="step"):
            step_descriptor(bad)
