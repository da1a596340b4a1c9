"""How a block of batches travels from a Ray worker to the driver: ``pack`` in the worker, ``unpack`` in the driver.

A batch is pickled with its tensors and numpy arrays taken out (``pickle``'s ``persistent_id``): the pickle keeps the
batch's structure and every other value exactly as a DataLoader's worker would send them, each array is a placeholder
naming its kind, dtype and shape, and the arrays' bytes go, one after another, into the block's ``data`` column. A
block is one Arrow table: ``pos`` (the batch's place in the epoch), ``kind`` (a batch, or the exception loading it
raised), ``meta`` (the pickle) and ``data`` (the arrays' bytes), both ``large_binary``. The worker copies each array
once, into the block's buffer; Ray moves the table through its object store without pickling it; the driver reads
``data`` in place (a view of the object store's memory) and copies each array once, into writable memory it owns
(page-locked when ``pin``): the batch it hands the loop is writable, never a view of Ray's store.

What goes into ``data``: plain strided ``torch.Tensor``\\ s that need no gradient, are contiguous and not lazily
conjugated or negated, and C-contiguous numpy arrays of any dtype but ``object``. Anything else (a non-contiguous
view, a tensor subclass, a sparse or quantized tensor) stays in the pickle, exactly as before. An array that appears
twice in a batch arrives as one object twice; arrays that only shared memory (two views of one tensor) arrive as
copies of their own.
"""
from __future__ import annotations

import importlib
import io
import pickle
import traceback
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

BATCH = 0
FAILED = 1
_PROTOCOL = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True)
class Failure:
    """What loading one batch raised in a Ray worker: the exception itself when it survives pickling (else None), its
    type's name, its message and the worker's traceback."""

    error: Optional[Exception]
    type_name: str
    message: str
    traceback: str

    @classmethod
    def of(cls, error: Exception) -> "Failure":
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        kept: Optional[Exception] = error
        try:
            pickle.loads(pickle.dumps(error, protocol=_PROTOCOL))
        except Exception:  # noqa: BLE001 - any exception may fail to pickle or to rebuild; it is described instead
            kept = None
        return cls(kept, type(error).__name__, str(error), text)


def _tensor_bytes(value: torch.Tensor) -> Optional[np.ndarray]:
    if (type(value) is not torch.Tensor or value.layout != torch.strided or value.requires_grad
            or value.is_quantized or value.is_conj() or value.is_neg() or value.device.type != "cpu"
            or not value.is_contiguous()):
        return None
    return value.reshape(-1).view(torch.uint8).numpy()


def _array_bytes(value: np.ndarray) -> Optional[np.ndarray]:
    if type(value) is not np.ndarray or value.dtype.hasobject or not value.flags.c_contiguous:
        return None
    return value.reshape(-1).view(np.uint8)


class _Packer(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=_PROTOCOL)
        self.parts: List[np.ndarray] = []
        self._seen: dict = {}

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, (torch.Tensor, np.ndarray)):
            return None
        key = id(obj)
        if key in self._seen:
            return ("same", self._seen[key][0])
        if isinstance(obj, torch.Tensor):
            raw = _tensor_bytes(obj)
            found = None if raw is None else ("torch", len(self.parts), obj.dtype, tuple(obj.shape))
        else:
            raw = _array_bytes(obj)
            found = None if raw is None else ("numpy", len(self.parts), obj.dtype, obj.shape)
        if raw is None or found is None:
            return None
        self._seen[key] = (len(self.parts), obj)  # the object is kept so that its id is not reused meanwhile
        self.parts.append(raw)
        return found


def encode(batch: Any) -> Tuple[bytes, List[np.ndarray]]:
    """``batch`` as its pickle with the arrays taken out, and the arrays' bytes (views, not copies)."""
    out = io.BytesIO()
    packer = _Packer(out)
    packer.dump(batch)
    return out.getvalue(), packer.parts


