"""``RaySource``: a ``loader.source.Source`` whose batches come from Ray Data, in the order autoloader draws.

# NOTE [ Exact batches through Ray ]
# The order is autoloader's, never Ray's. ``template`` is the plain DataLoader the user asked for (their sampler, batch
# sampler, drop_last, generator, collate_fn; under torchrun autoloader's DistributedSampler), never iterated: each
# epoch is drawn from it by ``loader.slices.EpochSlicer`` exactly as ``iter(DataLoader)`` draws it (NOTE [ Exact
# epochs across candidates ]), all of its index batches at the epoch's start (the samplers draw then, as they draw
# at a plain epoch's first batch). Ray Data gets them as rows (place, indices), loads and collates each in a task
# (work.py), and gives them back with ``preserve_order``; the driver checks every batch's place. A resume hands the
# redrawn epoch with its served batches skipped (NOTE [ Exact resume ] in loader/resume/state.py), so the rest of the epoch
# is fed and no skipped sample is loaded. What cannot be exact: random augmentation inside the dataset (it runs in
# Ray's workers, whose RNGs autoloader neither seeds nor restores), and nothing survives the driver: a rank that dies
# takes its place in the epoch with it (resume from its last state_dict()).
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Optional, Tuple

from torch.utils.data import DataLoader

from ..loader.slices import EpochSlicer, EpochSource
from ..loader.source import Source
from .pipeline import Feed
from .records import RayConfig, RayTuning
from .session import Session, import_ray, open_session

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
                self._ref = ray.put(self.value)
            except (TypeError, AttributeError, ValueError) as err:
                if "pickle" not in str(err).lower() and "serializ" not in str(err).lower():
                    raise
                raise TypeError(f"engine='ray' sends the dataset and collate_fn to Ray's workers, but they cannot "
                                f"be pickled ({type(err).__name__}: {err}): define them at module level (no "
                                f"lambda, no open file or lock in the dataset)") from err
            self._session = session
        return self._ref


class RaySource(Source):
    """The epochs of ``template`` (a plain DataLoader, never iterated) loaded by Ray Data with ``tuning``'s ``RayConfig``
    (NOTE [ Exact batches through Ray ]). ``wait_s``: the most seconds to wait for one batch."""

    template: DataLoader
    in_force: DataLoader
    slicer: EpochSlicer
    decisions: Tuple[Any, ...] = ()
    traces: Tuple[Any, ...] = ()

    def __init__(self, template: DataLoader, tuning: RayTuning, *, address: Optional[str], num_cpus: Optional[int],
                 wait_s: float, pin: bool) -> None:
        self.template = self.in_force = template
        self.slicer = EpochSlicer(template)
        self._tuning, self.address, self.num_cpus, self.wait_s, self.pin = tuning, address, num_cpus, wait_s, pin
        self.payload = Payload(template.dataset, template.collate_fn)
        self._current: Optional[EpochSource] = None

    def use(self, tuning: RayTuning, *, wait_s: float) -> None:
        """Serve the next epochs with ``tuning``'s configuration, waiting at most ``wait_s`` for a batch."""
        self._tuning, self.wait_s = tuning, wait_s

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
        part = source.take(None)
        batches = list(part)  # every index batch of the rest of the epoch, drawn now
        return self._batches(part, batches)

    def _batches(self, part: Any, batches: list) -> Iterator[Any]:
        served = 0
        feed: Optional[Feed] = None
        try:
            if batches:
                session = open_session(self.address, num_cpus=self.num_cpus)
                ray = import_ray()
                feed = Feed(ray, self.payload.ref(ray, session), batches, self.config,
                            batched=self.template.batch_sampler is not None, wait_s=self.wait_s, pin=self.pin)
                while True:
                    try:
                        _, batch = feed.next()
                    except StopIteration:
                        break
                    served += 1
                    yield batch
        finally:
            if feed is not None:
                feed.close()
            part.delivered(served)
