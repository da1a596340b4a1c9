"""``DataLoaderMirror``: what training frameworks read of a DataLoader (``len()``, ``dataset``, ``batch_size``,
``sampler``, ``batch_sampler``, ``worker_init_fn``, ``_iterator``, the other settings read-only), answered as the
DataLoader a ``PrefetchLoader`` wraps answers it, and the epoch numbering those frameworks expect of the loader
(``set_epoch``, or the samplers' epoch advanced when nobody called it). ``PrefetchLoader`` (loader/prefetch.py) is one.

# NOTE [ What frameworks read ]
# Training frameworks take the loader they are given and read DataLoader attributes off it. Lightning (2.6) calls
# ``set_epoch`` on ``loader.sampler`` and ``loader.batch_sampler.sampler`` at every epoch, never on the loader
# itself, and shuts persistent workers down at the end of ``fit`` through ``loader._iterator``; it sets
# ``worker_init_fn`` for ``seed_everything(workers=True)``. Accelerate leaves any object that is not a DataLoader
# alone, and its loops never call ``set_epoch`` (its own loaders advance the epoch themselves). So a PrefetchLoader
# forwards these to the DataLoader it wraps, and advances the samplers' epoch itself when nobody else did
# between two epochs (``DataLoaderMirror._advance_epoch``). It is not a DataLoader subclass: a framework that rebuilds
# loaders (Lightning's ``overfit_batches``, Accelerate's ``prepare`` on ``.loader``) cannot rebuild it, and says so.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

from .epochs import advance_epochs, samplers
from .native import rewrap, users_init
from .source import Source

SETTINGS = ("num_workers", "collate_fn", "drop_last", "pin_memory", "timeout", "prefetch_factor", "persistent_workers",
            "generator", "multiprocessing_context", "in_order", "pin_memory_device")
"""The DataLoader's other public attributes, read-only on a ``PrefetchLoader`` as the wrapped DataLoader's (tuned:
the configuration in force, the stand-in's before ``make_loader``'s first ``iter()``); None for an iterable without
them."""


class DataLoaderMirror:
    """The DataLoader attributes of a ``Source``'s ``Source.template`` (the object wrapped, or the stand-in for it),
    and the number of the next epoch (NOTE [ What frameworks read ])."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self._next_epoch = 0
        """The number the next epoch gets (``set_epoch``, else one more than the last)."""
        self._epoch_set = False
        """Whether ``set_epoch`` was called since the last epoch started."""
        self._sampler_epochs: Optional[List[int]] = None
        """The samplers' epochs as ``_advance_epoch`` last left them; None before the first epoch."""

    @property
    def _template(self) -> Any:
        """What the user and frameworks see as the DataLoader (samplers, settings): the object wrapped."""
        return self._source.template

    def __len__(self) -> int:
        return len(self._template)

    @property
    def dataset(self) -> Any:
        """The wrapped DataLoader's dataset (an ``autoloader.ThreadedDataset`` around yours when the configuration
        uses threads: ``autoloader.unwrap`` gives yours back); None for an iterable without one."""
        return getattr(self._template, "dataset", None)

    @property
    def batch_size(self) -> Optional[int]:
        """The wrapped DataLoader's ``batch_size``; None for an iterable without one."""
        return getattr(self._template, "batch_size", None)

    @property
    def sampler(self) -> Any:
        """The wrapped DataLoader's sampler (the ``DistributedSampler`` autoloader shards with, when it does), for
        frameworks that call its ``set_epoch``; None for an iterable without one."""
        return getattr(self._template, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        """The wrapped DataLoader's batch sampler; None for an iterable without one."""
        return getattr(self._template, "batch_sampler", None)

    @property
    def worker_init_fn(self) -> Optional[Callable[[int], Any]]:
        """The ``worker_init_fn`` you passed (None when none): autoloader's limit of the native pools, which runs
        before it, is not shown. Settable (Lightning's ``seed_everything(workers=True)`` sets it): the new function
        replaces yours and still runs after the limit."""
        return users_init(getattr(self._template, "worker_init_fn", None))

    @worker_init_fn.setter
    def worker_init_fn(self, value: Optional[Callable[[int], Any]]) -> None:
        setattr(self._template, "worker_init_fn", rewrap(getattr(self._template, "worker_init_fn", None), value))

    @property
    def _iterator(self) -> Any:
        """The DataLoader's persistent-workers iterator (Lightning shuts its workers down through it)."""
        return getattr(self._template, "_iterator", None)

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        if hasattr(self._template, "_iterator"):
            self._template._iterator = value

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch and pass ``epoch`` to every sampler of the loader that has ``set_epoch`` (its
        sampler, batch sampler and the batch sampler's sampler), so a ``DistributedSampler`` reshuffles. Optional:
        without it, each epoch advances the samplers' epoch by one.

        Args:
            epoch (int): The next epoch's number.

        Raises:
            TypeError: ``epoch`` is not an int.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise TypeError(f"epoch must be an int, got {epoch!r}")
        self._next_epoch = epoch
        self._epoch_set = True
        self._source.set_epoch(epoch)
        for sampler in samplers(self._template):
            sampler.set_epoch(epoch)

    def _advance_epoch(self) -> None:
        """As an epoch starts: the samplers' epoch advanced by one unless ``set_epoch`` numbered it since the last."""
        self._sampler_epochs = advance_epochs(self._template, self._sampler_epochs, epoch_set=self._epoch_set)
        self._epoch_set = False


def _setting(name: str) -> property:
    def read(self: DataLoaderMirror) -> Any:
        return getattr(self._template, name, None)

    read.__doc__ = f"The wrapped DataLoader's ``{name}`` (read-only; None for an iterable without one)."
    return property(read)


for _name in SETTINGS:
    setattr(DataLoaderMirror, _name, _setting(_name))
