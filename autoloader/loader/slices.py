"""Serve one epoch's batch order through a sequence of DataLoaders: the building block of online tuning.

``EpochSlicer`` holds the plain DataLoader whose epochs it serves. Each epoch, ``slicer.epoch()`` draws that epoch's
randomness exactly as ``iter(plain)`` would and returns an ``EpochSource``; ``source.take(k)`` hands out the next ``k``
batches as a ``BatchSlice`` (below); a candidate DataLoader iterates it
(``part.expect(config.in_flight())``, then ``DataLoader(..., **part.sampling(), generator=part.private_generator(),
in_order=True)``: ``Request.data_loader`` builds it so), and ``part.delivered(n)`` closes it, re-issuing what the loop
did not receive::

    plain = DataLoader(dataset, batch_size=64, shuffle=True, collate_fn=collate)
    slicer = EpochSlicer(plain)
    for epoch in range(epochs):
        source = slicer.epoch()                      # len(source) == len(plain)
        for limit, workers in ((20, 0), (20, 4), (None, 2)):    # None: the rest of the epoch
            part = source.take(limit)
            part.expect(in_flight(workers, None))
            loader = DataLoader(dataset, num_workers=workers, collate_fn=collate, **part.sampling(),
                                generator=part.private_generator(), in_order=True)
            it, n = iter(loader), 0
            for batch in it:                         # stop it early at will: a switch, or its workers died
                n += 1
                train_step(batch)
            del it                                   # stops its workers
            part.delivered(n)                        # the n batches the loop got; the rest go to the next slice
        assert source.done
"""
# NOTE [ Exact epochs across candidates ]
# Goal: whatever sequence of candidate loaders serves an epoch, the loop receives the batches one plain
# ``DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, generator)`` yields for that epoch
# (same indices, order and boundaries, each once), and each epoch leaves the user's ``generator`` and the global RNG
# exactly as the plain loader leaves them, so later epochs (and the user's own draws) stay identical.
# RNG rules, from torch/utils/data (torch 2.13):
# 1. ``iter(loader)`` (``_BaseDataLoaderIter.__init__``, dataloader.py:689-694) first calls ``iter(index_sampler)``,
#    then draws the base seed with ``torch.empty((), dtype=torch.int64).random_(generator=loader.generator)``: one draw
#    from the user's generator, or from the global RNG when it is None. ``EpochSource.__init__`` does the same two
#    steps in the same order with the same expression, and keeps the value as ``base_seed``. This order is torch's
#    internal behaviour, not API: test_slices.py compares RNG states right after ``iter()`` so a change fails a test.
# 2. Samplers draw when iterated: ``RandomSampler.__iter__`` (sampler.py:160-183) is a generator that, at the first
#    ``next()``, draws its seed from the global RNG (no generator) or uses its generator; Weighted/SubsetRandomSampler
#    draw there too; a batch sampler whose ``__iter__`` is eager draws at ``iter()``, before the base seed. The source
#    pulls from that one index iterator, in order, so the same draws happen in the same order; when the epoch is
#    served, ``finish`` asks it past its end, as the plain loader's last ``next()`` does. (A sampler that kept
#    drawing from the global RNG while it iterates could interleave differently with the loop's own draws, as prefetch
#    depth already makes it do between plain loaders of different num_workers.)
# 3. Candidates never touch the user's RNG: ``BatchSlice.private_generator`` gives each a private ``torch.Generator``
#    (seeded from ``base_seed`` and the slice's number) for its own base-seed draw, and a BatchSlice draws nothing.
#    Worker seeds therefore differ from the plain loader's, as they already do whenever num_workers changes.
# Re-issue rule: a DataLoader pulls indices ahead of what it yields: at ``iter()`` and once per yielded batch, so with
# workers up to ``num_workers * prefetch_factor`` are in flight (dataloader.py:1275, 1563-1566). A slice cannot know
# how many of its batches the loop received, so the caller says it, after it stopped iterating that candidate (end of
# slice, switch, break, dead workers): ``slice.delivered(n)``. The ``pulled - n`` undelivered batches go back, in
# order, to the front of the source and the next slice hands them out first. One slice is open at a time (or two,
# below), which keeps the order. Candidates are built with ``in_order=True``, so "the first n" is well defined.
# Two open slices (a hidden switch, NOTE [ Hidden switch ] in tuning/handover.py): ``cap(extra)`` ends a slice after the
# batches its DataLoader pulled plus ``extra`` more, which it reserves from the source at once; the next slice may
# then be taken while the capped one serves them, and starts right after them. Order still holds when the later
# slice closes first: a failure while both are open closes the later one with ``delivered(0)`` (its batches go back
# to the front), then the earlier one (its undelivered batches go back in front of those).
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

log = logging.getLogger("autoloader.online")


