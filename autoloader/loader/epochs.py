"""Epochs as ``PrefetchLoader`` counts them: their statistics (``EpochStats``), the loader's samplers that take
``set_epoch`` and the rule that advances them when nobody did (see NOTE [ What frameworks read ] in mirror.py), and
what starting an epoch of a DataLoader draws (``epoch_iter``) and pulls (``pulls_made``).

# NOTE [ One base seed per epoch ]
# ``iter(DataLoader)`` draws one base seed for its workers from the loader's generator (the global RNG without one):
# ``torch.empty((), dtype=torch.int64).random_(generator=loader.generator)`` (dataloader.py:690, torch 2.13). With
# ``persistent_workers=True`` only the first ``iter()`` makes a new iterator; later epochs reset it and draw nothing.
# When that generator is also the sampler's (``DataLoader(shuffle=True, generator=g)``) or the sampler draws its seed
# from the global RNG, every epoch after the first is therefore another permutation with persistent workers than
# without: the order would depend on a performance knob that autoloader chooses (and an online search switches), and
# a checkpoint saved with one setting would resume on another order with the other. So ``epoch_iter`` makes the draw
# itself when a persistent iterator is reused: every epoch autoloader serves draws one base seed, as a non-persistent
# DataLoader does, and ``EpochSource`` (loader/slices.py), which redraws an epoch, always does. The drawn value is
# unused (persistent workers keep their seeds). Its place differs in one case: torch draws after ``iter(sampler)``,
# ``epoch_iter`` before it, which matters only for a batch sampler whose ``__iter__`` draws eagerly (not a generator
# function) from the same RNG; a lazy one (torch's ``BatchSampler``, any generator function) draws nothing there.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterator, List, Literal, Optional, Sequence

import torch
from torch.utils.data import DataLoader

from ..config import in_flight

logger = logging.getLogger("autoloader.prefetch")


@dataclass(frozen=True)
class EpochStats:
    """One epoch as the training loop saw it: ``loader.stats`` (the current epoch), ``loader.history`` (all).

    Timed on the host with two ``perf_counter`` calls per batch. On CUDA this is host-side waiting only: no device
    synchronisation is made, so a copy still running on the GPU when the consumer's kernels are queued is not
    counted.

    Attributes:
        epoch (int): The epoch's number (``set_epoch``'s, else counted from 0).
        batches (int): Batches handed to the loop so far.
        wall_s (float): Seconds from the epoch's start to the latest batch handed out (to its end once finished).
        wait_s (float): Of ``wall_s``, the seconds the loop spent inside ``next()`` waiting for data.
    """

    epoch: int
    batches: int
    wall_s: float
    wait_s: float

    @property
    def stall_fraction(self) -> float:
        """The share of the epoch the loop waited for data, ``wait_s / wall_s`` (0 to 1; 0 before any time passed).
        Near 0: the input pipeline keeps up; near 1: the step (the GPU) starves."""
        return stall_fraction(self.wait_s, self.wall_s)


def stall_fraction(wait_s: float, span_s: float) -> float:
    """THE stall fraction: the share of ``span_s`` seconds the loop spent waiting for data (``wait_s``), 0 to 1; 0 for
    an empty span. An epoch's (``EpochStats``), a candidate's window (``measure.window``) and a served epoch's tally
    read it here. Pure."""
    return min(1.0, max(0.0, wait_s / span_s)) if span_s > 0 else 0.0


Ahead = Literal["nothing", "item", "end"]
"""What an epoch had fetched ahead of the loop and not handed out yet (``EpochIter``, with a side stream): nothing, a
batch (or a failed one), or the epoch's end, for which the source's iterator asked its sampler past the end: a pull
a checkpoint counts (``Checkpoints.state``)."""


class EpochClock:
    """One epoch's counts as the prefetcher keeps them: ``batches`` handed out, ``failed`` ones whose loading raised
    (counted as passed by a checkpoint: NOTE [ A batch that raises ] in source.py), the loop's ``wait``."""

    __slots__ = ("epoch", "batches", "failed", "start", "end", "wait", "done")

    def __init__(self, epoch: int, start: float) -> None:
        self.epoch, self.batches, self.failed, self.start, self.end, self.wait = epoch, 0, 0, start, start, 0.0
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


def advance_epochs(loader: Any, record: Optional[Sequence[int]], *, epoch_set: bool) -> List[int]:
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


def reuses_iterator(loader: Any) -> bool:
    """``iter(loader)`` resets a persistent iterator instead of making one (and so draws no base seed)."""
    return bool(getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0
                and getattr(loader, "_iterator", None) is not None)


def epoch_iter(loader: DataLoader, *,
               forking: Callable[[Any], ContextManager[None]] = lambda _: nullcontext()) -> Iterator[Any]:
    """``iter(loader)`` for a new epoch, one base seed drawn whether or not persistent workers are reused (NOTE [ One
    base seed per epoch ]); inside ``forking(loader)`` when it starts workers (``native.limited_at_fork``), not when
    it reuses them."""
    if reuses_iterator(loader):
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        return iter(loader)
    with forking(loader):
        return iter(loader)


def pulls_made(num_workers: int, prefetch_factor: Optional[int], returned: int) -> int:
    """Index batches a DataLoader iterator has asked of its sampler once it returned ``returned`` batches: each one
    returned, plus ``num_workers * prefetch_factor`` sent ahead to the workers (dataloader.py:1275 and 1565, torch
    2.13: the priming loop of ``_reset`` and ``_process_data``). A count past the epoch's batches means the sampler
    was asked past its end (``RandomSampler`` then draws once more). Pure; tests/loader/test_epochs.py checks it
    against torch."""
    return returned + in_flight(num_workers, prefetch_factor)
