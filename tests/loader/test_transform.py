"""What PrefetchLoader does to the input tensor on the device (autoloader.loader.transform): ``dtype`` then
``normalize``, on the input only, whatever the batch's shape; every bad argument refused with its fix."""
from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch

from autoloader.loader.transform import InputTransform, check_normalize

Pair = namedtuple("Pair", "image label")


def _transform(**kw) -> InputTransform:
    args = dict(normalize=((10.0, 20.0), (2.0, 4.0)), dtype=torch.float32, input_key=None)
    args.update(kw)
    return InputTransform(**args)


def test_dtype_then_normalize_per_channel():
    x = torch.tensor([[[[10, 12]], [[20, 28]]]], dtype=torch.uint8)  # (1, 2, 1, 2)
    out = _transform()(x)
    assert out.dtype == torch.float32 and out.flatten().tolist() == [0.0, 1.0, 0.0, 2.0]


def test_only_the_input_changes_and_the_batch_keeps_its_type():
    x, label = torch.full((2, 2, 3), 10, dtype=torch.uint8), torch.tensor([1, 2])
    as_tuple = _transform()((x, label))
    assert isinstance(as_tuple, tuple) and as_tuple[1] is label
    assert as_tuple[0][:, 0].eq(0.0).all() and as_tuple[0][:, 1].eq(-2.5).all()  # (10 - 10) / 2, (10 - 20) / 4
    as_list = _transform()([x, label])
    assert isinstance(as_list, list) and as_list[1] is label
    as_named = _transform()(Pair(x, label))
    assert isinstance(as_named, Pair) and as_named.label is label
    mapping = _transform(input_key="pixels")(OrderedDict(pixels=x, label=label))
    assert isinstance(mapping, OrderedDict) and list(mapping) == ["pixels", "label"] and mapping["label"] is label


def test_a_mapping_batch_needs_its_key():
    batch = {"pixels": torch.zeros(1, 2, 1)}
    with pytest.raises(ValueError, match="pass input_key="):
        _transform()(batch)
    with pytest.raises(ValueError, match="input_key='image' is not in the batch"):
        _transform(input_key="image")(batch)


def test_the_input_must_have_the_normalised_channels():
    with pytest.raises(ValueError, match=r"normalize has 2 channels but the input has shape \(4, 3\)"):
        _transform()(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="the batch holds str"):
        _transform()(("text", 1))


@pytest.mark.parametrize("normalize, error, says", [
    ((1.0,), TypeError, "a \\(mean, std\\) pair"), (("ab", (1.0,)), TypeError, "numbers per channel"),
    (((), (1.0,)), ValueError, "finite numbers"), (((1.0, 2.0), (1.0,)), ValueError, "mean has 2 channels"),
    (((1.0,), (0.0,)), ValueError, "non-zero"), (((float("nan"),), (1.0,)), ValueError, "finite")])
def test_check_normalize_refuses_what_cannot_normalise(normalize, error, says):
    with pytest.raises(error, match=says):
        check_normalize(normalize)


def test_an_integer_dtype_cannot_hold_normalised_values_and_no_transform_is_inactive():
    with pytest.raises(ValueError, match="floating dtype"):
        _transform(dtype=torch.int32)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        _transform(dtype="float32")
    idle = InputTransform(normalize=None, dtype=None, input_key=None)
    x = torch.ones(2)
    assert not idle.active and idle(x) is x
