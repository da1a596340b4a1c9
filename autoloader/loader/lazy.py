"""``LazySource``: the ``Source`` ``make_loader`` returns, whose real source (a DataLoader with the decision, or online
tuning's) is built at the first ``iter()``, so that making the loader reads nothing of the dataset and starts no
process, as constructing a DataLoader does (NOTE [ Nothing before iter() ]).

# NOTE [ Nothing before iter() ]
# ``DataLoader(dataset, ...)`` reads no sample and starts no worker; users build it early (a framework's hook, a
# module's constructor), set attributes of the dataset afterwards, and expect a broken sample to surface where the
# epoch reaches it, from ``next()``. So ``make_loader`` only checks its arguments and builds a stand-in DataLoader with
# the user's arguments and the knobs they fixed (constructing it raises what a DataLoader raises there, and it answers
# ``len()``, ``dataset``, ``sampler``, ``batch_sampler`` and the other attributes until the first ``iter()``); the
# cache key, the lookup and any trials run at the first ``next()`` of the first epoch (``prepare``), then every
# question goes to the real source. A ``worker_init_fn`` set before then (Lightning's ``seed_everything``) is carried
# over, as is ``set_epoch``/``load_state_dict``'s epoch number. The cache key reads no sample either
# (cache/fingerprint.py): the first batch served is checked against the one the entry was tuned on (``first_batch``,
# ``cache.slot.Slot.observe``). An explicit ``tuning="trials"`` still tunes inside ``make_loader`` (``prepare`` called
# there), as documented.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Tuple

from torch.utils.data import DataLoader

from ..results import Decision, EpochTrace, TuneResult
from .native import rewrap, users_init
from .slices import EpochSlicer, EpochSource
from .source import BatchError, Source

__all__ = ["LazySource", "Resolved"]

log = logging.getLogger("autoloader")

_UNSET = object()
_OWN = frozenset({"_stand_in", "_resolve", "_pending", "_resolved", "_epoch", "_init", "_first", "_slicer",
                  "current", "resolved"})


@dataclass(frozen=True)
class Resolved:
    """What ``LazySource.prepare`` builds: the real ``source``; ``tuning``, the result behind a source that knows none
    itself (a DataLoader with a cached or tuned decision); ``cache_key``, the entry holding it; ``first_batch``, called
    once with the first batch the loop gets (the cache entry's check)."""

    source: Source
    tuning: Optional[TuneResult] = None
    cache_key: Optional[str] = None
    first_batch: Optional[Callable[[Any], None]] = None


class LazySource(Source):
    """``stand_in`` (a DataLoader with the user's arguments, never iterated) answers as the DataLoader until the first
    epoch starts, and ``pending`` as its tuning; then ``resolve()`` builds the real source, which serves every epoch
    and answers every question (NOTE [ Nothing before iter() ]). An exception from ``resolve()`` leaves it
    unresolved: the next epoch tries again."""

    def __init__(self, stand_in: DataLoader, resolve: Callable[[], Resolved], *, pending: Optional[TuneResult] = None) -> None:
        self._stand_in, self._resolve, self._pending = stand_in, resolve, pending
        self._resolved: Optional[Resolved] = None
        self._epoch: Optional[int] = None
        self._init: Any = _UNSET  # a worker_init_fn set before the real source exists
        self._first: Optional[Callable[[Any], None]] = None
        self._slicer: Optional[EpochSlicer] = None

    # -- what it answers as the DataLoader ----------------------------------------------------------------------
    @property
    def template(self) -> "LazySource":
        """This source itself: it answers as the stand-in, then as the real source's template."""
        return self

    @property
    def current(self) -> Any:
        """What answers as the DataLoader now: the stand-in before the first epoch, then the real source's template."""
        return self._resolved.source.template if self._resolved is not None else self._stand_in

    @property
    def resolved(self) -> bool:
        return self._resolved is not None

    def __len__(self) -> int:
        return len(self.current)

    def __getattr__(self, name: str) -> Any:
        """The attributes of ``current`` (dataset, sampler, batch_sampler, batch_size, generator, num_workers, ...)."""
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self.current, name)

    @property
    def worker_init_fn(self) -> Any:
        return getattr(self.current, "worker_init_fn", None)

    @worker_init_fn.setter
    def worker_init_fn(self, value: Any) -> None:
        """Set on ``current``; before the first epoch, also remembered for the real source."""
        if self._resolved is None:
            self._init = value
        setattr(self.current, "worker_init_fn", value)

    @property
    def _iterator(self) -> Any:
        return getattr(self.current, "_iterator", None)

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        if hasattr(self.current, "_iterator"):
            self.current._iterator = value

    # -- the Source protocol ------------------------------------------------------------------------------------
    @property
    def in_force(self) -> Any:
        return self._resolved.source.in_force if self._resolved is not None else self._stand_in

    @property
    def tuning(self) -> Optional[TuneResult]:
        """The real source's decision in force, else the result it was built with; ``pending`` (the stand-in's
        configuration, ``source="pending"``) before the first epoch."""
        if self._resolved is None:
            return self._pending
        own = self._resolved.source.tuning
        return own if own is not None else self._resolved.tuning

    @property
    def cache_key(self) -> Optional[str]:
        return self._resolved.cache_key if self._resolved is not None else None

    @property
    def decisions(self) -> Tuple[Decision, ...]:
        return tuple(self._resolved.source.decisions) if self._resolved is not None else ()

    @property
    def traces(self) -> Tuple[EpochTrace, ...]:
        return tuple(self._resolved.source.traces) if self._resolved is not None else ()

    @property
    def slicer(self) -> Optional[EpochSlicer]:
        if self._resolved is not None:
            return self._resolved.source.slicer
        if self._slicer is None:
            self._slicer = EpochSlicer(self._stand_in)
        return self._slicer

    @property
    def epoch_source(self) -> Optional[EpochSource]:
        return self._resolved.source.epoch_source if self._resolved is not None else None

    def prepare(self) -> None:
        """Build the real source (the first epoch's start, or ``make_loader`` with ``tuning="trials"``)."""
        if self._resolved is not None:
            return
        resolved = next(_isolated(self._resolve))
        source = resolved.source
        if self._epoch is not None:
            source.set_epoch(self._epoch)
        if self._init is not _UNSET:
            template = source.template
            setattr(template, "worker_init_fn", rewrap(getattr(template, "worker_init_fn", None), users_init(self._init)))
        self._resolved, self._first, self._slicer = resolved, resolved.first_batch, None

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        if self._resolved is not None:
            self._resolved.source.set_epoch(epoch)

    def epoch(self) -> Iterator[Any]:
        self.prepare()
        assert self._resolved is not None  # prepare() built it or raised
        return self._watched(self._resolved.source.epoch())

    def resume(self, source: EpochSource) -> Iterator[Any]:
        self.prepare()
        assert self._resolved is not None  # prepare() built it or raised
        return self._watched(self._resolved.source.resume(source))

    def _watched(self, it: Iterator[Any]) -> Iterator[Any]:
        return _FirstBatch(it, self._seen) if self._first is not None else it

    def _seen(self, batch: Any) -> None:
        """The first batch the loop gets: handed to ``first_batch`` once; its failure never reaches the loop."""
        first, self._first = self._first, None
        if first is None:
            return
        try:
            first(batch)
        except Exception as exc:  # noqa: B036 - a check of the cache entry must not break the user's epoch
            log.warning("autoloader: checking the first batch against the cache entry failed: %r", exc)


def _isolated(call: Callable[[], Resolved]) -> Iterator[Resolved]:
    """``call()`` made in a generator's frame: the frames below it (the trials) then link to no caller once it is
    suspended, so a reference cycle among them (an exception a failed trial left in a frame) cannot hold the loop's
    frames, and through them its iterator and workers, until a garbage collection."""
    yield call()


class _FirstBatch:
    """``it`` as it is (an iterator that survives a raise stays one), calling ``seen`` with its first batch."""

    def __init__(self, it: Iterator[Any], seen: Callable[[Any], None]) -> None:
        self._it: Iterator[Any] = iter(it)
        self._seen: Optional[Callable[[Any], None]] = seen

    def __iter__(self) -> "_FirstBatch":
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        if self._seen is not None and not isinstance(item, BatchError):
            seen, self._seen = self._seen, None
            seen(item)
        return item
