"""What a ``PrefetchLoader`` wraps, declared: a ``Source`` of raw batches, epoch by epoch, that can serve the rest of
an interrupted epoch. A user's DataLoader is wrapped in ``PlainSource``, any other iterable of batches in
``IterableSource``; online tuning's ``OnlineLoader`` is a source of its own (tuning/online.py), and ``make_loader``'s
``LazySource`` (lazy.py) builds one of those at the first ``iter()``. The prefetcher only copies, converts and times
what a source hands out, and composes its checkpoint from what the source says (``Checkpoints``, NOTE [ Exact resume ]
in resume/state.py). A batch whose loading raised is ``BatchError`` (NOTE [ A batch that raises ]).

# NOTE [ A batch that raises ]
# A DataLoader's iterator survives an exception from the dataset, the ``collate_fn`` or a worker: ``next()`` raises
# it, and the next ``next()`` returns the following batch (0 or N workers; the failed batch's indices are used up).
# Users rely on it (a loop that logs a corrupt sample and goes on), so an epoch of a ``PrefetchLoader`` does the same:
# it is an iterator (``loader/epoch_iter.py``), not a generator, and an ``Exception`` from its source's iterator is
# raised at the loop's ``next()`` (with a side stream, at the ``next()`` that would have returned that batch, after
# the batch before it), then the next ``next()`` asks the source again. Whether the epoch goes on is the source's
# iterator's to say: a DataLoader's does; a generator's ends (a raise finishes a generator), so the next ``next()``
# ends the epoch. A source built on generators (online tuning's) therefore yields a ``BatchError(exception)`` in
# place of the batch instead of raising: the prefetcher raises ``exception`` at the loop's ``next()``, counts the
# batch as passed, and the source's generator goes on with the next batch. ``KeyboardInterrupt`` and ``SystemExit``
# are never wrapped: they propagate at once. A checkpoint counts a failed batch as passed (``consumed``): its indices
# were used, so a resume starts after it, as the saver's next ``next()`` would have; torch's own errors about its
# iterator (a timeout, a worker that died) used no batch, and are not counted.
# References: the exception's traceback holds the frames it passed, and a finished frame its caller's. A generator
# that makes the marker inside ``except ... as error:`` and yields it there keeps ``error`` in its suspended frame:
# a cycle (error -> traceback -> frame -> error) that keeps the generator, its DataLoader and the workers alive until
# a garbage collection. Make it in a function the generator calls (``yield loaded_or_marker(it)``), as
# ``PrefetchLoader._items`` does; torch's own re-raise of a worker's error has such a cycle, which the prefetcher
# clears (``epoch_iter.release_reraise``)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Protocol, Tuple

from torch.utils.data import DataLoader

from ..config import in_flight
from .build import rebuilt
from .epochs import epoch_iter
from .native import limited_at_fork
from .slices import EpochSlicer, EpochSource

__all__ = ["BatchError", "IterableSource", "PlainSource", "Source", "as_source", "consumed"]

_ITERATOR_ERROR = re.compile(r"DataLoader (timed out after|worker \(pid)")
"""torch's errors about its iterator rather than one batch: ``DataLoader timed out after N seconds``, ``DataLoader
worker (pid X) is killed by signal``/``exited unexpectedly`` (dataloader.py, torch 2.13)."""


class BatchError:
    """What a ``Source`` built on generators yields in place of a batch whose loading raised ``exception`` (NOTE [ A
    batch that raises ]): the prefetcher raises ``exception`` at the loop's ``next()``, counts the batch as passed, and
    asks the source for the next batch. A source whose iterator survives a raise (a DataLoader's) may raise instead.

    Attributes:
        exception (Exception): What loading the batch raised, raised unchanged at the loop's ``next()``.
    """

    __slots__ = ("exception",)

    def __init__(self, exception: Exception) -> None:
        if not isinstance(exception, Exception):
            raise TypeError(f"BatchError wraps an Exception (KeyboardInterrupt and SystemExit propagate at once), "
                            f"got {exception!r}")
        self.exception = exception

    def __repr__(self) -> str:
        return f"BatchError({self.exception!r})"


def consumed(exception: BaseException) -> bool:
    """Whether a batch that raised ``exception`` used up its place in the epoch's order (a checkpoint then resumes
    after it): any ``Exception`` but torch's own errors about its iterator, which used none (NOTE [ A batch that
    raises ])."""
    if not isinstance(exception, Exception):
        return False
    return not (isinstance(exception, RuntimeError) and _ITERATOR_ERROR.match(str(exception).strip()))


class Source(Protocol):
    """A DataLoader's stand-in under a ``PrefetchLoader``. Implementations subclass it (``as_source`` recognises
    them by that, not by their attribute names)."""

    # Read-only for the checker (an implementation may answer each with a property, or set it once), and declared
    # only for it: a property here would be inherited by the implementations at run time.
    if TYPE_CHECKING:
        @property
        def template(self) -> Any:
            """What the user and frameworks read as the DataLoader (its length, dataset, samplers, settings: NOTE
            [ What frameworks read ] in mirror.py)."""

        @property
        def in_force(self) -> Any:
            """The DataLoader serving the loop's current batch (online: a candidate's while one serves)."""

        @property
        def tuning(self) -> Any:
            """The ``TuneResult`` in force, None when the source knows of none."""

        @property
        def decisions(self) -> Tuple[Any, ...]:
            """Every online decision, oldest first; () for a source that does not tune."""

        @property
        def traces(self) -> Tuple[Any, ...]:
            """Every epoch that searched online; () for a source that does not tune."""

        @property
        def slicer(self) -> Optional[EpochSlicer]:
            """Its epochs' index order, drawn anew (a resume redraws the interrupted epoch from it); None: the source
            cannot be resumed mid-epoch."""

        @property
        def epoch_source(self) -> Optional[EpochSource]:
            """The redrawn epoch serving the current epoch, which counts its sampler's pulls exactly; None while a
            DataLoader's own iterator serves it (a checkpoint then counts the pulls from its configuration)."""

    def prepare(self) -> None:
        """Called by the prefetcher when an epoch starts, before it reads anything of the source: a source that
        defers its work until then (``lazy.LazySource``) does it now. Nothing by default."""
        return None

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch (its samplers are told by the prefetcher)."""

    def epoch(self) -> Iterator[Any]:
        """One epoch of raw batches; a batch whose loading raised is raised by ``next()`` or yielded as a
        ``BatchError`` (NOTE [ A batch that raises ])."""

    def resume(self, source: EpochSource) -> Iterator[Any]:
        """The rest of an epoch: ``source``'s batches (``slicer.epoch()``, its served batches skipped), as
        ``epoch()`` yields them."""


class PlainSource(Source):
    """A DataLoader as a ``Source``: its own epochs; the rest of an interrupted one from a DataLoader with its
    settings over the redrawn order (``build.rebuilt``)."""

    template: DataLoader
    in_force: DataLoader
    tuning = None
    decisions: Tuple[Any, ...] = ()
    traces: Tuple[Any, ...] = ()
    epoch_source = None

    def __init__(self, loader: DataLoader) -> None:
        self.template = self.in_force = loader
        self._slicer: Optional[EpochSlicer] = None

    @property
    def slicer(self) -> EpochSlicer:
        if self._slicer is None:
            self._slicer = EpochSlicer(self.template)
        return self._slicer

    def set_epoch(self, epoch: int) -> None:
        """A DataLoader numbers no epoch itself: its samplers' ``set_epoch`` is the prefetcher's to call."""

    def epoch(self) -> Iterator[Any]:
        return epoch_iter(self.template, forking=limited_at_fork)  # NOTE [ Native thread pools ], At fork

    def resume(self, source: EpochSource) -> Iterator[Any]:
        loader = self.template
        part = source.take(None)
        part.expect(in_flight(loader.num_workers, loader.prefetch_factor))
        resumed = rebuilt(loader, sampling=part.sampling(), generator=part.private_generator())
        with limited_at_fork(resumed):
            return iter(resumed)


class IterableSource(Source):
    """Any other iterable of batches (a generator, a list, another library's loader): iterated as it is; a state
    saved mid-epoch cannot resume it (its order is not autoloader's to redraw)."""

    template: Iterable[Any]
    in_force: Iterable[Any]
    tuning = None
    decisions: Tuple[Any, ...] = ()
    traces: Tuple[Any, ...] = ()
    epoch_source = None
    slicer = None

    def __init__(self, batches: Iterable[Any]) -> None:
        self.template = self.in_force = batches

    def set_epoch(self, epoch: int) -> None:
        """Nothing to number: the prefetcher calls ``set_epoch`` on whatever samplers the iterable has."""

    def epoch(self) -> Iterator[Any]:
        return iter(self.template)

    def resume(self, source: EpochSource) -> Iterator[Any]:
        raise TypeError(f"load_state_dict(state): a wrapped {type(self.template).__name__} cannot be resumed mid-epoch; "
                        f"wrap a torch.utils.data.DataLoader (or use make_loader), or start without the state")


def as_source(loader: Any) -> Source:
    """``loader`` as a ``Source``: itself when it is one (online tuning's), a DataLoader through ``PlainSource``,
    any other iterable through ``IterableSource``; a TypeError for anything else."""
    if Source in type(loader).__mro__:  # declared: a class of autoloader's that subclasses the protocol
        return loader
    if isinstance(loader, DataLoader):
        return PlainSource(loader)
    if not hasattr(loader, "__iter__"):
        raise TypeError(f"loader must be an iterable of batches (e.g. a DataLoader), got {type(loader).__name__}")
    return IterableSource(loader)

