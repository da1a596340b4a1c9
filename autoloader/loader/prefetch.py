"""``PrefetchLoader``: hands out batches already on the device, copied on a side CUDA stream while the consumer
works on the previous batch, optionally converted and normalised there. On the CPU it is a pass-through: it reads
nothing ahead, so the loop sees what the plain DataLoader gives, in the same order as its own RNG draws.

    loader = PrefetchLoader(DataLoader(ds, batch_size=64, pin_memory=True, num_workers=4),   # uint8 images
                            normalize=((123.7, 116.3, 103.5), (58.4, 57.1, 57.4)), dtype=torch.float32)
    for epoch in range(3):
        for images, labels in loader:     # on the GPU, images float32 and normalised
            train_step(images, labels)
        print(loader.stats.stall_fraction)  # share of the epoch spent waiting for data

It also answers what training frameworks read from a DataLoader (``sampler``, ``batch_sampler``, ``dataset``,
``batch_size``, ``worker_init_fn``, ``_iterator``: ``DataLoaderMirror``, NOTE [ What frameworks read ] in
loader/mirror.py); how a batch reaches the device is loader/stream_copy.py's (NOTE [ Stream synchronisation ]).
"""
from __future__ import annotations

import time
from functools import partial
from typing import Any, Dict, Generator, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from ..distributed import gather_states
from ..errors import quiet_worker_count_warning
from ..results import Decision, EpochTrace, TuneResult
from .device import resolve_device, side_stream
from .epoch_iter import Epoch, EpochIter, Fetcher
from .epochs import Ahead, EpochClock, EpochStats, samplers
from .mirror import DataLoaderMirror
from .resume.checkpoint import Checkpoints, ends_epoch
from .resume.redraw import stream_rule
from .resume.state import FORMAT, epochs_of
from .source import as_source
from .stream_copy import handed, load, reads_ahead
from .transform import InputTransform


