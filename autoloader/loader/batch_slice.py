"""``BatchSlice``: at most ``limit`` consecutive batches of one epoch, iterated by one candidate DataLoader (it is the
DataLoader's ``batch_sampler``, or its ``sampler``), then closed with ``delivered(n)``, which gives the batches the
loop did not receive back to the epoch for the next slice, and says what the slice served (``SliceRecord``). The
epoch it is taken from is an ``EpochSource`` (loader/slices.py; the re-issue rule and two open slices: NOTE [ Exact
epochs across candidates ] there)."""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Protocol

import torch
from torch.utils.data import Sampler

Indices = Any
"""What an epoch's index sampler yields: a batch of indices (a DataLoader's ``batch_sampler``), or one index (its
``sampler``, with ``batch_size=None``)."""


class SlicedEpoch(Protocol):
    """What a slice asks of the epoch it was taken from (``slices.EpochSource`` is one)."""

    _batched: bool
    base_seed: int

    def _next_start(self) -> int: ...

    def _remaining_at(self, position: int) -> Optional[int]: ...

    def _pull(self) -> Optional[Indices]: ...

    def _close(self, part: BatchSlice, record: SliceRecord, undelivered: List[Indices]) -> SliceRecord: ...


@dataclasses.dataclass(frozen=True)
class SliceRecord:
    """One closed slice: batches ``[start, start + delivered)`` of the epoch went to the loop."""

    number: int  # 0, 1, ... within the epoch
    start: int
    limit: Optional[int]  # None: the rest of the epoch
    pulled: int  # handed to the DataLoader (fresh and re-issued)
    delivered: int

    @property
    def reissued(self) -> int:
        return self.pulled - self.delivered


class BatchSlice(Sampler):
    """At most ``limit`` consecutive batches of an epoch: pass it as a DataLoader's ``batch_sampler``.

    Memory: it keeps only the batches it may have to give back, the last ``lookahead + 2`` it pulled (set by
    ``expect``; unbounded without it).
    """

    def __init__(self) -> None:
        self._source: Optional[SlicedEpoch] = None
        self._binding = 0
        self.lookahead: Optional[int] = None
        self.through: Optional[Callable[[Indices], Indices]] = None
        """What each batch of indices passes through on its way to the DataLoader (an online probe's sample clock,
        measure/sample_clock.py); the slice keeps, and re-issues, the batches themselves."""

    def _bind(self, source: SlicedEpoch, number: int, limit: Optional[int]) -> None:
        self._source, self._number, self._limit, self._start = source, number, limit, source._next_start()
        self._pulled, self._binding, self._closed = 0, self._binding + 1, False
        self._reserved: Deque[Indices] = collections.deque()
        self.capped = False
        keep = None if self.lookahead is None else self.lookahead + 2
        self._recent: Deque[Indices] = collections.deque(maxlen=keep)

    @property
    def reusable(self) -> bool:
        """Never bound, or closed: ``EpochSource.take(reuse=)`` may bind it again (a persistent DataLoader's)."""
        return self._source is None or self._closed

    @property
    def source(self) -> SlicedEpoch:
        if self._source is None:
            raise RuntimeError("this BatchSlice is not bound to an epoch: get one from EpochSource.take()")
        return self._source

    @property
    def number(self) -> int:
        """The slice's position in its epoch's sequence: 0, 1, ..."""
        return self._number if self._source is not None else -1

    @property
    def pulled(self) -> int:
        return self._pulled if self._source is not None else 0

    @property
    def limit(self) -> Optional[int]:
        """The most batches this slice hands out (None: the rest of the epoch)."""
        return self._limit

    def cap(self, extra: int = 0) -> int:
        """End the slice after the batches its DataLoader pulled and ``extra`` more, reserved from the source now, so
        that the next slice can be taken while this one serves them (NOTE [ Exact epochs across candidates ] in
        loader/slices.py, two open slices). Returns the slice's new limit; its DataLoader then ends after handing all
        of them out."""
        source = self.source
        if self._closed:
            raise RuntimeError(f"slice {self._number} is closed: cap() a slice whose DataLoader is still iterating")
        if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
            raise ValueError(f"cap(extra): extra must be an int >= 0 (batches to reserve), got {extra!r}")
        room = extra if self._limit is None else max(0, min(extra, self._limit - self._pulled))
        while len(self._reserved) < room:
            batch = source._pull()
            if batch is None:
                break
            self._reserved.append(batch)
        self._limit, self.capped = self._pulled + len(self._reserved), True
        return self._limit

    def expect(self, in_flight: int) -> None:
        """Keep as many batches as the DataLoader iterating the slice holds in flight (``config.in_flight``): its
        undelivered batches are given back from them. Call it before the DataLoader iterates the slice."""
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 0:
            raise ValueError(f"expect(in_flight): in_flight must be an int >= 0 (batches), got {in_flight!r}")
        if self.pulled:
            raise RuntimeError("call expect() before iterating the slice")
        self.lookahead = in_flight
        self._recent = collections.deque(maxlen=self.lookahead + 2)

    def sampling(self) -> Dict[str, Any]:
        """The DataLoader arguments that make it iterate this slice, as the plain loader batches its epoch."""
        if self.source._batched:
            return {"batch_sampler": self}
        return {"sampler": self, "batch_size": None}

    def private_generator(self) -> torch.Generator:
        """A generator of the slice's own for the candidate's base-seed draw: the user's RNG is never touched (NOTE
        [ Exact epochs across candidates ] in loader/slices.py, 3.)."""
        private = torch.Generator()
        private.manual_seed((self.source.base_seed + 1 + self.number) % 2 ** 63)
        return private

    def __len__(self) -> int:
        remaining = self.source._remaining_at(self._start)
        if remaining is None:
            raise TypeError("this epoch's sampler has no len(), so neither has its slice")
        return remaining if self._limit is None else min(self._limit, remaining)

    def __iter__(self) -> Iterator[Indices]:
        source, binding = self.source, self._binding
        while self._limit is None or self._pulled < self._limit:
            if self._closed or binding != self._binding:
                raise RuntimeError("this slice was closed by delivered(): stop iterating its DataLoader first, and "
                                   "bind it again with EpochSource.take(limit, reuse=slice) before a new iter()")
            batch = self._reserved.popleft() if self._reserved else None if self.capped else source._pull()
            if batch is None:
                return
            self._pulled += 1
            self._recent.append(batch)
            yield batch if self.through is None else self.through(batch)

    def delivered(self, n: int) -> SliceRecord:
        """Close the slice: the loop received its first ``n`` batches; the rest are re-issued to the next slice.

        Call it once the candidate's DataLoader iterator is stopped (exhausted, deleted, or failed).
        """
        source = self.source
        if self._closed:
            raise RuntimeError(f"slice {self._number} is already closed")
        if not 0 <= n <= self._pulled:
            raise ValueError(f"delivered({n}): slice {self._number} handed out only {self._pulled} batches; pass "
                             f"the number of batches the training loop received from this slice's DataLoader")
        back = self._pulled - n
        if back > len(self._recent):
            raise RuntimeError(f"slice {self._number} kept only its last {len(self._recent)} batches but {back} are "
                               f"undelivered: was its DataLoader built with a larger prefetch than its lookahead?")
        undelivered = list(self._recent)[len(self._recent) - back:] + list(self._reserved)
        record = source._close(self, SliceRecord(self._number, self._start, self._limit, self._pulled, n),
                               undelivered)
        self._closed = True
        self._recent.clear()
        self._reserved.clear()
        return record
