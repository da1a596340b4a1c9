"""One epoch of a ``PrefetchLoader`` as the loop iterates it: ``EpochIter``, an iterator rather than a generator, so
that a batch whose loading raised does not end the epoch (NOTE [ A batch that raises ] in source.py). The prefetcher
opens the epoch at the first ``next()`` (``Epoch``: what to fetch, how to hand a batch out); this module only orders
fetching, handing out, raising and timing."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .epochs import EpochClock

logger = logging.getLogger("autoloader.prefetch")

END = object()
"""What ``Epoch.fetch`` returns once the source's epoch is exhausted."""
_NOTHING = object()


class Failed:
    """What ``Epoch.fetch`` returns for a batch whose loading raised ``exception``; ``consumed``: it used up its place in
    the epoch's order (``source.consumed``), so a checkpoint counts it as passed."""

    __slots__ = ("exception", "consumed")

    def __init__(self, exception: Exception, consumed: bool) -> None:
        self.exception, self.consumed = exception, consumed


@dataclass(frozen=True)
class Epoch:
    """An opened epoch, as the prefetcher hands it to its iterator.

    ``fetch()``: the next item, a batch ready to hand out, ``END`` or ``Failed``; ``first(fetch)``: the first item
    (a resumed epoch's may be loaded as its saver did); ``handed(batch)``: called right before a batch is handed out
    (the stream synchronisation); ``ahead``: the next item is fetched before a batch is handed out (with a side
    stream); ``hold(flag)``: whether an item fetched ahead is held unyielded (a checkpoint reads it)."""

    clock: EpochClock
    fetch: Callable[[], Any]
    first: Callable[[Callable[[], Any]], Any]
    handed: Callable[[Any], None]
    ahead: bool
    hold: Callable[[bool], None]


class EpochIter:
    """The iterator ``iter(PrefetchLoader)`` returns. ``start()`` opens the epoch at the first ``next()`` (an exception
    there ends it); then each ``next()`` hands out the next batch, raises a failed batch's exception and goes on at
    the next call, or ends the epoch. ``KeyboardInterrupt`` and ``SystemExit`` propagate at once; with reading ahead,
    the batch due is then handed out by the next ``next()``."""

    def __init__(self, start: Callable[[], Epoch]) -> None:
        self._start = start
        self._epoch: Optional[Epoch] = None
        self._done = False
        self._first = True
        self._held: Any = _NOTHING

    def __iter__(self) -> "EpochIter":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        entered = time.perf_counter()
        if self._epoch is None:
            try:
                self._epoch = self._start()
            except BaseException:
                self._done = True
                raise
            entered = self._epoch.clock.start
        epoch = self._epoch
        item = self._take(epoch)
        if item is END:
            self._finish(epoch, entered)
            raise StopIteration
        if isinstance(item, Failed):
            epoch.hold(False)
            self._tick(epoch.clock, entered, failed=int(item.consumed))
            raise item.exception
        epoch.handed(item)
        if epoch.ahead:
            self._held = item  # a Ctrl-C while the next one loads: the next call hands this one out
            following = epoch.fetch()
            self._held = following
            epoch.hold(following is not END)
        self._tick(epoch.clock, entered, batches=1)
        return item

    def _take(self, epoch: Epoch) -> Any:
        if self._held is not _NOTHING:
            item, self._held = self._held, _NOTHING
            return item
        if self._first:
            self._first = False
            return epoch.first(epoch.fetch)
        return epoch.fetch()

    @staticmethod
    def _tick(clock: EpochClock, entered: float, *, batches: int = 0, failed: int = 0) -> None:
        now = time.perf_counter()
        clock.batches += batches
        clock.failed += failed
        clock.wait += now - entered
        clock.end = now

    def _finish(self, epoch: Epoch, entered: float) -> None:
        self._done = True
        epoch.hold(False)
        clock = epoch.clock
        clock.end = time.perf_counter()
        clock.wait += clock.end - entered
        clock.done = True
        logger.debug("epoch %d: %d batches in %.3f s, stall %.1f%%", clock.epoch, clock.batches,
                     clock.end - clock.start, 100.0 * clock.snapshot().stall_fraction)