class PrefetchLoader(DataLoaderMirror):
    """Yields the batches of ``loader`` already on ``device``: what ``make_loader`` returns, or a wrapper of your own.

    On CUDA, batch i+1 is copied with ``non_blocking=True`` on one side stream per device while your step runs on
    batch i, converted and normalised there (NOTE [ Stream synchronisation ] in ``autoloader/loader/stream_copy.py``,
    NOTE [ One side stream per device ] in ``autoloader/loader/device.py``). Batches of any nesting (tuples, lists,
    namedtuples, dicts) are moved; other objects pass through. On the CPU it reads nothing ahead: the loop gets the
    DataLoader's own objects in the DataLoader's order and RNG draws. It answers what training frameworks read of a
    DataLoader (``len()``, ``dataset``, ``batch_size``, ``sampler``, ``batch_sampler``, ``worker_init_fn``; the other
    DataLoader attributes, ``num_workers``, ``drop_last``, ..., read-only: ``mirror.SETTINGS``), and when nothing
    called ``set_epoch`` between two epochs it advances its samplers' epoch itself, so a ``DistributedSampler``
    reshuffles every epoch in Accelerate-style loops too (NOTE [ What frameworks read ] in
    ``autoloader/loader/mirror.py``). A ``break`` mid-epoch and a new epoch after it are fine.

    Example:
        loader = PrefetchLoader(DataLoader(ds, batch_size=64, pin_memory=True, num_workers=4), device="cuda",
                                normalize=((123.7, 116.3, 103.5), (58.4, 57.1, 57.4)), dtype=torch.float32)

    Args:
        loader: What to wrap: a ``torch.utils.data.DataLoader`` (checkpoints resume it exactly mid-epoch), or any
            iterable of batches (iterated as it is; a state saved mid-epoch cannot resume it).
        device: Where batches go: a ``torch.device`` or a name (``"cuda"``, ``"cuda:1"``, ``"cpu"``). Default None:
            the current CUDA device when CUDA is available, else ``"cpu"``.
        normalize: ``(mean, std)``, one number per channel in the input's own units (0-255 for uint8 images),
            applied to the input tensor after ``dtype``. Default None: none.
        dtype (torch.dtype): The input tensor converted to it on the device (e.g. ``torch.float32``). Default None.
        input_key: For mapping batches, the key of the input tensor ``normalize``/``dtype`` apply to; otherwise the
            input is the batch itself when it is a tensor, else its first element. Default None.
        tuning (TuneResult): The tuning behind ``loader`` (``make_loader`` passes it), shown by ``tuning``. Default
            None.
        cache_key (str): The cache entry holding ``tuning`` (``make_loader`` passes it). Default None.
        single_process (bool): Set by ``make_loader`` for a loader it did not shard: iterating it under a
            ``torch.distributed`` group of several processes is then an error instead of every rank reading the
            whole dataset. Default False.

    Attributes:
        device (torch.device): Where batches go, resolved (``cuda:{index}`` or ``cpu``).
        cache_key (str): The cache entry holding ``tuning`` (``autotune show`` lists it); None when not cached.

    Raises:
        TypeError: ``loader`` is not iterable; ``device``, ``normalize`` or ``dtype`` of the wrong type.
        ValueError: An unknown or unavailable ``device`` (e.g. ``"cuda"`` without CUDA); ``normalize`` with an
            unequal number of channels in ``mean`` and ``std``, a zero ``std``, or an integer ``dtype``.
        RuntimeError: On iteration, with ``single_process``, when several ``torch.distributed`` processes iterate
            it (call ``make_loader`` after ``init_process_group``, or pass ``distributed=False``).
    """

    def __init__(self, loader: Iterable, *, device: Union[str, torch.device, None] = None,
                 normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
                 dtype: Optional[torch.dtype] = None, input_key: Optional[Hashable] = None,
                 tuning: Optional[TuneResult] = None, cache_key: Optional[str] = None,
                 single_process: bool = False) -> None:
        super().__init__(as_source(loader))
        self._transform = InputTransform(normalize=normalize, dtype=dtype, input_key=input_key)
        self.device = resolve_device(device)
        self._tuning = tuning
        self._cache_key = cache_key
        self._single_process = single_process
        self._clocks: List[EpochClock] = []
        self._checkpoints = Checkpoints()
        self._ahead: Ahead = "nothing"  # fetched ahead of the loop, not handed out yet (with a side stream)

    @property
    def cache_key(self) -> Optional[str]:
        """The cache entry holding ``tuning`` (``autotune show`` lists it); None when it is not cached (and, for
        ``make_loader``'s, before the first ``iter()``, which looks it up)."""
        return self._cache_key if self._cache_key is not None else getattr(self._source, "cache_key", None)

    @property
    def loader(self) -> Any:
        """The DataLoader in force: the one wrapped, or, tuned online, the candidate's serving now (after the
        search, a plain DataLoader with the decision). With a side stream the prefetcher reads one batch ahead, so
        while the loop holds a batch this is the DataLoader serving the next one. Never pass it to a framework that
        shards (Accelerate's ``prepare``): pass the ``PrefetchLoader``."""
        return self._source.in_force

    @property
    def tuning(self) -> Optional[TuneResult]:
        """What ``make_loader`` chose and why, a ``TuneResult`` (``print`` it for the candidates' table): tuned
        online, the decision in force (before the first decision, a placeholder saying so, ``source="online"``);
        ``source="pending"`` for ``make_loader``'s before its first ``iter()``; None for a loader you wrapped
        yourself."""
        return self._tuning if self._tuning is not None else self._source.tuning

    @property
    def decisions(self) -> Tuple[Decision, ...]:
        """Every online decision, oldest first; () without online tuning. Each is a ``Decision(epoch, config,
        samples_per_s, stall_fraction, why, candidates, search_s, switch_s)``: the configuration that served from
        ``epoch`` on, what it measured, why its search ran (first tuning, or the re-tune rule that fired), and the
        candidates and seconds its search took (``help(autoloader.results.Decision)``)."""
        return tuple(self._source.decisions)

    @property
    def online_traces(self) -> Tuple[EpochTrace, ...]:
        """Every epoch that searched online (``autoloader.results.EpochTrace``), oldest first: when each batch
        reached the loop and each candidate's slice (``autoloader.cli.plot.plot_online_epoch`` draws one); () without
        online tuning."""
        return tuple(self._source.traces)

    @property
    def stream(self) -> Optional["torch.cuda.Stream"]:
        """The side CUDA stream batches are copied on (one per device, see NOTE [ One side stream per device ]);
        None on the CPU."""
        return side_stream(self.device)

    @property
    def stats(self) -> Optional[EpochStats]:
        """The latest epoch's ``EpochStats`` (updated at every batch): its batches, seconds, and the share of them
        the loop waited for data (``stall_fraction``); None before the first epoch."""
        return self._clocks[-1].snapshot() if self._clocks else None

    @property
    def history(self) -> Tuple[EpochStats, ...]:
        """Every epoch's ``EpochStats``, oldest first."""
        return tuple(clock.snapshot() for clock in self._clocks)

    # -- checkpoint and resume (NOTE [ Exact resume ] in resume/state.py) ----------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """A checkpoint of where the loop is, to resume exactly with ``load_state_dict`` (torchdata's
        ``StatefulDataLoader`` protocol, which Lightning 2.x checkpoints; Accelerate:
        ``accelerator.register_for_checkpointing(loader)``). Any time in the loop, or between epochs (then it
        resumes at the next epoch's start).

        Under a ``torch.distributed`` group of several processes it is a collective (call it on every rank, as
        Lightning and Accelerate do): it holds every rank's state, so the one file rank 0 writes resumes each rank.
        How it resumes exactly: NOTE [ Exact resume ] in ``autoloader/loader/resume/state.py``.

        Returns:
            dict: A small dict of ints, lists and strings (20-45 KB: the RNG states), safe for ``torch.save`` and
            JSON: the epoch, the batches yielded, the RNG states that redraw the epoch's order (torch's, Python's
            and numpy's global RNGs, every generator on the loader and its samplers, a sampler's own
            ``state_dict()``), the decision in force, and a digest that refuses an edited state.

        Raises:
            ValueError: The loader cannot be resumed exactly: an ``IterableDataset`` without its own
                ``state_dict()``, or one loaded by workers (only ``num_workers=0`` reads its position).
        """
        tuning = self.tuning
        own = self._checkpoints.state(self._source, clock=self._clocks[-1] if self._clocks else None,
                                      next_epoch=self._next_epoch, ahead=self._ahead,
                                      sampler_record=self._sampler_epochs, epoch_set=self._epoch_set,
                                      decision=tuning.config.label() if tuning is not None else None)
        return gather_states(own, format=FORMAT)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from a ``state_dict()`` at the next ``iter()``: exactly the batches the saved run would have yielded
        next (same samples, order and batch boundaries), this epoch and the following ones, and the loop's own draws
        from torch's, Python's and numpy's RNGs continue as they would have. Call it on a new loader before
        ``iter()``; no skipped sample is loaded.

        May differ from the saved run: ``num_workers``, ``persistent_workers``, ``prefetch_factor``, threads,
        pinning, the tuning mode and the decision (even an online search saved mid-search). May not: the dataset's
        kind and length, the sampler and batch sampler, ``batch_size``, ``drop_last``, ``shuffle``, the generators,
        the world size and rank. Not exact: random augmentation inside workers (other worker seeds); RNG draws made
        between this call and the first ``iter()`` are overwritten.

        Args:
            state (dict): What ``state_dict()`` returned (e.g. read back with ``torch.load``).

        Raises:
            ValueError: The state cannot resume this loader exactly, before a batch is served: it was saved with
                another dataset, sampler, batch sampler, ``batch_size``, ``drop_last``, ``shuffle``, generator,
                epoch length or world size (the message names it); it was edited or truncated after
                ``state_dict()`` made it (its digest); a sampler whose RNG autoloader cannot see drew another order
                (give it ``state_dict()`` or a ``torch.Generator``); or an ``IterableDataset`` cannot take it.
            TypeError: The wrapped iterable is not a DataLoader, and the state was saved mid-epoch.
        """
        parsed = self._checkpoints.load(state, self._source)
        number = parsed.epoch + 1 if ends_epoch(parsed) else parsed.epoch
        self._source.set_epoch(number)
        self._next_epoch, self._epoch_set = number, parsed.epoch_set
        self._sampler_epochs = parsed.sampler_record

    def _check_single_process(self) -> None:
        if not self._single_process or not (dist.is_available() and dist.is_initialized()):
            return
        world = dist.get_world_size()
        if world > 1:
            raise RuntimeError(
                f"autoloader: this loader was made before torch.distributed was initialised, so it is not sharded, "
                f"but it is now iterated by {world} processes: every rank would read the whole dataset. Call "
                f"make_loader after init_process_group (Lightning: return it from train_dataloader(), not before "
                f"Trainer.fit), or pass distributed=False if every rank should read everything")

    def __iter__(self) -> Iterator[Any]:
        """An epoch: an iterator whose ``next()`` raises a batch's exception and goes on with the following batch at
        the next call, as a DataLoader's does (NOTE [ A batch that raises ] in ``autoloader/loader/source.py``)."""
        return EpochIter(self._open_epoch)

    def _tuned_workers(self) -> bool:
        """True when the loader's worker count is one autoloader measured (see quiet_worker_count_warning)."""
        workers = getattr(self.loader, "num_workers", None)
        return bool(self.tuning is not None and workers and workers == getattr(self.tuning, "num_workers", None))

    def _open_epoch(self) -> Epoch:
        """The epoch the loop's first ``next()`` starts: the source prepared (``make_loader`` tunes there), the
        samplers' epoch advanced, a loaded state applied, the source's iterator begun."""
        self._check_single_process()
        self._source.prepare()
        pending = self._checkpoints.pending
        if pending is not None and pending.in_epoch and not ends_epoch(pending):
            self._sampler_epochs, self._epoch_set = epochs_of(samplers(self._template)), False
        else:
            self._advance_epoch()
        stream = side_stream(self.device)
        ahead = reads_ahead(stream)
        clock = EpochClock(self._next_epoch, time.perf_counter())
        self._next_epoch += 1
        self._clocks.append(clock)
        dataset = stream_rule(self._template)[0]
        with quiet_worker_count_warning(self._tuned_workers()):
            it = self._checkpoints.begin(self._source, stream_dataset=dataset)
        self._ahead = "nothing"
        fetch = Fetcher(partial(self._items, it, stream, dataset, ahead))
        return Epoch(clock, fetch=fetch, first=self._checkpoints.fetched, handed=partial(handed, stream, self.device),
                     ahead=ahead, hold=self._hold)

    def _hold(self, ahead: Ahead) -> None:
        self._ahead = ahead

    def _items(self, it: Iterator[Any], stream: Optional[torch.cuda.Stream], dataset: Any,
               ahead: bool) -> Generator[Any, None, None]:
        """The epoch's items, one per fetch (``Fetcher``: a generator, so a failed batch's traceback makes no cycle).
        ``ahead``: each will be held while the loop works on the previous one (see ``Checkpoints.before_fetch``)."""
        while True:
            if ahead:
                self._checkpoints.before_fetch(self._source, dataset)
            yield load(it, stream, self.device, self._transform)
