"""One epoch of a ``PrefetchLoader`` as the loop iterates it: ``EpochIter``, an iterator rather than a generator, so
that a batch whose loading raised does not end the epoch (NOTE [ A batch that raises ] in source.py). The prefetcher
opens the epoch at the first ``next()`` (``Epoch``: what to fetch, how to hand a batch out); this module only orders
fetching, handing out, raising and timing."""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional

from .epochs import Ahead, EpochClock

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
        release_reraise(exception)


def release_reraise(exception: BaseException) -> None:
    """Break the reference cycle torch makes when it re-raises a worker's exception: ``ExceptionWrapper.reraise``
    (torch/_utils.py, torch 2.13) holds the exception in a local, so exception -> traceback -> that frame ->
    exception, and the frame below it holds the DataLoader iterator. Until the next garbage collection the iterator
    and its workers stay alive, and then shut down with a 5 s join timeout per worker (their queues already
    finalised). Clearing that one frame's locals (the traceback still prints) lets them go with the exception."""
    tb = exception.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "reraise" and frame.f_globals.get("__name__") == "torch._utils":
            with contextlib.suppress(RuntimeError):  # a frame still executing cannot be cleared: left as it is
                frame.clear()
        tb = tb.tb_next


class Fetcher:
    """``fetch()``: the next of ``make()``'s items, a generator remade when a ``KeyboardInterrupt`` or ``SystemExit``
    ended it (they propagate at once). A generator because a failed batch's exception, caught in a frame it runs and
    held ahead, has a traceback that must not reach the loop's frames: a finished frame keeps its caller's frame
    (``f_back``), so an exception caught in a call made from ``EpochIter.__next__`` and then held by the iterator would
    make a cycle through the loop's frame, and keep the DataLoader iterator and its workers until a garbage collection
    (``release_reraise``); a suspended generator's frame links to no caller."""

    def __init__(self, make: Callable[[], Generator[Any, None, None]]) -> None:
        self._make = make
        self._items = make()

    def __call__(self) -> Any:
        try:
            return next(self._items)
        except BaseException:  # the generator ended with it: the next fetch starts a new one
            self._items = self._make()
            raise

    def close(self) -> None:
        """Close the items' generator and forget how to make another (its arguments hold the source's iterator): the
        source's iterator, and so its workers, are released now rather than at the next garbage collection."""
        self._items.close()
        self._make = _no_items


def _no_items() -> Generator[Any, None, None]:
    yield from ()


@dataclass(frozen=True)
class Epoch:
    """An opened epoch, as the prefetcher hands it to its iterator.

    ``fetch()``: the next item, a batch ready to hand out, ``END`` or ``Failed``; ``first(fetch)``: the first item
    (a resumed epoch's may be loaded as its saver did); ``handed(batch)``: called right before a batch is handed out
    (the stream synchronisation); ``ahead``: the next item is fetched before a batch is handed out (with a side
    stream); ``hold(ahead)``: what was fetched ahead and is held unyielded (``Ahead``; a checkpoint reads it)."""

    clock: EpochClock
    fetch: Fetcher
    first: Callable[[Callable[[], Any]], Any]
    handed: Callable[[Any], None]
    ahead: bool
    hold: Callable[[Ahead], None]


class EpochIter:
    """The iterator ``iter(PrefetchLoader)`` returns. ``start()`` opens the epoch at the first ``next()`` (an exception
    there ends it); then each ``next()`` hands out the next batch, raises a failed batch's exception and goes on at
    the next call, or ends the epoch. ``KeyboardInterrupt`` and ``SystemExit`` propagate at once; with reading ahead,
    the batch due is then handed out by the next ``next()``. ``close()`` ends the epoch where it is, as closing a
    generator does."""

    def __init__(self, start: Callable[[], Epoch]) -> None:
        self._start = start
        self._epoch: Optional[Epoch] = None
        self._done = False
        self._first = True
        self._held: Any = _NOTHING

    def __iter__(self) -> "EpochIter":
        return self

    def close(self) -> None:
        """End the epoch now: the batch held ahead is dropped, the source's iterator and the workers it holds are
        released at once (not at a garbage collection), and every later ``next()`` raises ``StopIteration``. A state
        saved before it resumes after the last batch handed out, as it would have without the close."""
        if self._done:
            return
        self._done = True
        self._held = _NOTHING
        if self._epoch is not None:
            self._epoch.hold("nothing")
            self._epoch.fetch.close()

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
            epoch.hold("nothing")
            self._tick(epoch.clock, entered, failed=int(item.consumed))
            error = item.exception
            try:
                raise error
            finally:  # no local keeps it: this frame in its traceback would hold it in a cycle (release_reraise)
                del error, item
        epoch.handed(item)
        if epoch.ahead:
            self._held = item  # a Ctrl-C while the next one loads: the next call hands this one out
            following = epoch.fetch()
            self._held = following
            epoch.hold("end" if following is END else "item")
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
        epoch.hold("nothing")
        clock = epoch.clock
        clock.end = time.perf_counter()
        clock.wait += clock.end - entered
        clock.done = True
        logger.debug("epoch %d: %d batches in %.3f s, stall %.1f%%", clock.epoch, clock.batches,
                     clock.end - clock.start, 100.0 * clock.snapshot().stall_fraction)
