"""Tuning inside the training loop: ``OnlineLoader`` is a DataLoader-like source whose first epoch is the trial, and
which searches again when the regime changes. ``PrefetchLoader`` wraps it as it wraps a DataLoader.

# NOTE [ Online switching ]
# While a search runs (search/online_plan.py: where it starts, where it jumps, NOTE [ Online convergence ]), an epoch
# is served by a sequence of candidate DataLoaders, each over the next consecutive slice of that epoch's batch order
# (``loader.slices.EpochSlicer``, NOTE [ Exact epochs across candidates ]): the loop gets exactly the batches the plain
# DataLoader would give for the epoch. Each candidate is one ``measure.run.Run`` (NOTE [ Trial timing ]) in
# ``mode="candidate"``: timed from the loop's own requests, its window opened once its burst drained and closed in
# time and confidence (measure/window_rule.py), with the host paced to the GPU.
# - Decisions flow one way. The epoch scheduler (NOTE [ Online epoch scheduler ] in phases.py) reads each run's
#   window between batches; once it is complete it tells the search (``OnlineSearch.tell``, with the epoch's number),
#   which says outright whether it keeps this very configuration (it serves on, no restart) or moves on. The search's
#   ``TuneResult`` becomes the decision, which ``OnlineSearch`` alone holds: it goes to ``decisions`` and to the cache
#   slot (``source="online"``); the plain DataLoader, what frameworks read, is rebuilt with it.
# - Switching. The next candidate starts while the measured one serves the batches it holds in flight (NOTE [ Hidden
#   switch ] in handover.py); then the measured one is stopped in a helper thread (``serving.Serving.stop``; a failed
#   candidate is stopped at once, NOTE [ Process cleanup ]). A failed candidate's batches the loop did not get, and a
#   measured one's when the ranks cannot hide the switch, are re-issued to the next one. What the loop waited for while
#   candidates started and stopped is ``Decision.switch_s``. When the search ends, the rest of the epoch runs with the
#   choice. A candidate the epoch's end cuts short counts with what its window measured; one whose window had not
#   opened before the loader drew the epoch's last batch (NOTE [ Trial timing ], 6.) goes on next epoch
#   (``MAX_ATTEMPTS``), on the same persistent workers (kept as the decision's are, below: no second fork).
# - The decision's workers. Stages are built with persistent workers (unless the user fixed them off), so the stage
#   that serves the decision to the epoch's end is not stopped: its DataLoader, over a slice the next epochs rebind
#   (``EpochSource.take(reuse=...)``), serves them on with the same workers (``mode="serve"``; the epoch's index order
#   is still the slicer's, so checkpoints count its pulls there). Without such a stage, a steady epoch makes one. A
#   decision without persistent workers, a failure or a new decision shuts them down; a ``break`` does not (as a plain
#   DataLoader's persistent workers). A search that starts again from the decision measures it on those workers
#   (no restart: a re-tune had made a steady epoch 10 % slower forking them again); they go as soon as a stage of
#   another configuration is built. Nothing else holds them: once the loader goes, they go.
# - Failures. Signals are guarded as in trials (NOTE [ Asynchronous exceptions ]), with worker deaths held until our
#   own code checks, so they never land in the user's step. A candidate whose workers die is recorded as failed
#   (``failures.classify``); its undelivered batches are re-issued, so no sample is lost or repeated. The user's own
#   exceptions (dataset, collate) and Ctrl-C surface unchanged after the candidate's workers are reaped.
# - Ranks. Under torch.distributed, every rank agrees after each candidate batch whether to stop (all windows
#   complete, or a candidate failed anywhere) before handing the batch out, so all ranks switch at the same batch
#   index; the search agrees on every figure (NOTE [ One decision across ranks ]).
# - Re-tuning (search/retune.py). After an epoch with the decision in force, ``retune`` compares its steady rate and
#   stall (``tally.Tally``) with the first epoch the decision served and with its window's stall: when loading
#   became the bottleneck, the next epoch searches again from the configuration in force either way; when it ran
#   faster, or hardly waited for data with more than one worker (once per decision), it tries only fewer workers.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Protocol, Tuple

import psutil
from torch.utils.data import DataLoader

from ..config import LoaderConfig
from ..coordination import Coordinator
from ..loader.slices import BatchSlice, EpochSlicer, EpochSource
from ..loader.source import Source
from ..consumer import Consumer
from ..measure.run import Run, served
from ..measure.window import WindowSpec
from ..request import Request
from ..results import Decision, EpochTrace, TuneResult
from .stand_in import DataLoaderStandIn
from .handover import Stage
from .plan import Plan
from .scheduler import EpochScheduler

__all__ = ["EpochTrace", "OnlineLoader"]

log = logging.getLogger("autoloader.online")


class Searcher(Plan, Protocol):
    """What an online loader reads of the search behind it (``online_search.OnlineSearch``), beyond the scheduler's
    ``Plan``: the decision in force, every decision, the search in progress, the re-tune rule after a steady epoch."""

    coordinator: Coordinator
    decision: TuneResult
    decisions: List[Decision]

    @property
    def searching(self) -> bool:
        ...

    def after_epoch(self, epoch: int, rate: Optional[float], stall: Optional[float]) -> None:
        ...


@dataclass(frozen=True)
class KeptPool:
    """The decision's DataLoader with persistent workers, over a slice rebound to each epoch (NOTE [ Online
    switching ], the decision's workers), and those workers: a search again from the decision measures them; or a
    candidate's carried to the next epoch, which measures it on them."""

    loader: DataLoader
    batch_slice: BatchSlice
    config: LoaderConfig
    workers: Tuple[psutil.Process, ...] = ()


