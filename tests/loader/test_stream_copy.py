"""autoloader/loader/stream_copy.py: the next batch loaded, copied to the device (on CUDA) and transformed with its
structure kept (dicts, namedtuples, lists); the end of the epoch and a failed batch as markers; when the prefetcher
reads ahead."""
from __future__ import annotations

import collections

import pytest
import torch

from autoloader.loader.device import resolve_device, side_stream
from autoloader.loader.epoch_iter import END, Failed
from autoloader.loader.source import BatchError
from autoloader.loader.stream_copy import handed, load, reads_ahead
from autoloader.loader.transform import InputTransform

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
Pair = collections.namedtuple("Pair", "image label")
CPU = torch.device("cpu")
NONE = InputTransform(normalize=None, dtype=None, input_key=None)


def images(n: int = 2) -> torch.Tensor:
    return torch.arange(n * 3 * 2 * 2, dtype=torch.uint8).reshape(n, 3, 2, 2)


def test_without_a_stream_or_a_transform_the_batch_is_the_sources_own_object():
    batch = {"image": images(), "label": [1, 2]}
    assert load(iter([batch]), None, CPU, NONE) is batch


@pytest.mark.parametrize("wrap, unwrap", [
    (lambda x, y: {"image": x, "label": y}, lambda b: (b["image"], b["label"])),
    (lambda x, y: Pair(x, y), lambda b: (b.image, b.label)),
    (lambda x, y: [x, y], lambda b: (b[0], b[1])),
])
def test_a_transformed_batch_keeps_its_structure(wrap, unwrap):
    x, y = images(), torch.tensor([3, 4])
    transform = InputTransform(normalize=((1.0, 2.0, 3.0), (2.0, 2.0, 2.0)), dtype=torch.float32,
                               input_key="image" if isinstance(wrap(x, y), dict) else None)
    out = load(iter([wrap(x, y)]), None, CPU, transform)
    assert type(out) is type(wrap(x, y))
    got_x, got_y = unwrap(out)
    mean = torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)
    torch.testing.assert_close(got_x, (x.float() - mean) / 2.0)
    assert got_y is y, "only the input is transformed"


def test_the_end_and_a_failed_batch_are_markers():
    def source():
        yield BatchError(KeyError("sample 3"))
        raise RuntimeError("DataLoader timed out after 5 seconds")

    it = source()
    failed = load(it, None, CPU, NONE)
    assert isinstance(failed, Failed) and isinstance(failed.exception, KeyError) and failed.consumed
    timed_out = load(it, None, CPU, NONE)
    assert isinstance(timed_out, Failed) and not timed_out.consumed, "torch's iterator error used no batch"
    assert load(it, None, CPU, NONE) is END


def test_a_transform_that_fails_on_a_malformed_batch_fails_that_batch_only():
    transform = InputTransform(normalize=((0.0, 0.0), (1.0, 1.0)), dtype=torch.float32, input_key=None)
    failed = load(iter([torch.zeros(2, 3, 4, 4)]), None, CPU, transform)
    assert isinstance(failed, Failed) and failed.consumed


def test_only_a_side_stream_reads_ahead_and_nothing_is_handed_without_one():
    assert reads_ahead(None) is False and reads_ahead(object()) is True
    handed(None, CPU, {"image": images()})


@pytest.mark.cuda
@cuda
def test_on_cuda_a_nested_batch_is_copied_on_the_side_stream_with_its_structure():
    device = resolve_device("cuda")
    stream = side_stream(device)
    batch = {"pair": Pair(images().pin_memory(), torch.tensor([1, 2])), "name": "a"}
    out = load(iter([batch]), stream, device, NONE)
    handed(stream, device, out)
    assert isinstance(out["pair"], Pair) and out["name"] == "a"
    assert out["pair"].image.is_cuda and torch.equal(out["pair"].image.cpu(), batch["pair"].image)