Indices = Any
"""What an epoch's index sampler yields: a batch of indices (a DataLoader's ``batch_sampler``), or one index (its
``sampler``, with ``batch_size=None``)."""


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
        self._source: Optional[EpochSource] = None
        self._binding = 0
        self.lookahead: Optional[int] = None
        self.through: Optional[Callable[[Indices], Indices]] = None
        """What each batch of indices passes through on its way to the DataLoader (an online probe's sample clock,
        measure/sample_clock.py); the slice keeps, and re-issues, the batches themselves."""

    def _bind(self, source: EpochSource, number: int, limit: Optional[int]) -> None:
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
    def source(self) -> EpochSource:
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
    def drawn_all(self) -> bool:
        """Its DataLoader drew every batch the slice may hand out (False while that is unknown: a sampler without a
        len())."""
        if self._source is None:
            return False
        try:
            return self._pulled >= len(self)
        except TypeError:
            return False

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
        [ Exact epochs across candidates ], 3.)."""
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


class EpochSource:
    """One epoch of an index sampler, drawn as ``iter(DataLoader)`` draws it; hands batches out lazily to slices.

    ``index_sampler`` is what a plain DataLoader iterates (its ``batch_sampler``, or its ``sampler`` when
    ``batch_size=None``); ``generator`` is the DataLoader's. Creating the source makes the epoch's RNG draws (see NOTE
    [ Exact epochs across candidates ]): create it when the plain loader's ``iter()`` would run. It materialises
    nothing beyond what the sampler itself does: it holds the sampler's iterator and at most one prefetch window of
    re-issued batches, so a 1.2M-sample epoch costs what it costs a plain DataLoader.
    """

    def __init__(self, index_sampler: Any, generator: Optional[torch.Generator] = None, *,
                 batched: bool = True) -> None:
        self._batched = batched
        """The index sampler yields batches of indices (a batch sampler), not samples (``batch_size=None``)."""
        self._it = iter(index_sampler)  # before the base seed: dataloader.py:689
        self.base_seed: int = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        try:  # after the draws, in case a __len__ draws too
            self._len: Optional[int] = len(index_sampler)
        except TypeError:
            self._len = None
        self._reissue: Deque[Indices] = collections.deque()
        self._exhausted = False
        self._open: List[BatchSlice] = []
        """Open slices, oldest first: one, or a capped one and the slice after it (a hidden switch)."""
        self._closed = 0
        """Slices closed this epoch (the next slice's number is this plus the open ones)."""
        self.position = 0
        """Batches the loop has received this epoch (from closed slices)."""
        self.drawn = 0
        """Times the index sampler was asked for a batch this epoch, the last one past its end included (NOTE
        [ Exact resume ], ``drawn``)."""

    def __len__(self) -> int:
        if self._len is None:
            raise TypeError("this epoch's sampler has no len()")
        return self._len

    def _remaining_at(self, position: int) -> Optional[int]:
        return None if self._len is None else max(0, self._len - position)

    @property
    def remaining(self) -> Optional[int]:
        """Batches not yet delivered (None when the sampler has no len())."""
        return self._remaining_at(self.position)

    @property
    def unclaimed(self) -> Optional[int]:
        """Batches no open slice holds: what a slice taken now may hand out (None when the sampler has no len())."""
        return self._remaining_at(self._next_start())

    @property
    def done(self) -> bool:
        """No slice open, nothing to re-issue, and the sampler is used up (or, with a len(), fully delivered)."""
        spent = self._exhausted or (self._len is not None and self.position >= self._len)
        return not self._open and not self._reissue and spent

    def finish(self) -> None:
        """Ask the index sampler past its end, as a plain DataLoader's epoch does before it ends (a ``RandomSampler``
        draws once more then: NOTE [ Exact epochs across candidates ], 2.). Call it once the epoch is served; a
        sampler already run out is not asked again."""
        while self._fresh() is not None:
            pass

    def take(self, limit: Optional[int] = None, *, reuse: Optional[BatchSlice] = None) -> BatchSlice:
        """The next slice: at most ``limit`` batches (None: the rest of the epoch).

        ``reuse``: bind an existing (closed) slice instead of a new one, for a DataLoader whose ``batch_sampler`` it
        already is (persistent workers keep their DataLoader across slices and epochs).
        """
        if self._open and not self._open[-1].capped:
            raise RuntimeError(f"slice {self._open[-1].number} is still open: call its delivered(n) with the number "
                               f"of batches the loop received from it (or cap() it) before taking the next slice")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None (the rest of the epoch), got {limit}")
        if reuse is not None and not reuse.reusable:
            raise RuntimeError("reuse= needs a closed slice: call its delivered(n) first")
        part = reuse if reuse is not None else BatchSlice()
        part._bind(self, self._closed + len(self._open), limit)
        self._open.append(part)
        return part

    def _next_start(self) -> int:
        """Where a slice taken now starts: after the open (capped) slice's last batch, else at ``position``."""
        if not self._open:
            return self.position
        last = self._open[-1]
        return last._start + (last._limit or 0)

    def skip(self, k: int, *, drawn: Optional[int] = None) -> None:
        """Fast-forward a fresh epoch past its first ``k`` batches, as if delivered, without loading a sample: only
        the index sampler is iterated (NOTE [ Exact resume ] in loader/resume/state.py). ``drawn``: then ask the
        sampler for more, until it was asked that many times in all (or ran out), and keep them for the next slices:
        the pulls the saver's DataLoader had made ahead of what it yielded, so their draws happen now."""
        if self._open or self.position or self._closed:
            raise RuntimeError("skip() fast-forwards a fresh epoch only: call it before the first take()")
        for name, value in (("k", k), ("drawn", k if drawn is None else drawn)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"skip({name}=...): {name} must be an int >= 0, got {value!r}")
        for _ in range(k):
            if self._pull() is None:
                raise ValueError(f"skip({k}): this epoch has only {self.position} batches; the saved state does not "
                                 f"belong to this dataset and sampler")
            self.position += 1
        while drawn is not None and self.drawn < drawn and not self._exhausted:
            batch = self._fresh()
            if batch is not None:
                self._reissue.append(batch)

    def draw(self, n: int) -> List[Optional[Indices]]:
        """The index sampler's next ``n`` batches, drawn fresh (None for each asked past its end); ``hold`` keeps
        them for the next slices (``resume`` draws twice from the same RNG states to compare)."""
        return [self._fresh() for _ in range(n)]

    def hold(self, batches: Iterable[Optional[Indices]]) -> None:
        """Serve ``batches``, drawn ahead, before any fresh one (the Nones past the sampler's end left out)."""
        self._reissue.extend(batch for batch in batches if batch is not None)

    def ends_here(self) -> bool:
        """No batch is held and the sampler has none left: asks it once more (for an epoch redrawn only to tell)."""
        return not self._reissue and self._fresh() is None

    def _pull(self) -> Optional[Indices]:
        return self._reissue.popleft() if self._reissue else self._fresh()

    def _fresh(self) -> Optional[Indices]:
        """The index sampler's next batch; None once it ran out."""
        if self._exhausted:
            return None
        self.drawn += 1
        try:
            return next(self._it)
        except StopIteration:
            self._exhausted = True
        return None

    def _close(self, part: BatchSlice, record: SliceRecord, undelivered: List[Indices]) -> SliceRecord:
        later = self._open[self._open.index(part) + 1:]
        if later and (undelivered or record.delivered < (record.limit or 0)):
            raise RuntimeError(f"slice {record.number} cannot give batches back while slice {later[0].number}, taken "
                               f"after it, is open: close the later slice first (delivered(0))")
        earlier = self._open[:self._open.index(part)]
        if earlier and record.delivered:
            raise RuntimeError(f"slice {record.number} delivered batches while slice {earlier[0].number}, taken "
                               f"before it, is still open: the earlier slice's batches come first")
        self._reissue.extendleft(reversed(undelivered))
        self._open.remove(part)
        self.position += record.delivered
        self._closed += 1
        log.debug("slice %d: delivered %d of %d pulled, %d re-issued (epoch position %d)",
                  record.number, record.delivered, record.pulled, record.reissued, self.position)
        return record


class EpochSlicer:
    """The epochs of the plain DataLoader ``reference`` (its sampler, batch sampler and generator), served in slices
    by other DataLoaders (see NOTE [ Exact epochs across candidates ])."""

    def __init__(self, reference: DataLoader) -> None:
        if isinstance(reference.dataset, IterableDataset):
            raise ValueError("an IterableDataset cannot be sliced exactly: a candidate DataLoader cannot resume "
                             "another's stream; tune it with trials (tuning='trials') instead of online")
        if getattr(reference, "in_order", True) is False:
            log.info("in_order=False is ignored while tuning online: re-issuing a candidate's undelivered batches "
                     "needs in-order delivery")
        self.reference = reference

    @property
    def index_sampler(self) -> Iterable[Indices]:
        """What a plain DataLoader iterates: its batch_sampler, or its sampler when ``batch_size=None``."""
        ref = self.reference
        return ref.batch_sampler if ref.batch_sampler is not None else ref.sampler

    def __len__(self) -> int:
        return len(self.reference)  # a TypeError when the sampler has no len(), as for the plain DataLoader

    def epoch(self) -> EpochSource:
        """Start an epoch; makes the RNG draws the plain loader's ``iter()`` makes (call ``set_epoch`` first)."""
        return EpochSource(self.index_sampler, self.reference.generator,
                           batched=self.reference.batch_sampler is not None)
