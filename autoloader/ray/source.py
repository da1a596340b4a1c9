"""``RaySource``: a ``loader.source.Source`` whose batches come from Ray Data, in the order autoloader draws.

# NOTE [ Exact batches through Ray ]
# The order is autoloader's, never Ray's. ``template`` is the plain DataLoader the user asked for (their sampler, batch
# sampler, drop_last, generator, collate_fn; under torchrun autoloader's DistributedSampler), never iterated: each
# epoch is drawn from it by ``loader.slices.EpochSlicer`` exactly as ``iter(DataLoader)`` draws it (NOTE [ Exact
# epochs across candidates ]), its RNG draws made on the loop's thread. The epoch goes to Ray as consecutive runs
# (NOTE [ Sizing the Ray pool ], runs): each run's batches are drawn (order.py: one int64 array of their indices and
# the batches' offsets), put into Ray's object store once, and loaded by read tasks that each take a block of
# consecutive positions (pipeline.py, work.py); Ray Data hands the blocks back with ``preserve_order``, however many
# tasks ran at once and in whatever order they finished, and the driver checks every batch's place. Only the first
# run's order is drawn before the first batch; the next run's is drawn a few batches at a time while the loop trains.
# A batch whose ``__getitem__`` or ``collate_fn`` raised comes back as that exception, raised at its ``next()``
# (a ``BatchError``, NOTE [ A batch that raises ]), and the epoch goes on with the next batch, as a DataLoader's
# does; a run that fails (a worker or node that died past Ray's retries, a module missing on a node, Ray lost) ends
# the epoch with an error naming it (failures.py). A resume hands the redrawn epoch with its served batches skipped
# (NOTE [ Exact resume ] in loader/resume/state.py), so the rest of the epoch is fed and no skipped sample is loaded.
# The sampler is asked past its end when the epoch's last batch has been served, as a plain DataLoader's last
# ``next()`` asks it. What cannot be exact: random augmentation inside the dataset (it runs in Ray's workers, whose
# RNGs autoloader neither seeds nor restores), a sampler that draws from the global RNG as it is iterated (its draws
# interleave with the loop's at other points than a plain DataLoader's), and nothing survives the driver: a rank that
# dies takes its place in the epoch with it (resume from its last state_dict()).
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Optional, Tuple

from torch.utils.data import DataLoader

from ..loader.slices import EpochSlicer, EpochSource
from ..loader.source import BatchError, Source
from . import plan
from .failures import raised
from .order import Drawer
from .pipeline import Feed
from .records import RayConfig, RayTuning
from .session import Session, import_ray, open_session
from .transport import Failure
from .waits import BATCH, PUT, STARTUP, Limit, bounded

log = logging.getLogger("autoloader.ray")


class Payload:
    """The dataset and ``collate_fn`` in Ray's object store, put once per Ray session (refs die with it)."""

    def __init__(self, dataset: Any, collate_fn: Any) -> None:
        self.value = (dataset, collate_fn)
        self._ref: Any = None
        self._session: Optional[Session] = None

    def ref(self, ray: Any, session: Session) -> Any:
        if self._ref is None or self._session is not session:
            try:
                self._ref = bounded(PUT, lambda: ray.put(self.value), detail="the dataset and collate_fn")
            except (TypeError, AttributeError, ValueError) as err:
                if "pickle" not in str(err).lower() and "serializ" not in str(err).lower():
                    raise
                raise TypeError(f"engine='ray' sends the dataset and collate_fn to Ray's workers, but they cannot "
                                f"be pickled ({type(err).__name__}: {err}): define them at module level (no "
                                f"lambda, no open file or lock in the dataset)") from err
            self._session = session
        return self._ref


class RaySource(Source):
    """The epochs of ``template`` (a plain DataLoader, never iterated) loaded by Ray Data with ``tuning``'s
    ``RayConfig`` (NOTE [ Exact batches through Ray ]). ``startup`` and ``wait``: the limits on a run's first batch
    and on each batch after it (waits.py)."""

    template: DataLoader
    in_force: DataLoader
    slicer: EpochSlicer
    decisions: Tuple[Any, ...] = ()
    traces: Tuple[Any, ...] = ()

    def __init__(self, template: DataLoader, tuning: RayTuning, *, address: Optional[str], num_cpus: Optional[int],
                 pin: bool, runtime_env: Optional[dict] = None, startup: Limit = STARTUP,
                 wait: Limit = BATCH) -> None:
        self.template = self.in_force = template
        self.slicer = EpochSlicer(template)
        self._tuning, self.address, self.num_cpus, self.pin = tuning, address, num_cpus, pin
        self.runtime_env, self.startup, self.wait = runtime_env, startup, wait
        self.payload = Payload(template.dataset, template.collate_fn)
        self._current: Optional[EpochSource] = None

    def use(self, tuning: RayTuning, *, startup: Limit, wait: Limit) -> None:
        """Serve the next epochs with ``tuning``'s configuration and these limits."""
        self._tuning, self.startup, self.wait = tuning, startup, wait

    @property
    def tuning(self) -> RayTuning:
        return self._tuning

    @property
    def config(self) -> RayConfig:
        return self._tuning.config

    @property
    def epoch_source(self) -> Optional[EpochSource]:
        """The epoch being served: a checkpoint counts its sampler's pulls from it."""
        return self._current

    def set_epoch(self, epoch: int) -> None:
        """Nothing to number here: the prefetcher tells the template's samplers."""

    def epoch(self) -> Iterator[Any]:
        return self._serve(self.slicer.epoch())

    __iter__ = epoch

    def resume(self, source: EpochSource) -> Iterator[Any]:
        return self._serve(source)

    def _serve(self, source: EpochSource) -> Iterator[Any]:
        self._current = source
        return self._batches(source)

    def _feed(self, ray: Any, payload: Any, drawer: Drawer, run: int, *, first: Limit) -> Optional[Feed]:
        chunk = drawer.finish()
        if chunk is None:
            return None
        log.debug("ray run %d: batches %d to %d", run, chunk.start, chunk.start + chunk.count - 1)
        return Feed(ray, payload, chunk, self.config, first=first, wait=self.wait, pin=self.pin)

    def _batches(self, epoch: EpochSource) -> Iterator[Any]:
        config = self.config
        drawer = Drawer(epoch, batched=self.template.batch_sampler is not None)
        current: Optional[Feed] = None
        upcoming: Optional[Feed] = None
        try:
            if drawer.remaining == 0:
                epoch.finish()
                return
            session = open_session(self.address, num_cpus=self.num_cpus, runtime_env=self.runtime_env)
            ray = import_ray()
            payload = self.payload.ref(ray, session)
            drawer.begin(plan.run_blocks(0, config) * config.batches_per_task)
            current = self._feed(ray, payload, drawer, 0, first=self.startup)
            run = 1
            while current is not None:
                if upcoming is None and not drawer.exhausted:
                    if not drawer.open:
                        drawer.begin(plan.run_blocks(run, config) * config.batches_per_task)
                    drawer.pull(plan.DRAW_BITE)
                    if current.blocks_left <= plan.next_run_at(config):
                        upcoming = self._feed(ray, payload, drawer, run, first=self.wait)
                        run += 1
                try:
                    position, item = current.next()
                except StopIteration:
                    current.close()
                    current, upcoming = upcoming, None
                    continue
                yield BatchError(raised(item, position)) if isinstance(item, Failure) else item
            epoch.finish()  # asked past its end, as a plain DataLoader's last next() asks it
        finally:
            for feed in (current, upcoming):
                if feed is not None:
                    feed.close()
            drawer.close()
