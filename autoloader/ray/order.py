"""An epoch's order as Ray's tasks read it: the index batches of consecutive positions, drawn from the epoch's index
sampler a few at a time on the calling thread (``Drawer``), in ``Chunk``\\ s of arrays that go into Ray's object store
once each and that a task reads by position.

A chunk of ``count`` batches starting at epoch position ``start`` is one int64 array of every index and the offsets
of its batches (``indices[offsets[j]:offsets[j + 1]]`` is batch ``start + j``, handed to the dataset as a list of
Python ints, as torch's ``BatchSampler`` yields it), or, with ``batch_size=None``, the array of single indices. An
epoch whose indices are not all Python ints (a sampler of string keys, of numpy integers) is sent as the pickled list
of its batches instead, so that the dataset receives exactly what the sampler yielded. 10^7 indices are 80 MB, with
no Python object per batch once drawn.

The ``Drawer`` takes one slice of the epoch (``EpochSource.take``) per chunk and closes it once the chunk is drawn
(``delivered`` of all of it: the batches are handed to Ray), so it keeps no batch beyond the chunk it is drawing, and
the epoch's ``drawn`` counts what was asked of the sampler, for a checkpoint. It draws only on the thread that calls
it: a sampler that draws from the global RNG as it is iterated draws between the loop's own draws, never beside them
in another thread.
"""
from __future__ import annotations

import itertools
import pickle
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence

import numpy as np

from ..loader.slices import BatchSlice, EpochSource


@dataclass(frozen=True, eq=False)
class Chunk:
    """Batches ``start`` to ``start + count - 1`` of an epoch (see the module docstring). ``indices`` and ``offsets``
    when every index is a Python int (``offsets`` None with ``batch_size=None``), else ``objects``, the pickled list of
    the batches."""

    start: int
    count: int
    batched: bool
    indices: Optional[np.ndarray] = None
    offsets: Optional[np.ndarray] = None
    objects: Optional[bytes] = None

    @property
    def nbytes(self) -> int:
        """Bytes the chunk holds."""
        return sum(int(a.nbytes) for a in (self.indices, self.offsets) if a is not None) + len(self.objects or b"")

    def batches(self) -> "ChunkReader":
        """A reader of the chunk's batches by position (unpickles ``objects`` once)."""
        return ChunkReader(self)


class ChunkReader:
    """Batch ``position`` of a chunk, as the sampler yielded it (``read(position)``; ``position`` is the epoch's)."""

    def __init__(self, chunk: Chunk) -> None:
        self.chunk = chunk
        self._objects: Optional[List[Any]] = pickle.loads(chunk.objects) if chunk.objects is not None else None

    def read(self, position: int) -> Any:
        j = position - self.chunk.start
        if not 0 <= j < self.chunk.count:
            raise IndexError(f"batch {position} is not in the chunk of batches {self.chunk.start} to "
                             f"{self.chunk.start + self.chunk.count - 1}")
        if self._objects is not None:
            return self._objects[j]
        indices = self.chunk.indices
        if indices is None:
            raise ValueError("a chunk without indices holds its batches pickled (objects): make it with chunk_of()")
        if self.chunk.offsets is None:
            return int(indices[j])
        return indices[self.chunk.offsets[j]:self.chunk.offsets[j + 1]].tolist()


def _all_ints(values: Sequence[Any]) -> bool:
    return set(map(type, values)) <= {int}


def chunk_of(batches: Sequence[Any], *, start: int, batched: bool) -> Chunk:
    """The chunk of ``batches`` (index batches, or single indices when not ``batched``) starting at ``start``."""
    if batched:
        if not all(isinstance(batch, list) for batch in batches):
            return Chunk(start, len(batches), batched, objects=pickle.dumps(list(batches), pickle.HIGHEST_PROTOCOL))
        flat: Sequence[Any] = list(itertools.chain.from_iterable(batches))
    else:
        flat = batches
    if _all_ints(flat):
        try:
            indices = np.array(flat, dtype=np.int64) if len(flat) else np.zeros(0, dtype=np.int64)
        except OverflowError:
            indices = None
        if indices is not None:
            offsets = None
            if batched:
                offsets = np.zeros(len(batches) + 1, dtype=np.int64)
                np.cumsum(np.fromiter(map(len, batches), dtype=np.int64, count=len(batches)), out=offsets[1:])
            return Chunk(start, len(batches), batched, indices=indices, offsets=offsets)
    return Chunk(start, len(batches), batched, objects=pickle.dumps(list(batches), pickle.HIGHEST_PROTOCOL))


class Drawer:
    """The batches of ``epoch`` (its served ones already skipped), drawn on the calling thread into chunks (see the
    module docstring): ``begin(count)`` opens the next chunk, ``pull(n)`` draws up to ``n`` more of its batches (a few
    at a time between the loop's batches), ``finish()`` draws the rest of it and returns it, None when the epoch had no
    batch left. ``exhausted``: the sampler ran out."""

    def __init__(self, epoch: EpochSource, *, batched: bool) -> None:
        self.epoch, self.batched = epoch, batched
        self.position = 0
        """Batches drawn into finished chunks, from where the epoch was taken (after any skipped batch)."""
        self.exhausted = False
        self._part: Optional[BatchSlice] = None
        self._it: Optional[Iterator[Any]] = None
        self._pending: List[Any] = []
        self._count = 0

    @property
    def open(self) -> bool:
        """A chunk is being drawn."""
        return self._part is not None

    @property
    def remaining(self) -> Optional[int]:
        """Batches the epoch has left beyond those drawn (None when its sampler has no len())."""
        left = self.epoch.unclaimed
        return None if left is None else left

    def begin(self, count: int) -> None:
        if self._part is not None:
            raise RuntimeError("a chunk is being drawn: finish() it before the next begin()")
        if count < 1:
            raise ValueError(f"a chunk holds at least one batch, got count={count}")
        left = self.remaining
        if left is not None:  # never past the end: the sampler is asked past it when the epoch's last batch is served
            count = max(1, min(count, left))
        self._part = self.epoch.take(count)
        self._it, self._pending, self._count = iter(self._part), [], count

    def pull(self, n: int) -> int:
        """Draw up to ``n`` more batches of the open chunk (none when no chunk is open); returns how many."""
        if self._it is None or n <= 0:
            return 0
        got = list(itertools.islice(self._it, min(n, self._count - len(self._pending))))
        self._pending.extend(got)
        if len(got) < n and len(self._pending) < self._count:
            self.exhausted = True
        return len(got)

    @property
    def ready(self) -> bool:
        """The open chunk is fully drawn (or the sampler ran out)."""
        return self._part is not None and (len(self._pending) >= self._count or self.exhausted)

    def finish(self) -> Optional[Chunk]:
        """The open chunk, fully drawn (its slice closed: every batch counted as handed out); None when empty."""
        part = self._part
        if part is None:
            raise RuntimeError("no chunk is being drawn: begin(count) first")
        self.pull(self._count - len(self._pending))
        batches, self._pending = self._pending, []
        part.delivered(len(batches))
        self._part = self._it = None
        if not batches:
            self.exhausted = True
            return None
        chunk = chunk_of(batches, start=self.position, batched=self.batched)
        self.position += len(batches)
        if self.remaining == 0:
            self.exhausted = True
        return chunk

    def close(self) -> None:
        """Give the open chunk's batches back to the epoch (a run left early)."""
        if self._part is not None:
            self._part.delivered(0)
            self._part = self._it = None
            self._pending = []
