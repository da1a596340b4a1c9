from __future__ import annotations

import collections
import itertools
import os
import subprocess
import sys
import time

import pytest

from helpers import paired
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from autoloader.loader.batch import iter_tensors
from autoloader.loader.prefetch import EpochStats, PrefetchLoader

Pair = collections.namedtuple("Pair", ["left", "right"])
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Images(Dataset):
    """Deterministic uint8 CHW images with an int label."""

    def __init__(self, n: int = 10, size: int = 4, delay: float = 0.0) -> None:
        self.n, self.size, self.delay = n, size, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g), i


def nested_dict(samples):
    images = torch.stack([s[0] for s in samples])
    labels = torch.tensor([s[1] for s in samples])
    return {"x": images, "pair": Pair(labels, labels * 2), "names": [f"s{s[1]}" for s in samples], "n": len(samples)}


def nested_list(samples):
    return [torch.stack([s[0] for s in samples]), [torch.tensor([s[1] for s in samples]), "tag"]]


def nested_tuple(samples):
    return (torch.stack([s[0] for s in samples]), "text", 7, (torch.tensor([s[1] for s in samples]), None))


class Recording:
    """A collate_fn that remembers every object it returned, to check object identity."""

    def __init__(self, collate):
        self.collate, self.made = collate, []

    def __call__(self, samples):
        batch = self.collate(samples)
        self.made.append(batch)
        return batch