class OnlineLoader(DataLoaderStandIn, Source):
    """The epochs of one loader tuned in its own training loop (see NOTE [ Online switching ]): from scratch when
    the search starts undecided, else re-tuning from its decision when an epoch's rate or stall moves away
    (``retune``). A ``loader.source.Source``: a ``PrefetchLoader`` wraps it; it answers as the DataLoader in force
    (``DataLoaderStandIn``)."""

    slicer: EpochSlicer
    """The plain DataLoader's epochs, redrawn (a resume redraws the interrupted epoch from it)."""

    def __init__(self, request: Request, search: "Searcher", *, retune: bool) -> None:
        """``search``: the ``online_search.OnlineSearch`` behind the epochs (``OnlineSearch.create``)."""
        self.request, self.retune, self.search = request, retune, search
        self.coordinator = search.coordinator
        self.consumer = Consumer(None, request.device)
        self._traces: List[EpochTrace] = []
        self._overrides: dict = {}
        self._built = self.search.decision
        self.plain = self._build(self._built.config)
        self.slicer = EpochSlicer(self.plain)
        self._scheduler: Optional[EpochScheduler] = None
        self._next_epoch = 0
        self._steady_loader: Optional[KeptPool] = None
        """The decision's DataLoader with persistent workers, over a slice rebound to each epoch (NOTE [ Online
        switching ], the decision's workers): kept from the stage that served the decision at the end of an epoch,
        or made at a steady epoch's start."""
        self._steady_source: Optional[EpochSource] = None
        self._last_run: Optional[Run] = None
        """The run that served last (the next epoch's first window waits for its workers to be reaped)."""

    @property
    def template(self) -> "OnlineLoader":
        """Frameworks read this loader itself as the DataLoader (``DataLoaderStandIn``)."""
        return self

    @property
    def traces(self) -> Tuple[EpochTrace, ...]:
        """Every epoch that searched, oldest first."""
        return tuple(self._traces)

    @property
    def tuning(self) -> TuneResult:
        return self.search.decision

    @property
    def decisions(self) -> Tuple[Decision, ...]:
        return tuple(self.search.decisions)

    @property
    def searching(self) -> bool:
        return self.search.searching

    @property
    def in_force(self) -> DataLoader:
        """The DataLoader serving the loop's current batch: a candidate's while one serves, the decision's during a
        steady epoch, else (between epochs) the plain one."""
        scheduler = self._scheduler
        if scheduler is not None and scheduler.in_force is not None:
            return scheduler.in_force
        serving = self._steady_source is not None and self._steady_loader is not None
        return self._steady_loader.loader if serving and self._steady_loader is not None else self.plain

    @property
    def epoch_source(self) -> Optional[EpochSource]:
        """The redrawn epoch serving this epoch's slices (NOTE [ Exact resume ] in loader/resume/state.py: a
        checkpoint counts its sampler's pulls there); None between epochs."""
        return self._scheduler.source if self._scheduler is not None else self._steady_source

    @property
    def serving_loader(self) -> DataLoader:
        """The DataLoader whose persistent workers outlive an epoch (the decision's), else the plain one: what a
        framework shuts down through ``_iterator`` (``DataLoaderStandIn``)."""
        return self._steady_loader.loader if self._steady_loader is not None else self.plain

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch (its decisions and trace say it)."""
        self._next_epoch = epoch

    # -- the epochs ---------------------------------------------------------------------------------------------
    def epoch(self) -> Iterator[Any]:
        """One epoch of raw batches: candidates while searching, else the plain DataLoader (then maybe re-tune)."""
        epoch = self._begin()
        return self._steady(epoch) if not self.searching else self._in_slices(self.slicer.epoch(), epoch)

    __iter__ = epoch

    def resume(self, source: EpochSource) -> Iterator[Any]:
        """The rest of an epoch that ``source`` (``slicer.epoch()``, fast-forwarded by ``skip``) holds: candidates
        while searching, else the decision (NOTE [ Exact resume ] in loader/resume/state.py)."""
        return self._in_slices(source, self._begin())

    def _begin(self) -> int:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return epoch

    def _in_slices(self, source: EpochSource, epoch: int) -> Iterator[Any]:
        """An epoch served slice by slice (NOTE [ Online epoch scheduler ] in phases.py)."""
        trace = EpochTrace(epoch, time.perf_counter())
        if self.searching:
            self._traces.append(trace)
        scheduler = self._scheduler = EpochScheduler(source, plan=self.search, build=self._stage,
                                                     coordinator=self.coordinator, trace=trace, after=self._last_run)
        try:
            yield from scheduler.batches()
            if scheduler.kept is not None:  # the stage that served the decision to the end serves on
                (run, batch_slice), scheduler.kept = scheduler.kept, None
                if self._steady_loader is None or self._steady_loader.loader is not run.serving.loader:
                    self._drop_steady()
                self._steady_loader = KeptPool(run.serving.loader, batch_slice, run.config,
                                               tuple(run.serving.processes.current()))
        finally:
            self._last_run, self._scheduler = scheduler.last, None  # no cycle keeps the workers past the loader
            self._rebuild()

    def _stage(self, source: EpochSource, after: Optional[Run], bound_s: Callable[[int], float]) -> Stage:
        """The next slice of ``source`` and its run: the search's candidate (measured, its window bounded to
        ``bound_s(workers)`` seconds) or the decision (served)."""
        self._rebuild()
        candidate = self.search.candidate
        config = candidate.config if candidate is not None else self.search.decision.config
        kept, workers = self._steady_loader, None
        if kept is not None and kept.config.same_candidate(config) and kept.batch_slice.reusable:
            loader, batch_slice = kept.loader, source.take(None, reuse=kept.batch_slice)  # NOTE [ Online switching ]
            batch_slice.expect(config.in_flight())
            workers, self._steady_loader = kept.workers, None  # the run holds them now: its stop stops them
        else:
            self._drop_steady()  # another configuration starts: the decision's idle workers go now
            batch_slice = source.take(None)
            batch_slice.expect(config.in_flight())
            try:
                loader = self._build(config, sampling=batch_slice.sampling(),
                                     generator=batch_slice.private_generator(), in_order=True,
                                     persistent_workers=self._persistent(config), measured=candidate is not None)
            except BaseException:
                batch_slice.delivered(0)
                raise
        spec = WindowSpec("probe" if candidate is not None and candidate.probe else "candidate",
                          bound_s(config.num_workers))
        run = Run(loader, config, mode="candidate" if candidate is not None else "serve", consumer=self.consumer,
                  batch_size=self.request.batch_size, window=spec)
        if workers is not None:
            run.serving.adopt(workers)
        if after is not None:
            run.follows(after)
        run.window.memory_check = candidate.memory if candidate is not None else None  # NOTE [ Memory budget ]
        return Stage(batch_slice, run, candidate, pools=loader.worker_init_fn)

    def _persistent(self, config: LoaderConfig) -> bool:
        """Whether a stage's DataLoader keeps its workers past its epoch: with workers, unless the user said no, so
        that the stage serving the decision at the epoch's end serves the next epochs too (NOTE [ Online
        switching ]); a candidate switched away from is stopped all the same."""
        return bool(config.num_workers) and self.request.fixed.get("persistent_workers", True) is not False

    def _steady(self, epoch: int) -> Iterator[Any]:
        """An epoch with the decision in force, served by its DataLoader with persistent workers over a slice of the
        whole epoch (kept from the stage that served the decision last, else made now), then maybe a re-tune."""
        self._scheduler = None
        config = self.search.decision.config
        source = self._steady_source = self.slicer.epoch()
        kept = self._steady_loader
        batch_slice = source.take(None, reuse=kept.batch_slice if kept is not None else None)
        batch_slice.expect(config.in_flight())
        if kept is None:
            try:
                loader = self._build(config, sampling=batch_slice.sampling(), generator=batch_slice.private_generator(),
                                     in_order=True, persistent_workers=config.persistent_workers)
            except BaseException:
                batch_slice.delivered(0)
                raise
            kept = self._steady_loader = KeptPool(loader, batch_slice, config)
        run = Run(kept.loader, config, mode="serve", consumer=self.consumer, batch_size=self.request.batch_size,
                  owned=False)
        failed = True
        try:
            yield from served(run, until_complete=False)
            failed = False
        except GeneratorExit:  # a break: the workers wait for the next epoch, as a plain DataLoader's do
            failed = False
            raise
        finally:
            batch_slice.delivered(run.record.delivered)
            self._steady_source = None
            if failed or not config.persistent_workers:
                self._drop_steady()  # a failure, or no persistent workers: the next epoch starts afresh
            elif self._steady_loader is kept and not kept.workers:
                self._steady_loader = dataclasses.replace(kept, workers=tuple(run.serving.processes.current()))
        source.finish()
        if self.retune:
            self.search.after_epoch(epoch, *run.rate_and_stall)

    def _drop_steady(self) -> None:
        """The decision's persistent workers shut down (their DataLoader's iterator dropped)."""
        kept, self._steady_loader = self._steady_loader, None
        if kept is not None and getattr(kept.loader, "_iterator", None) is not None:
            kept.loader._iterator = None

    # -- the decision's DataLoader ------------------------------------------------------------------------------
    def _build(self, config: LoaderConfig, **forced: Any) -> DataLoader:
        return self.request.data_loader(config, **{**forced, **self._overrides})

    def _rebuild(self) -> None:
        """A new decision: the plain DataLoader rebuilt with it (the old one's persistent workers shut down)."""
        if self.search.decision is self._built:
            return
        previous, self._built = self.plain, self.search.decision
        if getattr(previous, "_iterator", None) is not None:
            previous._iterator = None  # persistent workers of the old configuration: shut down
        kept = self._steady_loader
        if kept is not None and not self._built.config.same_candidate(kept.config):
            self._drop_steady()
        self.plain = self._build(self._built.config)
        self.slicer = EpochSlicer(self.plain)

