"""Epochs as ``PrefetchLoader`` counts them: their statistics (``EpochStats``), the loader's samplers that take
``set_epoch``, and the rule that advances them when nobody did (see NOTE [ What frameworks read ] in prefetch.py)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, List, Sequence

logger = logging.getLogger("autoloader.prefetch")


@dataclass(frozen=True)
class EpochStats:
    """One epoch as the consumer saw it: ``wait_s`` is the time spent inside ``next()`` waiting for data.

    On CUDA this is host-side waiting only: no device synchronisation is made, so a copy still running on the GPU
    when the consumer's kernels are queued is not counted.
    """

    epoch: int
    batches: int
    wall_s: float
    wait_s: float

    @property
    def stall_fraction(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0


class EpochClock:
    __slots__ = ("epoch", "batches", "start", "end", "wait", "done")

    def __init__(self, epoch: int, start: float) -> None:
        self.epoch, self.batches, self.start, self.end, self.wait = epoch, 0, start, start, 0.0
        self.done = False

    def snapshot(self) -> EpochStats:
        return EpochStats(self.epoch, self.batches, self.end - self.start, self.wait)


def samplers(loader: Any) -> List[Any]:
    """The loader's samplers that have ``set_epoch``, each once: its sampler, batch sampler, batch sampler's
    sampler."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    found: List[Any] = []
    for sampler in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        if callable(getattr(sampler, "set_epoch", None)) and all(sampler is not f for f in found):
            found.append(sampler)
    return found




def numbered_samplers(loader: Any) -> List[Any]:
    """``samplers(loader)`` that hold an int ``epoch`` (what the epoch rule and a checkpoint read)."""
    return [s for s in samplers(loader) if isinstance(getattr(s, "epoch", None), int)]


def advance_epochs(loader: Any, record: Sequence[int], *, epoch_set: bool) -> List[int]:
    """At an epoch's start: when neither ``set_epoch`` on the loader (``epoch_set``) nor anyone on the samplers
    themselves changed their ``epoch`` since the last epoch started (``record``), advance it by one, as Accelerate's
    loaders do, so a ``DistributedSampler`` reshuffles every epoch. Returns the new record."""
    found = numbered_samplers(loader)
    epochs = [s.epoch for s in found]
    if found and list(record or ()) == epochs and not epoch_set:
        for sampler in found:
            sampler.set_epoch(sampler.epoch + 1)
        logger.debug("nobody called set_epoch since the last epoch: advanced the samplers to %s",
                     [s.epoch for s in found])
    return [s.epoch for s in found]
