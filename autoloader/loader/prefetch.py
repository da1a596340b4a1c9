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
``batch_size``, ``worker_init_fn``, ``_iterator``: see NOTE [ What frameworks read ]).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from ..distributed import gather_states
from ..errors import quiet_worker_count_warning
from ..results import TuneResult
from .batch import iter_tensors, map_tensors
from .device import resolve_device, side_stream
from .epochs import EpochClock, EpochStats, advance_epochs, samplers
from .checkpoint import Checkpoints, ends_epoch
from .native import rewrap, users_init
from .resume import stream_rule
from .source import as_source
from .state import FORMAT, epochs_of
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
        self._source = as_source(loader)
        self._transform = InputTransform(normalize=normalize, dtype=dtype, input_key=input_key)
        self.device = resolve_device(device)
        self._tuning = tuning
        self.cache_key = cache_key
        """The cache entry holding ``tuning`` (``autotune show`` lists it); None when it is not cached."""
        self._single_process = single_process
        self._next_epoch = 0
        self._epoch_set = False
        self._sampler_epochs: Optional[List[Any]] = None
        self._clocks: List[EpochClock] = []
        self._checkpoints = Checkpoints()
        self._held = False  # a batch fetched ahead, not yet yielded (with a side stream)

    @property
    def loader(self) -> Any:
        """The DataLoader in force: the one wrapped, or the one online tuning's source says is in force
        (``Source.in_force``). With a side stream the prefetcher reads one batch ahead, so while the loop holds a
        batch this is the DataLoader serving the next one."""
        return self._source.in_force

    @property
    def _frame(self) -> Any:
        """What the user and frameworks see as the DataLoader (samplers, settings): the object wrapped."""
        return self._source.frame

    @property
    def tuning(self) -> Optional[TuneResult]:
        """What ``make_loader`` chose and why (``print`` it for the trial table); with online tuning, the decision
        in force; None for a loader you wrapped yourself."""
        return self._tuning if self._tuning is not None else self._source.tuning

    @property
    def decisions(self) -> Tuple[Any, ...]:
        """Every online decision (``results.Decision``: epoch, config, rate, stall, why), oldest first; () without
        online tuning."""
        return tuple(self._source.decisions)

    @property
    def online_traces(self) -> Tuple[Any, ...]:
        """Every epoch that searched online (``tuning.online.EpochTrace``), oldest first: when each batch reached the
        loop and each candidate's slice (``autoloader.cli.plot.plot_online_epoch`` draws one); () without online
        tuning."""
        return tuple(self._source.traces)

    def __len__(self) -> int:
        return len(self._frame)

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
        self._source.set_epoch(epoch)
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
        tuning = self.tuning
        own = self._checkpoints.state(self._source, clock=self._clocks[-1] if self._clocks else None,
                                      next_epoch=self._next_epoch, held=self._held,
                                      sampler_record=self._sampler_epochs, epoch_set=self._epoch_set,
                                      decision=tuning.config.label() if tuning is not None else None)
        return gather_states(own, format=FORMAT)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s dict at the next ``iter()``: exactly the batches the saved run would have
        yielded next, this epoch and the following ones, whatever this loader's workers, threads or decision.
        A state that cannot resume this loader exactly (another dataset, sampler, batch size, world size, or a
        damaged state) raises a ``ValueError`` saying what differs."""
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
    # On the CPU the same loop runs with ``contextlib.nullcontext()`` in place of the stream context, no copy, and
    # nothing read ahead (``reads_ahead``): the next batch is fetched when the loop asks for it. Reading ahead loads
    # batch i+1 (and makes its RNG draws, with num_workers=0) before the loop's draws after batch i; a checkpoint
    # taken then keeps what it needs to load that batch again (NOTE [ Exact resume ], ``ahead``, in state.py).

    def _tuned_workers(self) -> bool:
        """True when the loader's worker count is one autoloader measured (see quiet_worker_count_warning)."""
        workers = getattr(self.loader, "num_workers", None)
        return bool(self.tuning is not None and workers and workers == getattr(self.tuning, "num_workers", None))

    def _epoch(self) -> Iterator[Any]:
        self._check_single_process()
        pending = self._checkpoints.pending
        if pending is not None and pending.in_epoch and not ends_epoch(pending):
            self._sampler_epochs, self._epoch_set = epochs_of(samplers(self._frame)), False
        else:
            self._advance_epoch()
        stream = side_stream(self.device)
        ahead = reads_ahead(stream)
        clock = EpochClock(self._next_epoch, time.perf_counter())
        self._next_epoch += 1
        self._clocks.append(clock)
        entered = clock.start
        dataset = stream_rule(self._frame)[0]
        with quiet_worker_count_warning(self._tuned_workers()):
            it = self._checkpoints.begin(self._source, stream_dataset=dataset)
        self._held = False

        def fetch() -> Any:
            return self._fetch(it, stream, dataset, ahead)

        batch = self._checkpoints.fetched(fetch)  # a resumed epoch's first batch may be loaded as its saver did
        while batch is not _END:
            if stream is not None:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_stream(stream)
                for tensor in iter_tensors(batch):
                    if tensor.is_cuda:
                        tensor.record_stream(consumer)
            following = fetch() if ahead else None
            self._held = ahead and following is not _END
            now = time.perf_counter()
            clock.batches += 1
            clock.wait += now - entered
            clock.end = now
            yield batch
            entered = time.perf_counter()
            batch = following if ahead else fetch()
        self._held = False
        clock.end = time.perf_counter()
        clock.wait += clock.end - entered
        clock.done = True
        logger.debug("epoch %d: %d batches in %.3f s, stall %.1f%%", clock.epoch, clock.batches,
                     clock.end - clock.start, 100.0 * clock.snapshot().stall_fraction)

    def _fetch(self, it: Iterator[Any], stream: Optional[torch.cuda.Stream], dataset: Any, ahead: bool) -> Any:
        """The next batch, copied (see NOTE [ Stream synchronisation ]) and transformed; ``_END`` when exhausted.
        ``ahead``: it will be held while the loop works on the previous one (see ``Checkpoints.before_fetch``)."""
        if ahead:
            self._checkpoints.before_fetch(self._source, dataset)
        try:
            batch = next(it)
        except StopIteration:
            return _END
        if stream is None and not self._transform.active:
            return batch
        consumer = torch.cuda.current_stream(self.device) if stream is not None else None
        context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            if stream is not None and consumer is not None:  # both or neither
                stream.wait_stream(consumer)
                batch = map_tensors(lambda t: t.to(self.device, non_blocking=True), batch)
            if self._transform.active:
                batch = self._transform(batch)
        return batch


def reads_ahead(stream: Optional["torch.cuda.Stream"]) -> bool:
    """Whether the prefetcher fetches the next batch before handing out the current one: only with a side stream,
    so that its copy overlaps the consumer's step (NOTE [ Stream synchronisation ]); on the CPU nothing would overlap,
    and reading ahead would load (and draw for) a batch before the loop's own draws, unlike a plain DataLoader."""
    return stream is not None