def assert_same(a, b):
    """Equal structure, types and values (tensors compared exactly)."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def reference_normalize(images):
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (images.to(torch.float32) - mean) / std


# --- CPU pass-through -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("collate", [nested_dict, nested_list, nested_tuple])
def test_cpu_pass_through_yields_the_loaders_own_objects(collate):
    recording = Recording(collate)
    loader = PrefetchLoader(DataLoader(Images(10), batch_size=3, collate_fn=recording), device="cpu")
    out = list(loader)
    assert len(out) == 4 and len(recording.made) == 4
    assert all(a is b for a, b in zip(out, recording.made))
    plain = list(DataLoader(Images(10), batch_size=3, collate_fn=collate))
    for a, b in paired(out, plain):
        assert_same(a, b)
    assert loader.stream is None


def test_accepts_any_iterable_and_torch_device():
    batches = [torch.ones(2), torch.zeros(2)]
    loader = PrefetchLoader(batches, device=torch.device("cpu"))
    assert [b is a for a, b in zip(batches, loader)] == [True, True]
    assert len(loader) == 2 and loader.dataset is None and loader.batch_size is None


def test_attributes():
    data = Images(10)
    dl = DataLoader(data, batch_size=4)
    loader = PrefetchLoader(dl, device="cpu", tuning="chosen")
    assert len(loader) == 3 and loader.loader is dl and loader.dataset is data and loader.batch_size == 4
    assert loader.tuning == "chosen" and loader.device == torch.device("cpu")
    assert PrefetchLoader(dl, device="cpu").tuning is None
    assert PrefetchLoader(dl).device.type == ("cuda" if torch.cuda.is_available() else "cpu")


class InfiniteSampler(Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return itertools.cycle(range(self.n))


def test_infinite_sampler_never_needs_len():
    dl = DataLoader(Images(5), batch_size=2, sampler=InfiniteSampler(5))
    loader = PrefetchLoader(dl, device="cpu", normalize=(MEAN, STD))
    got = [labels.tolist() for _, labels in itertools.islice(loader, 4)]
    assert got == [[0, 1], [2, 3], [4, 0], [1, 2]]
    with pytest.raises(TypeError):
        len(loader)


# --- normalisation and dtype ----------------------------------------------------------------------------------------

def test_normalize_uint8_to_float32_matches_reference():
    dl = DataLoader(Images(10), batch_size=4)
    loader = PrefetchLoader(dl, device="cpu", normalize=(MEAN, STD), dtype=torch.float32)
    for (images, labels), (raw, raw_labels) in paired(loader, DataLoader(Images(10), batch_size=4)):
        assert images.dtype == torch.float32 and raw.dtype == torch.uint8
        torch.testing.assert_close(images, reference_normalize(raw), rtol=0, atol=1e-6)
        assert torch.equal(labels, raw_labels)


def test_normalize_keeps_structure_and_other_members_untouched():
    recording = Recording(lambda s: Pair(torch.stack([x for x, _ in s]), torch.tensor([y for _, y in s])))
    loader = PrefetchLoader(DataLoader(Images(6), batch_size=3, collate_fn=recording), device="cpu",
                            normalize=(torch.tensor(MEAN), list(STD)))
    for out, made in paired(loader, recording.made):
        assert type(out) is Pair and out.right is made.right and out.left is not made.left
        torch.testing.assert_close(out.left, reference_normalize(made.left), rtol=0, atol=1e-6)


def test_normalize_plain_tensor_and_list_batches_and_2d_input():
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    (out,) = PrefetchLoader([images], device="cpu", normalize=(MEAN, STD))
    torch.testing.assert_close(out, reference_normalize(images))
    (out_list,) = PrefetchLoader([[images, "x"]], device="cpu", normalize=(MEAN, STD))
    assert type(out_list) is list and out_list[1] == "x"
    torch.testing.assert_close(out_list[0], reference_normalize(images))
    flat = torch.rand(5, 3, dtype=torch.float64)
    (out_flat,) = PrefetchLoader([flat], device="cpu", normalize=(MEAN, STD))
    expected = (flat - torch.tensor(MEAN, dtype=torch.float64)) / torch.tensor(STD, dtype=torch.float64)
    assert out_flat.dtype == torch.float64
    torch.testing.assert_close(out_flat, expected)


def test_dtype_alone_converts_the_input():
    (out,) = PrefetchLoader([(torch.ones(2, 3, dtype=torch.uint8), torch.ones(2))], device="cpu",
                            dtype=torch.float16)
    assert out[0].dtype == torch.float16 and out[1].dtype == torch.float32


def test_dict_batch_uses_input_key():
    def collate(samples):
        return {"image": torch.stack([x for x, _ in samples]), "label": torch.tensor([y for _, y in samples])}

    recording = Recording(collate)
    loader = PrefetchLoader(DataLoader(Images(6), batch_size=3, collate_fn=recording), device="cpu",
                            normalize=(MEAN, STD), dtype=torch.float32, input_key="image")
    for out, made in paired(loader, recording.made):
        assert out.keys() == made.keys() and out["label"] is made["label"]
        torch.testing.assert_close(out["image"], reference_normalize(made["image"]), rtol=0, atol=1e-6)


def test_dict_batch_without_input_key_fails_at_first_batch():
    batches = [{"image": torch.zeros(1, 3, 2, 2)}]
    loader = PrefetchLoader(batches, device="cpu", normalize=(MEAN, STD))
    with pytest.raises(ValueError, match="input_key"):
        next(iter(loader))
    with pytest.raises(ValueError, match="input_key='img'"):
        next(iter(PrefetchLoader(batches, device="cpu", normalize=(MEAN, STD), input_key="img")))


def test_channel_mismatch_names_normalize():
    loader = PrefetchLoader([torch.zeros(2, 4, 5, 5)], device="cpu", normalize=(MEAN, STD))
    with pytest.raises(ValueError, match="normalize has 3 channels"):
        list(loader)


# --- iteration ------------------------------------------------------------------------------------------------------

def test_several_epochs_and_stats_history():
    loader = PrefetchLoader(DataLoader(Images(10), batch_size=4), device="cpu")
    reference = list(DataLoader(Images(10), batch_size=4))
    assert loader.stats is None and loader.history == ()
    for _ in range(3):
        for got, want in paired(loader, reference):
            assert_same(got, want)
    assert [s.epoch for s in loader.history] == [0, 1, 2]
    assert [s.batches for s in loader.history] == [3, 3, 3]
    assert all(0 <= s.wait_s <= s.wall_s for s in loader.history)


def test_stats_update_during_the_epoch():
    loader = PrefetchLoader(DataLoader(Images(10), batch_size=2), device="cpu")
    for i, _ in enumerate(loader):
        assert loader.stats.batches == i + 1 and loader.stats.epoch == 0
    assert loader.stats.batches == 5


def test_break_then_new_epoch_is_complete_with_workers():
    loader = PrefetchLoader(DataLoader(Images(12), batch_size=2, num_workers=2), device="cpu")
    for i, _ in enumerate(loader):
        if i == 1:
            break
    labels = [b[1].tolist() for b in loader]
    assert labels == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert [s.batches for s in loader.history] == [2, 6]


def test_abandoned_iterator_does_not_disturb_the_next():
    loader = PrefetchLoader(DataLoader(Images(6), batch_size=2), device="cpu")
    first = iter(loader)
    next(first)
    assert [b[1].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    del first


def test_empty_loader():
    loader = PrefetchLoader(DataLoader(Images(0), batch_size=2), device="cpu")
    assert list(loader) == [] and len(loader) == 0
    assert loader.stats.batches == 0
    assert list(PrefetchLoader([], device="cpu", normalize=(MEAN, STD))) == []


# --- set_epoch ------------------------------------------------------------------------------------------------------

class CountingSampler(DistributedSampler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = []

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(epoch)
        super().set_epoch(epoch)


class EpochBatchSampler(Sampler):
    def __init__(self, sampler, batch_size: int) -> None:
        self.sampler, self.batch_size, self.epochs = sampler, batch_size, []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def __len__(self) -> int:
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


def test_set_epoch_reaches_the_sampler_once():
    data = Images(8)
    sampler = CountingSampler(data, num_replicas=1, rank=0, shuffle=True, seed=1)
    loader = PrefetchLoader(DataLoader(data, batch_size=4, sampler=sampler), device="cpu")
    orders = []
    for epoch in (3, 4):
        loader.set_epoch(epoch)
        orders.append([i for _, labels in loader for i in labels.tolist()])
    assert sampler.calls == [3, 4] and sampler.epoch == 4
    assert sorted(orders[0]) == list(range(8)) and orders[0] != orders[1]
    assert [s.epoch for s in loader.history] == [3, 4]
    list(loader)
    assert loader.stats.epoch == 5


def test_set_epoch_reaches_a_custom_batch_sampler_and_its_sampler():
    data = Images(8)
    inner = CountingSampler(data, num_replicas=1, rank=0)
    batch_sampler = EpochBatchSampler(inner, 3)
    loader = PrefetchLoader(DataLoader(data, batch_sampler=batch_sampler), device="cpu")
    loader.set_epoch(2)
    assert batch_sampler.epochs == [2] and inner.calls == [2]
    assert len(list(loader)) == len(loader) == 3


def test_set_epoch_without_any_sampler_is_fine():
    loader = PrefetchLoader([torch.ones(1)], device="cpu")
    loader.set_epoch(7)
    list(loader)
    assert loader.stats.epoch == 7
    with pytest.raises(TypeError, match="epoch"):
        loader.set_epoch("1")


# --- argument checks ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, words", [
    ({"device": 0}, TypeError, "device"),
    ({"device": "gpu"}, ValueError, "device"),
    ({"device": "meta"}, ValueError, "device"),
    ({"normalize": "imagenet"}, TypeError, "normalize"),
    ({"normalize": (MEAN,)}, TypeError, "normalize"),
    ({"normalize": ("abc", STD)}, TypeError, "normalize mean"),
    ({"normalize": (MEAN, (0.2, 0.2))}, ValueError, "normalize mean has 3 channels"),
    ({"normalize": (MEAN, (0.2, 0.0, 0.2))}, ValueError, "std must be non-zero"),
    ({"normalize": ((), ())}, ValueError, "normalize mean"),
    ({"normalize": (MEAN, (0.2, float("nan"), 0.2))}, ValueError, "finite"),
    ({"dtype": "float32"}, TypeError, "dtype"),
    ({"dtype": torch.int64, "normalize": (MEAN, STD)}, ValueError, "dtype"),
])
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        PrefetchLoader([], **kwargs)


def test_bad_loader():
    with pytest.raises(TypeError, match="loader"):
        PrefetchLoader(42, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_device_without_cuda():
    with pytest.raises(ValueError, match="is_available"):
        PrefetchLoader([], device="cuda")


# --- stall statistics -----------------------------------------------------------------------------------------------

def test_epoch_stats_fraction():
    assert EpochStats(0, 0, 0.0, 0.0).stall_fraction == 0.0
    assert EpochStats(0, 4, 2.0, 0.5).stall_fraction == 0.25


def test_slow_loader_stalls_and_slow_consumer_does_not():
    slow_data = PrefetchLoader(DataLoader(Images(8, delay=0.02), batch_size=1), device="cpu")
    for _ in slow_data:
        pass
    slow_step = PrefetchLoader(DataLoader(Images(8), batch_size=1), device="cpu")
    for _ in slow_step:
        time.sleep(0.02)
    assert slow_data.stats.batches == slow_step.stats.batches == 8
    assert slow_data.stats.stall_fraction > 0.5, slow_data.stats
    assert slow_step.stats.stall_fraction < 0.5, slow_step.stats
    assert slow_step.stats.wall_s >= 8 * 0.02


# --- CUDA -----------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@cuda
def test_cuda_one_stream_across_epochs_and_loaders():
    # NOTE [ One side stream per device ]: the device's stream, not the loader's (run on an H200, 2026-12-04)
    loader = PrefetchLoader(DataLoader(Images(8), batch_size=2), device="cuda")
    stream = loader.stream
    assert isinstance(stream, torch.cuda.Stream)
    list(loader)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    list(loader)
    assert loader.stream is stream
    assert PrefetchLoader(DataLoader(Images(8), batch_size=2), device="cuda").stream is stream


@pytest.mark.cuda
@cuda
def test_cuda_batches_equal_cpu_reference():
    loader = PrefetchLoader(DataLoader(Images(10), batch_size=3, collate_fn=nested_dict, pin_memory=True),
                            device="cuda")
    reference = list(DataLoader(Images(10), batch_size=3, collate_fn=nested_dict))
    for _ in range(2):
        got = list(loader)
        assert len(got) == len(reference)
        for a, b in zip(got, reference):
            assert all(t.is_cuda for t in iter_tensors(a))
            assert_same(a, b)


@pytest.mark.cuda
@cuda
def test_cuda_normalize_matches_cpu():
    def make(device):
        return PrefetchLoader(DataLoader(Images(10, size=8), batch_size=4, pin_memory=device == "cuda"),
                              device=device, normalize=(MEAN, STD), dtype=torch.float32)

    for (gpu, gpu_labels), (cpu, cpu_labels) in paired(make("cuda"), make("cpu")):
        assert gpu.is_cuda and gpu.dtype == torch.float32
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)
        assert torch.equal(gpu_labels.cpu(), cpu_labels)


@pytest.mark.cuda
@cuda
def test_cpu_device_never_initialises_cuda():
    code = ("import torch; from autoloader.loader.prefetch import PrefetchLoader; "
            "l = PrefetchLoader([torch.ones(2, 3)], device='cpu', normalize=((0.5,) * 3, (0.5,) * 3)); list(l); "
            "print(torch.cuda.is_initialized())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=env)
    assert out.stdout.strip() == "False"
