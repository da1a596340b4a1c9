"""How a block travels from a Ray worker to the driver (autoloader/ray/transport.py), as a property: any batch of
tensors, numpy arrays and Python values comes back equal, of the same types, dtypes and shapes, every array writable
and a copy of its own (never a view of the block's memory, which is Ray's object store in a real run), the arrays'
bytes out of the pickle; an exception comes back as itself or described; a batch that cannot be pickled becomes a
TypeError naming the fix. Needs pyarrow (installed with Ray Data); no Ray."""
import collections
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow", reason="pyarrow comes with Ray Data: pip install '.[ray]'")

from autoloader.ray.transport import Failure, decode, encode, pack, unpack  # noqa: E402

Pair = collections.namedtuple("Pair", "image label")
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64]
SHAPES = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(SHAPES)
    value = (torch.rand(shape) * 100).to(dtype) if dtype is not torch.complex64 else torch.randn(shape, dtype=dtype)
    if draw(st.booleans()) and value.dim() >= 2 and value.shape[0] > 1 and value.shape[1] > 1:
        value = value.transpose(0, 1)  # not contiguous: stays in the pickle, strides and all
    return value


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(["<f8", "<i4", "u1", "?", "<i4,<f2"])))
    shape = draw(SHAPES)
    raw = np.random.default_rng(draw(st.integers(0, 99))).integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize)
    if dtype.kind == "b":
        return (raw % 2).astype(bool).reshape(shape)
    return raw.astype(np.uint8).view(dtype).reshape(shape)


LEAVES = st.one_of(tensors(), arrays(), st.integers(), st.text(max_size=3), st.none(), st.floats(allow_nan=False))
BATCHES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner), st.dictionaries(st.text(max_size=2), inner, max_size=3),
    st.builds(Pair, inner, inner)), max_leaves=8)


def same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        if a.numel():  # strides matter where a dimension has more than one element
            assert [st for st, n in zip(a.stride(), a.shape) if n > 1] == [st for st, n in zip(b.stride(), b.shape)
                                                                           if n > 1]
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def leaves(batch):
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from leaves(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from leaves(value)


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(BATCHES, min_size=1, max_size=4))
def test_every_batch_comes_back_equal_writable_and_a_copy_of_its_own(batches):
    table = pack(list(enumerate(batches, start=3)))
    got = list(unpack(table))
    assert [pos for pos, _ in got] == list(range(3, 3 + len(batches)))
    data = table.column("data").chunks[0].buffers()[2]
    low = data.address if data is not None else 0
    for (_, back), sent in zip(got, batches):
        same(sent, back)
        for array in leaves(back):
            if isinstance(array, np.ndarray):
                assert array.flags.writeable
                start, size = array.__array_interface__["data"][0], array.nbytes
            else:
                start, size = array.data_ptr(), array.numel() * array.element_size()
            if data is not None and size:
                assert not low <= start < low + data.size, "an array is a view of the block's memory"


def test_the_arrays_bytes_are_not_in_the_pickle_and_an_array_twice_is_one_object_twice():
    image = torch.zeros(64, 3, 32, 32, dtype=torch.uint8)
    meta, parts = encode({"a": image, "b": image, "c": np.ones(10)})
    assert len(meta) < 1000 and [p.nbytes for p in parts] == [image.numel(), 80]
    back = decode(meta, np.concatenate(parts))
    assert back["a"] is back["b"] and back["a"].data_ptr() != image.data_ptr()
    back["a"][0, 0, 0, 0] = 7  # writable, and the sender's tensor is untouched
    assert image.max() == 0


def test_an_exception_comes_back_as_itself_or_described_with_the_workers_traceback():
    def boom():
        raise KeyError("label 57")

    try:
        boom()
    except KeyError as err:
        failure = Failure.of(err)
    ((_, back),) = list(unpack(pack([(0, failure)])))
    assert isinstance(back.error, KeyError) and back.error.args == ("label 57",)
    assert back.type_name == "KeyError" and "in boom" in back.traceback

    class Odd(Exception):
        def __init__(self, a, b):  # pickles its args, but cannot be rebuilt from them
            super().__init__(f"{a}-{b}")

    odd = Failure.of(Odd(1, 2))
    assert odd.error is None and odd.type_name == "Odd" and odd.message == "1-2"
    assert pickle.loads(pickle.dumps(odd)) == odd


def test_a_batch_that_cannot_be_pickled_is_a_type_error_naming_the_fix():
    import threading

    ((_, back),) = list(unpack(pack([(9, {"lock": threading.Lock()})])))
    assert isinstance(back, Failure) and isinstance(back.error, TypeError)
    assert "cannot be pickled" in back.message
    assert "return tensors, numpy arrays and plain Python values" in back.message


def test_a_block_of_many_chunks_reads_each_row_in_place():
    tables = [pack([(k, torch.full((3,), k))]) for k in range(4)]
    merged = pa.concat_tables(tables)
    assert merged.column("data").num_chunks == 4
    got = [batch.tolist() for _, batch in unpack(merged)]
    assert got == [[k] * 3 for k in range(4)]
    sliced = merged.slice(1, 2)
    assert [batch.tolist() for _, batch in unpack(sliced)] == [[1] * 3, [2] * 3]
