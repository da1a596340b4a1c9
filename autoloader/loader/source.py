"""What a ``PrefetchLoader`` wraps, declared: a ``Source`` of raw batches, epoch by epoch, that can serve the rest of
an interrupted epoch. A user's DataLoader is wrapped in ``PlainSource``, any other iterable of batches in
``IterableSource``; online tuning's ``OnlineLoader`` is a source of its own (tuning/online.py). The prefetcher only
copies, converts and times what a source hands out, and composes its checkpoint from what the source says
(``Checkpoints``, NOTE [ Exact resume ] in state.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Protocol, Tuple

from torch.utils.data import DataLoader

from ..config import in_flight
from .build import rebuilt
from .epochs import epoch_iter
from .slices import EpochSlicer, EpochSource

__all__ = ["IterableSource", "PlainSource", "Source", "as_source"]


class Source(Protocol):
    """A DataLoader's stand-in under a ``PrefetchLoader``. Implementations subclass it (``as_source`` recognises
    them by that, not by their attribute names)."""

    # Read-only for the checker (an implementation may answer each with a property, or set it once), and declared
    # only for it: a property here would be inherited by the implementations at run time.
    if TYPE_CHECKING:
        @property
        def frame(self) -> Any:
            """What the user and frameworks read as the DataLoader (its length, dataset, samplers, settings: NOTE
            [ What frameworks read ] in prefetch.py)."""

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

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch (its samplers are told by the prefetcher)."""

    def epoch(self) -> Iterator[Any]:
        """One epoch of raw batches."""

    def resume(self, source: EpochSource) -> Iterator[Any]:
        """The rest of an epoch: ``source``'s batches (``slicer.epoch()``, its served batches skipped)."""


class PlainSource(Source):
    """A DataLoader as a ``Source``: its own epochs; the rest of an interrupted one from a DataLoader with its
    settings over the redrawn order (``rest_of``)."""

    frame: DataLoader
    in_force: DataLoader
    tuning = None
    decisions: Tuple[Any, ...] = ()
    traces: Tuple[Any, ...] = ()
    epoch_source = None

    def __init__(self, loader: DataLoader) -> None:
        self.frame = self.in_force = loader
        self._slicer: Optional[EpochSlicer] = None

    @property
    def slicer(self) -> EpochSlicer:
        if self._slicer is None:
            self._slicer = EpochSlicer(self.frame)
        return self._slicer

    def set_epoch(self, epoch: int) -> None:
        """A DataLoader numbers no epoch itself: its samplers' ``set_epoch`` is the prefetcher's to call."""

    def epoch(self) -> Iterator[Any]:
        return epoch_iter(self.frame)

    def resume(self, source: EpochSource) -> Iterator[Any]:
        loader = self.frame
        part = source.take(None)
        part.expect(in_flight(loader.num_workers, loader.prefetch_factor))
        return iter(rebuilt(loader, sampling=part.sampling(), generator=part.private_generator()))


class IterableSource(Source):
    """Any other iterable of batches (a generator, a list, another library's loader): iterated as it is; a state
    saved mid-epoch cannot resume it (its order is not autoloader's to redraw)."""

    frame: Iterable[Any]
    in_force: Iterable[Any]
    tuning = None
    decisions: Tuple[Any, ...] = ()
    traces: Tuple[Any, ...] = ()
    epoch_source = None
    slicer = None

    def __init__(self, batches: Iterable[Any]) -> None:
        self.frame = self.in_force = batches

    def set_epoch(self, epoch: int) -> None:
        """Nothing to number: the prefetcher calls ``set_epoch`` on whatever samplers the iterable has."""

    def epoch(self) -> Iterator[Any]:
        return iter(self.frame)

    def resume(self, source: EpochSource) -> Iterator[Any]:
        raise TypeError(f"load_state_dict(state): a wrapped {type(self.frame).__name__} cannot be resumed mid-epoch; "
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