def pack(rows: Sequence[Tuple[int, Any]]) -> Any:
    """The Arrow table of a block: ``rows`` are ``(place in the epoch, batch or Failure)``. A batch that cannot be
    pickled becomes a ``Failure`` naming it (a TypeError, as a DataLoader worker's would be)."""
    pa: Any = importlib.import_module("pyarrow")  # installed with Ray Data, imported where a block is made
    kinds, metas, sizes = [], [], []
    parts: List[np.ndarray] = []
    for _, item in rows:
        if not isinstance(item, Failure):
            try:
                meta, own = encode(item)
            except Exception as err:  # noqa: BLE001 - whatever pickling raised is the batch's failure
                item = Failure.of(TypeError(f"the batch cannot be sent from Ray's worker to the driver: it cannot be "
                                            f"pickled ({type(err).__name__}: {err}); return tensors, numpy arrays "
                                            f"and plain Python values from the dataset and collate_fn"))
            else:
                kinds.append(BATCH)
                metas.append(meta)
                sizes.append(sum(part.nbytes for part in own))
                parts.extend(own)
                continue
        kinds.append(FAILED)
        metas.append(pickle.dumps(item, protocol=_PROTOCOL))
        sizes.append(0)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    at = 0
    for part in parts:  # the one copy in the worker
        data[at:at + part.nbytes] = part
        at += part.nbytes
    column = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(rows),
                                              [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pa.table({"pos": pa.array([pos for pos, _ in rows], type=pa.int64()),
                     "kind": pa.array(kinds, type=pa.int8()),
                     "meta": pa.array(metas, type=pa.large_binary()), "data": column})


class _Unpacker(pickle.Unpickler):
    def __init__(self, meta: bytes, data: np.ndarray, pin: bool) -> None:
        super().__init__(io.BytesIO(meta))
        self.data, self.pin, self.at = data, pin, 0
        self.made: List[Any] = []

    def persistent_load(self, pid: Any) -> Any:
        kind, index = pid[0], pid[1]
        if kind == "same":
            return self.made[index]
        dtype, shape = pid[2], pid[3]
        value: Any
        if kind == "torch":
            value = torch.empty(shape, dtype=dtype, pin_memory=self.pin)
            target = value.reshape(-1).view(torch.uint8).numpy()
        else:
            value = np.empty(shape, dtype=dtype)
            target = value.reshape(-1).view(np.uint8)
        size = target.nbytes
        target[...] = self.data[self.at:self.at + size]  # the one copy in the driver, out of Ray's store
        self.at += size
        self.made.append(value)
        return value


def decode(meta: bytes, data: np.ndarray, *, pin: bool = False) -> Any:
    """A batch from its pickle and its arrays' bytes (``data``, read in place); every array a copy of its own."""
    return _Unpacker(meta, data, pin).load()


def _binary_rows(column: Any) -> Iterator[np.ndarray]:
    """Each value of a ``large_binary`` column as a uint8 view of the column's buffer (no copy)."""
    for chunk in column.chunks:
        buffers = chunk.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[chunk.offset:chunk.offset + len(chunk) + 1] \
            if buffers[1] is not None else np.zeros(len(chunk) + 1, dtype=np.int64)
        data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None and buffers[2].size \
            else np.empty(0, dtype=np.uint8)
        for k in range(len(chunk)):
            yield data[offsets[k]:offsets[k + 1]]


def unpack(table: Any, *, pin: bool = False) -> Iterator[Tuple[int, Any]]:
    """``(place, batch or Failure)`` for each row of a block ``pack`` made, in the block's order."""
    positions = table.column("pos").to_numpy()
    kinds = table.column("kind").to_numpy()
    metas = table.column("meta").to_pylist()
    for pos, kind, meta, data in zip(positions, kinds, metas, _binary_rows(table.column("data"))):
        if kind == FAILED:
            yield int(pos), pickle.loads(meta)
        else:
            yield int(pos), decode(meta, data, pin=pin)
