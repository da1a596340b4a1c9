"""``PrefetchLoader``: hands out batches already on the device, copied on a side CUDA stream while the consumer
works on the previous batch, optionally converted and normalised there. On the CPU it is a pass-through.

    loader = PrefetchLoader(DataLoader(ds, batch_size=64, pin_memory=True, num_workers=4),   # uint8 images
                            normalize=((123.7, 116.3, 103.5), (58.4, 57.1, 57.4)), dtype=torch.float32)
    for epoch in range(3):
        for images, labels in loader:     # on the GPU, images float32 and normalised
            train_step(images, labels)
        print(loader.stats.stall_fraction)  # share of the epoch spent waiting for data

It also answers what training frameworks read from a DataLoader (``sampler``, ``batch_sampler``, ``dataset``,
``batch_size``, ``worker_init_fn``, ``_iterator``: see NOTE [ What frameworks read ]).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import logging
import time
from typing import Any, Deque, Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from ..errors import quiet_worker_count_warning
from ..results import TuneResult
from .batch import iter_tensors, map_tensors
from .device import resolve_device, side_stream
from .epochs import EpochClock, EpochStats, advance_epochs, numbered_samplers, samplers
from .native import rewrap, users_init
from .resume import resumed_epoch, stream_rule
from .state import FORMAT, capture, check, epoch_length, epochs_of, gather, own_rank, ranks, restore
from .transform import InputTransform

logger = logging.getLogger("autoloader.prefetch")

_END = object()


class PrefetchLoader:
    """Wraps ``loader`` (a DataLoader or any iterable of batches) and yields its batches on ``device``.

    ``dtype`` then ``normalize=(mean, std)`` (per channel, in the input's units: 0-255 for uint8 images) apply to
    the input tensor only: the batch itself when it is a tensor, its first element when it is a tuple/list,
    ``batch[input_key]`` when it is a mapping. ``stats``/``history`` report the time the consumer waited for data
    (see ``EpochStats``). ``single_process`` (set by ``make_loader`` for a loader it did not shard) makes iterating
    under a multi-process ``torch.distributed`` group an error instead of every rank reading the whole dataset.
    """

    def __init__(self, loader: Iterable, *, device: Union[str, torch.device, None] = None,
                 normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
                 dtype: Optional[torch.dtype] = None, input_key: Optional[Hashable] = None,
                 tuning: Optional[TuneResult] = None, cache_key: Optional[str] = None,
                 single_process: bool = False) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be an iterable of batches (e.g. a DataLoader), got {type(loader).__name__}")
        self._transform = InputTransform(normalize=normalize, dtype=dtype, input_key=input_key)
        self._loader = loader
        self.device = resolve_device(device)
        self._tuning = tuning
        self.cache_key = cache_key
        """The cache entry holding ``tuning`` (``autotune show`` lists it); None when it is not cached."""
        self._single_process = single_process
        self._next_epoch = 0
        self._epoch_set = False
        self._sampler_epochs: Optional[List[Any]] = None
        self._clocks: List[EpochClock] = []
        self._start: Optional[Dict[str, Any]] = None  # the epoch's RNG at its start (NOTE [ Exact resume ])
        self._skipped = 0  # batches of this epoch yielded before a resume
        self._pending: Optional[Dict[str, Any]] = None  # a loaded state, applied at the next iter()
        self._stream_states: Deque[Tuple[int, Any]] = collections.deque(maxlen=3)

    @property
    def loader(self) -> Any:
        """The DataLoader in force: the one wrapped, or the one a source of several DataLoaders (online tuning's)
        says is in force (``in_force``). The prefetcher reads one batch ahead, so while the loop holds a batch this
        is the DataLoader serving the next one."""
        return getattr(self._loader, "in_force", self._loader)

    @property
    def _frame(self) -> Any:
        """What the user and frameworks see as the DataLoader (samplers, settings): the object wrapped."""
        return self._loader

    @property
    def tuning(self) -> Optional[TuneResult]:
        """What ``make_loader`` chose and why (``print`` it for the trial table); with online tuning, the decision
        in force; None for a loader you wrapped yourself."""
        return self._tuning if self._tuning is not None else getattr(self._loader, "tuning", None)

    @property
    def decisions(self) -> Tuple[Any, ...]:
        """Every online decision (``results.Decision``: epoch, config, rate, stall, why), oldest first; () without
        online tuning."""
        return tuple(getattr(self._loader, "decisions", ()))

    @property
    def online_traces(self) -> Tuple[Any, ...]:
        """Every epoch that searched online (``tuning.online.EpochTrace``), oldest first: when each batch reached the
        loop and each candidate's slice (``autoloader.cli.plot.plot_online_epoch`` draws one); () without online
        tuning."""
        return tuple(getattr(self._loader, "traces", ()))

    def __len__(self) -> int:
        return len(self._frame)  # type: ignore[arg-type]

    @property
    def dataset(self) -> Any:
        return getattr(self._frame, "dataset", None)

    @property
    def batch_size(self) -> Optional[int]:
        return getattr(self._frame, "batch_size", None)

    @property
    def stream(self) -> Optional["torch.cuda.Stream"]:
        """The side CUDA stream batches are copied on (one per device, see NOTE [ One side stream per device ]);
        None on the CPU."""
        return side_stream(self.device)

    # NOTE [ What frameworks read ]
    # Training frameworks take the loader they are given and read DataLoader attributes off it. Lightning (2.6) calls
    # ``set_epoch`` on ``loader.sampler`` and ``loader.batch_sampler.sampler`` at every epoch, never on the loader
    # itself, and shuts persistent workers down at the end of ``fit`` through ``loader._iterator``; it sets
    # ``worker_init_fn`` for ``seed_everything(workers=True)``. Accelerate leaves any object that is not a DataLoader
    # alone, and its loops never call ``set_epoch`` (its own loaders advance the epoch themselves). So a PrefetchLoader
    # forwards these to the DataLoader it wraps, and advances the samplers' epoch itself when nobody else did
    # between two epochs (``_advance_epoch``). It is not a DataLoader subclass: a framework that rebuilds loaders
    # (Lightning's ``overfit_batches``, Accelerate's ``prepare`` on ``.loader``) cannot rebuild it, and says so.

    @property
    def sampler(self) -> Any:
        return getattr(self._frame, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        return getattr(self._frame, "batch_sampler", None)

    @property
    def worker_init_fn(self) -> Any:
        """The user's (None when none): autoloader's limit of native pools is not shown (loader/native.py)."""
        return users_init(getattr(self._frame, "worker_init_fn", None))

    @worker_init_fn.setter
    def worker_init_fn(self, value: Any) -> None:
        setattr(self._frame, "worker_init_fn", rewrap(getattr(self._frame, "worker_init_fn", None), value))

    @property
    def _iterator(self) -> Any:
        """The DataLoader's persistent-workers iterator (Lightning shuts its workers down through it)."""
        return getattr(self._frame, "_iterator", None)

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        if hasattr(self._frame, "_iterator"):
            self._frame._iterator = value

    @property
    def stats(self) -> Optional[EpochStats]:
        """The latest epoch's statistics (updated at every batch), None before the first epoch."""
        return self._clocks[-1].snapshot() if self._clocks else None

    @property
    def history(self) -> Tuple[EpochStats, ...]:
        """Every epoch's statistics, oldest first."""
        return tuple(clock.snapshot() for clock in self._clocks)

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch and forward ``epoch`` to every sampler of the loader that has ``set_epoch``."""
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise TypeError(f"epoch must be an int, got {epoch!r}")
        self._next_epoch = epoch
        self._epoch_set = True
        if callable(getattr(self._frame, "set_epoch", None)):  # a source that numbers its epochs (online tuning)
            self._frame.set_epoch(epoch)
        for sampler in samplers(self._frame):
            sampler.set_epoch(epoch)

    def _advance_epoch(self) -> None:
        self._sampler_epochs = advance_epochs(self._frame, self._sampler_epochs, epoch_set=self._epoch_set)
        self._epoch_set = False

    # -- checkpoint and resume (NOTE [ Exact resume ] in state.py) ----------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Where the loop is (epoch, batches yielded) and the RNG states that redraw the epoch's order: a small dict
        of ints, lists and strings, safe for ``torch.save`` and JSON (torchdata's ``StatefulDataLoader`` protocol,
        which Lightning 2.x checkpoints). ``load_state_dict`` on a new loader resumes exactly after that batch.

        Under a torch.distributed group of several processes it is a collective (call it on every rank, as Lightning
        and Accelerate do): it holds every rank's state, so the one file rank 0 writes resumes each rank."""
        return gather(self._own_state())

    def _own_state(self) -> Dict[str, Any]:
        dataset, why = stream_rule(self._frame)
        if why:
            raise ValueError(f"state_dict(): this loader cannot be resumed exactly: {why}")
        clock, length = (self._clocks[-1] if self._clocks else None), epoch_length(self._frame)
        batches = self._skipped + clock.batches if clock is not None and not clock.done else 0
        in_epoch = clock is not None and not clock.done and (length is None or batches < length)
        batches = batches if in_epoch else 0  # after an epoch's last batch: the next epoch's start
        tuning = self.tuning
        return {"format": FORMAT, "epoch": clock.epoch if in_epoch and clock is not None else self._next_epoch,
                "batches": batches, "in_epoch": in_epoch, "length": length,
                "ranks": ranks(self._frame), "sampler_epochs": epochs_of(samplers(self._frame)),
                "sampler_record": self._sampler_epochs, "epoch_set": self._epoch_set,
                "start": self._start if in_epoch and dataset is None else None,
                "now": capture(self._frame, samplers=False),
                "stream": next((st for n, st in self._stream_states if n == batches), None) if in_epoch else None,
                "decision": tuning.config.label() if tuning is not None else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s dict at the next ``iter()``: exactly the batches the saved run would have
        yielded next, this epoch and the following ones, whatever this loader's workers, threads or decision."""
        state = own_rank(state)
        check(state, self._frame)
        if state["in_epoch"] and state["start"] is None and state["stream"] is None:
            raise ValueError("load_state_dict(state): the state has neither the epoch's RNG nor its stream position")
        for sampler, epoch in zip(numbered_samplers(self._frame), state["sampler_epochs"]):
            sampler.set_epoch(epoch)
        if callable(getattr(self._frame, "set_epoch", None)):
            self._frame.set_epoch(state["epoch"])
        self._next_epoch, self._epoch_set = state["epoch"], state["epoch_set"]
        self._sampler_epochs = state["sampler_record"]
        self._pending = state

    def _begin(self, pending: Optional[Dict[str, Any]]) -> Iterator[Any]:
        """The epoch's batches: the rest of a loaded epoch, or a fresh one (its starting RNG kept)."""
        self._skipped, self._stream_states = 0, collections.deque(maxlen=3)
        if pending is not None and pending["in_epoch"] and pending["stream"] is None:
            self._skipped, self._start = pending["batches"], pending["start"]
            return resumed_epoch(self._frame, pending)
        if pending is not None:
            restore(self._frame, pending["now"])
        if pending is not None and pending["stream"] is not None:
            self._skipped, self._start = pending["batches"], None
            stream_rule(self._frame)[0].load_state_dict(pending["stream"])
            return iter(self._loader)
        self._start = capture(self._frame, samplers=True) if not stream_rule(self._frame)[0] else None
        return iter(self._loader)

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
        return self._epoch()

    # NOTE [ Stream synchronisation ]
    # Batch i+1 is copied (and converted) on one side stream while the consumer's stream runs its step on batch i.
    # Three rules keep that correct, with no host-device synchronisation:
    # 1. Before the side stream writes batch i+1, it waits on the consumer's current stream
    #    (``side.wait_stream(consumer)``): work the consumer queued (e.g. on tensors that feed the batch) is done.
    # 2. Before batch i is handed out, the consumer stream waits on the side stream. This happens before batch i+1's
    #    copy is queued, so the consumer waits for batch i's copy only and the copy of i+1 overlaps its step.
    # 3. Each handed-out tensor was allocated on the side stream; ``record_stream(consumer)`` tells the caching
    #    allocator not to reuse its memory until the consumer's queued work on it has finished.
    # The side stream is the device's one (NOTE [ One side stream per device ] in device.py): a stream per epoch or
    # per loader strands each one's cached blocks in a pool no later stream can use (timm issue 2781).
    # On the CPU the same loop runs with ``contextlib.nullcontext()`` in place of the stream context and no copy.

    def _tuned_workers(self) -> bool:
        """True when the loader's worker count is one autoloader measured (see quiet_worker_count_warning)."""
        workers = getattr(self.loader, "num_workers", None)
        return bool(self.tuning is not None and workers and workers == getattr(self.tuning, "num_workers", None))

    def _epoch(self) -> Iterator[Any]:
        self._check_single_process()
        pending, self._pending = self._pending, None
        if pending is not None and pending["in_epoch"]:
            self._sampler_epochs, self._epoch_set = epochs_of(samplers(self._frame)), False
        else:
            self._advance_epoch()
        stream = side_stream(self.device)
        clock = EpochClock(self._next_epoch, time.perf_counter())
        self._next_epoch += 1
        self._clocks.append(clock)
        entered = clock.start
        with quiet_worker_count_warning(self._tuned_workers()):
            it = self._begin(pending)
        dataset = stream_rule(self._frame)[0]
        batch = self._fetch(it, stream, dataset, clock.batches)
        while batch is not _END:
            if stream is not None:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_stream(stream)
                for tensor in iter_tensors(batch):
                    if tensor.is_cuda:
                        tensor.record_stream(consumer)
            following = self._fetch(it, stream, dataset, clock.batches + 1)
            now = time.perf_counter()
            clock.batches += 1
            clock.wait += now - entered
            clock.end = now
            yield batch
            entered = time.perf_counter()
            batch = following
        clock.end = time.perf_counter()
        clock.wait += clock.end - entered
        clock.done = True
        logger.debug("epoch %d: %d batches in %.3f s, stall %.1f%%", clock.epoch, clock.batches,
                     clock.end - clock.start, 100.0 * clock.snapshot().stall_fraction)

    def _fetch(self, it: Iterator[Any], stream: Optional[torch.cuda.Stream], dataset: Any = None,
               number: int = 0) -> Any:
        """The next batch, copied (see NOTE [ Stream synchronisation ]) and transformed; ``_END`` when exhausted.
        ``dataset``: an IterableDataset whose state before batch ``number`` is kept for ``state_dict()``."""
        if dataset is not None:
            self._stream_states.append((self._skipped + number, copy.deepcopy(dataset.state_dict())))
        try:
            batch = next(it)
        except StopIteration:
            return _END
        if stream is None and not self._transform.active:
            return batch
        consumer = torch.cuda.current_stream(self.device) if stream is not None else None
        context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            if stream is not None:
                stream.wait_stream(consumer)
                batch = map_tensors(lambda t: t.to(self.device, non_blocking=True), batch)
            if self._transform.active:
                batch = self._transform(batch)
        return batch
