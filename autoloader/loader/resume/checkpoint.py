"""A ``PrefetchLoader``'s checkpoint bookkeeping: what each epoch keeps so that ``state_dict()`` can say where the
loop is (``Checkpoints.state``), and how the first epoch after ``load_state_dict()`` starts (``Checkpoints.begin``).
NOTE [ Exact resume ] in state.py says what the state holds and why."""
from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Callable, Dict, Iterator, List, Optional

from torch.utils.data import DataLoader

from ..epochs import Ahead, EpochClock, numbered_samplers, pulls_made, samplers
from ..slices import EpochSource
from .redraw import check_next_order, ended_at, redrawn, stream_rule
from .rng import Ambient, RngState, parts_of
from .state import LoaderState, check, epoch_length, epochs_of, own_rank, ranks, sampling_of

log = logging.getLogger("autoloader.prefetch")


class Checkpoints:
    """Per epoch: its starting RNG states, the batches a resume skipped, the redrawn epoch serving the rest (its
    pulls are then counted exactly), and what was taken before the batch held ahead was loaded; a loaded state until
    the next ``iter()``."""

    def __init__(self) -> None:
        self._start: Optional[RngState] = None
        self._skipped = 0
        self._source: Optional[EpochSource] = None
        self._ahead_rng: Optional[Ambient] = None
        self._ahead_stream: Any = None
        self._pending: Optional[LoaderState] = None
        self._pending_json: Optional[Dict[str, Any]] = None
        self._replay: Optional[LoaderState] = None

    @property
    def pending(self) -> Optional[LoaderState]:
        """A loaded state not applied yet (the next ``iter()`` applies it)."""
        return self._pending

    # -- saving -----------------------------------------------------------------------------------------------------
    def state(self, source: Any, *, clock: Optional[EpochClock], next_epoch: int, ahead: Ahead,
              sampler_record: Optional[List[int]], epoch_set: bool, decision: Optional[str]) -> Dict[str, Any]:
        """This rank's state, JSON-safe. ``source`` is what PrefetchLoader wraps (its ``in_force`` the DataLoader
        serving: online, a candidate's), ``ahead`` what was fetched ahead and not yet yielded: a batch is held (its
        RNGs and stream position are the ones before it), and either one, or the epoch's end, was a pull of the
        sampler the saver made (after its last batch a ``RandomSampler`` with a generator has then drawn once more,
        which the resumer must not draw again)."""
        template = source.template
        if self._pending_json is not None:
            return self._pending_json  # loaded, not iterated yet: the loaded position (torchdata's rule)
        dataset, why = stream_rule(template)
        if why:
            raise ValueError(f"state_dict(): this loader cannot be resumed exactly: {why}")
        held = ahead == "item"
        in_epoch = clock is not None and not clock.done
        passed = clock.batches + clock.failed if clock is not None else 0  # a failed batch used its indices
        batches = self._skipped + passed if in_epoch else 0
        stream = None
        if dataset is not None:  # between epochs too: where the stream's next epoch starts (NOTE [ Exact resume ])
            stream = self._ahead_stream if in_epoch and held else copy.deepcopy(dataset.state_dict())
        return LoaderState(
            epoch=clock.epoch if in_epoch and clock is not None else next_epoch, batches=batches, in_epoch=in_epoch,
            length=epoch_length(template), sampling=sampling_of(template), ranks=ranks(template),
            sampler_epochs=epochs_of(samplers(template)), sampler_record=sampler_record, epoch_set=epoch_set,
            start=self._start if in_epoch and dataset is None else None,
            now=RngState.take(parts_of(template), samplers=not in_epoch), ahead=self._ahead_rng if held else None,
            drawn=self._drawn(source, passed + (ahead != "nothing")) if in_epoch else None,
            stream=stream, decision=decision).to_json()

    def _drawn(self, source: Any, returned: int) -> Optional[int]:
        epoch = self._source if self._source is not None else source.epoch_source
        if epoch is not None:
            return epoch.drawn
        in_force = source.in_force
        if not isinstance(in_force, DataLoader):
            return None
        return pulls_made(in_force.num_workers, in_force.prefetch_factor, returned)

    def before_fetch(self, source: Any, dataset: Any) -> None:
        """Before fetching a batch that will be held ahead: the stream's state and, when the main process loads it,
        the ambient RNGs (NOTE [ Exact resume ], ``ahead``)."""
        self._ahead_stream = copy.deepcopy(dataset.state_dict()) if dataset is not None else None
        self._ahead_rng = Ambient.take() if getattr(source.in_force, "num_workers", 0) == 0 else None

    # -- loading ----------------------------------------------------------------------------------------------------
    def load(self, state: Any, source: Any) -> LoaderState:
        """Check ``state`` (this rank's part) against ``source`` and keep it for the next ``iter()``."""
        template = source.template
        own = own_rank(state)
        parsed = LoaderState.from_json(own)
        check(parsed, template)
        if parsed.stream is not None:
            dataset, why = stream_rule(template)
            if dataset is None:
                raise ValueError(f"load_state_dict(state): the state resumes an IterableDataset's stream, but this "
                                 f"loader cannot: {why or 'its dataset is not an IterableDataset'}")
        for sampler, epoch in zip(numbered_samplers(template), parsed.sampler_epochs):
            sampler.set_epoch(epoch)
        if parsed.rest_of_epoch and parsed.length is None and parsed.start is not None and parsed.drawn is not None \
                and ended_at(source, start=parsed.start, batches=parsed.batches, drawn=parsed.drawn):
            parsed = dataclasses.replace(parsed, length=parsed.batches)  # after its last batch, as with a len()
        self._pending, self._pending_json = parsed, own
        return parsed

    def begin(self, source: Any, *, stream_dataset: Any) -> Iterator[Any]:
        """The epoch's raw batches from ``source``: the rest of a loaded epoch, or a fresh one with its starting RNG
        states kept."""
        template = source.template
        pending, self._pending, self._pending_json = self._pending, None, None
        self._skipped, self._source, self._replay = 0, None, None
        self._ahead_rng = self._ahead_stream = None
        parts = parts_of(template)
        if pending is not None and pending.rest_of_epoch and not ends_epoch(pending):
            self._skipped, self._start = pending.batches, pending.start
            self._source = _redrawn(source, pending)
            self._replay = pending if pending.ahead is not None else None
            return source.resume(self._source)
        if pending is not None and pending.rest_of_epoch:
            _redrawn(source, pending).finish()  # after the last batch: the pulls the saver still had to make
        elif pending is not None and pending.stream is not None and pending.in_epoch:
            self._skipped, self._start = pending.batches, None
            _load_stream(stream_dataset, pending.stream)
            it = source.epoch()
            pending.now.put(parts, samplers=False)  # iter() drew a base seed the saver drew at its epoch's start
            self._replay = pending if pending.ahead is not None else None
            return it
        elif pending is not None:
            if pending.stream is not None:  # saved between epochs: the stream's next epoch starts where it said
                _load_stream(stream_dataset, pending.stream)
            check_next_order(source, pending.now)  # puts every saved state back
        self._start = RngState.take(parts, samplers=True) if stream_dataset is None else None
        return source.epoch()

    def fetched(self, fetch: Callable[[], Any]) -> Any:
        """``fetch()``, the epoch's first batch: a resumed one whose saver had loaded it ahead in the main process is
        loaded from the ambient RNGs it was loaded from, then the loop's are put back (NOTE [ Exact resume ])."""
        replay, self._replay = self._replay, None
        if replay is None or replay.ahead is None:
            return fetch()
        replay.ahead.put()
        try:
            return fetch()
        finally:
            replay.now.ambient.put()


def _redrawn(source: Any, state: LoaderState) -> EpochSource:
    if state.start is None or state.drawn is None:
        raise ValueError("load_state_dict(state): the state holds no epoch to redraw; start without the state")
    log.info("resuming epoch %d after batch %d of %s", state.epoch, state.batches, state.length)
    return redrawn(source, start=state.start, batches=state.batches, drawn=state.drawn, now=state.now)


def ends_epoch(state: LoaderState) -> bool:
    """Saved after the epoch's last batch, before the epoch ended: the first pass after the load is the next epoch."""
    return state.in_epoch and state.length is not None and state.batches >= state.length


def _load_stream(dataset: Any, stream: Any) -> None:
    try:
        dataset.load_state_dict(copy.deepcopy(stream))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ValueError(f"load_state_dict(state): the IterableDataset's load_state_dict() rejected the saved stream "
                         f"position ({type(exc).__name__}: {exc}): the state is damaged or belongs to another "
                         f"dataset; load the saved state unchanged, or start without the state") from exc
