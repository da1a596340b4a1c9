"""What ``PrefetchLoader.state_dict()`` holds (torchdata's ``StatefulDataLoader`` protocol): ``LoaderState``, checked
field by field and against a digest when loaded, then against the loader it resumes; its parts across ranks.

# NOTE [ Exact resume ]
# Goal: a state taken at any point, loaded into a new loader of any configuration (workers, threads, prefetch,
# persistent workers, tuning mode), yields the batches the saver would have yielded next, this epoch and later, and
# leaves the RNGs as the saver's loop would have seen them; or raises a ValueError before the first batch.
# An epoch is its index sampler's order (NOTE [ Exact epochs across candidates ] in loader/slices.py), so resuming
# after k batches = redraw that order from the RNG states of the epoch's start and skip k index batches, never a
# sample. What the state holds, and why each part:
# - ``start``: every RNG (rng.py: the ambient ones and the loader's own, with the samplers' ``state_dict()``) just
#   before the epoch drew anything. Every epoch draws one base seed first (NOTE [ One base seed per epoch ] in
#   epochs.py), so the redraw (``EpochSource``) makes the same draws in the same order whatever the saver's
#   persistent workers did.
# - ``drawn``: how many index batches the saver's epoch had asked of its sampler. A DataLoader pulls ahead of what it
#   yields (``pulls_made``), and samplers draw as they are pulled: ``RandomSampler(generator=g)`` draws a chunk of 32
#   indices at a time with ``replacement=True``, and one more ``randperm`` when asked past its end. The resume asks
#   the redrawn epoch for exactly as many (keeping the ones not yet delivered), so those draws happen once, before
#   ``now`` is put back, as in the saver; what the resumer pulls beyond them draws from ``now``, as the saver would
#   have. Reading ahead counts what was fetched ahead too, the epoch's end included (``Ahead`` in epochs.py):
#   saved after the last batch, the saver had asked past the end, and its ``now`` holds that draw.
# - ``now``: every RNG when ``state_dict()`` was called: the loop's own draws continue from there.
# - ``ahead``: the ambient RNGs just before the batch the prefetcher held unyielded was loaded in the main process
#   (only with a side stream, which reads one batch ahead: NOTE [ Stream synchronisation ] in stream_copy.py). A dataset
#   that augments in the main process drew for that batch before ``now``; the resumer loads it again from ``ahead``,
#   then puts ``now`` back, so the batch and the loop's draws match. Without a side stream nothing is read ahead.
# - ``stream``: an IterableDataset's own ``state_dict()`` before the next batch (it resumes through it, read by the
#   main process), then ``now`` is put back after ``iter()``, which drew a base seed the saver drew at its start.
#   Saved between epochs too, and loaded before the next ``iter()``: a stream's next epoch may depend on its own
#   state (an epoch counter that reshuffles it, a shard cursor), and a loader with workers, whose copies of the
#   dataset read the stream each, would not yield the saver's batches, so it is refused there as mid-epoch.
# - ``sampling``: dataset kind and length, sampler and batch sampler types and lengths, batch size, drop_last; a state
#   saved with other ones would resume on another order silently, so any difference is a ValueError.
# - ``digest``: of every field autoloader wrote (not the samplers' or the dataset's own states): a state changed or
#   truncated after ``state_dict()`` is refused with a ValueError rather than resumed somewhere else.
# A state saved after an epoch's last batch (``batches == length``) resumes at the next epoch's start, as Lightning
# expects; the pulls the saver had not made yet (the sampler asked past its end) are made first, after ``now``.
# Without a len() (a sampler or batch sampler that has none) the saver cannot tell its last batch: ``load`` redraws
# the epoch from ``start`` (``redraw.ended_at``, every RNG then put back) and, when no batch follows, takes
# ``length = batches``, so the first pass is the next epoch there too, not an empty one.
# What cannot be exact: random augmentation inside workers (worker seeds come from a private generator, and skipped
# batches are not loaded, so a worker's RNG is elsewhere), an RNG that none of the above reaches (a sampler's private
# ``random.Random`` without ``state_dict``: detected by redrawing twice, a ValueError), and draws whose interleaving
# with the loop's depends on the configuration (a dataset drawing in the main process with ``num_workers=0`` before
# the save and in workers after it). ``PrefetchLoader.load_state_dict``'s docstring lists them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Dict, List, Mapping, Optional

import torch.distributed as dist
from torch.utils.data import IterableDataset

from .rng import Ambient, RngState, StateError, generators, parts_of

FORMAT = 2
_OWN = ("samplers",)  # the samplers' own state_dict(): theirs, not digested


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """One rank's checkpoint (see NOTE [ Exact resume ]): where the loop is and the RNG states that redraw the epoch."""

    epoch: int
    batches: int
    """Batches of ``epoch`` the loop passed: yielded, or raised at its ``next()`` (their indices were used: NOTE [ A
    batch that raises ] in source.py)."""
    in_epoch: bool
    """Saved inside an epoch (``batches`` may equal ``length``: after its last batch, before the next epoch)."""
    length: Optional[int]
    sampling: Dict[str, Any]
    ranks: Dict[str, int]
    sampler_epochs: List[int]
    sampler_record: Optional[List[int]]
    epoch_set: bool
    start: Optional[RngState]
    now: RngState
    ahead: Optional[Ambient]
    drawn: Optional[int]
    stream: Any
    decision: Optional[str]

    @property
    def rest_of_epoch(self) -> bool:
        """A map-style epoch to finish: redraw it and skip ``batches`` (else: a stream, or a fresh epoch)."""
        return self.in_epoch and self.stream is None

    def to_json(self) -> Dict[str, Any]:
        body = {"format": FORMAT, "epoch": self.epoch, "batches": self.batches, "in_epoch": self.in_epoch,
                "length": self.length, "sampling": self.sampling, "ranks": self.ranks,
                "sampler_epochs": self.sampler_epochs, "sampler_record": self.sampler_record,
                "epoch_set": self.epoch_set, "start": None if self.start is None else self.start.to_json(),
                "now": self.now.to_json(), "ahead": None if self.ahead is None else self.ahead.to_json(),
                "drawn": self.drawn, "stream": self.stream, "decision": self.decision}
        body["digest"] = _digest(body)
        return body

    @classmethod
    def from_json(cls, state: Any) -> "LoaderState":
        """The state ``to_json`` wrote; a ``ValueError`` naming the damaged field (and the fix) for anything else."""
        try:
            return _parsed(state)
        except StateError as err:
            raise ValueError(f"load_state_dict(state): {err}; the state is damaged or was not made by "
                             f"PrefetchLoader.state_dict(): load the saved state unchanged, or start without the state"
                             ) from None


_KEYS = ("format", *(f.name for f in dataclasses.fields(LoaderState)), "digest")
"""Every field ``LoaderState.to_json`` writes."""


def _parsed(state: Any) -> LoaderState:
    if not isinstance(state, dict):
        raise StateError(f"the state must be a dict from PrefetchLoader.state_dict(), got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise StateError(f"state['format'] is {state.get('format')!r}, this autoloader reads format {FORMAT} (a state "
                         f"from another version cannot resume exactly)")
    if state.get("digest") != _digest({k: v for k, v in state.items() if k != "digest"}):
        raise StateError("the state does not match its digest (state['digest']): it was changed or truncated after "
                         "state_dict() made it")
    missing = [name for name in _KEYS if name not in state]
    if missing:  # the digest covers the others; the stream's own state may be None, never absent
        raise StateError(f"the state has no {', '.join(map(repr, missing))}: state_dict() writes every field, None "
                         f"where there is nothing to keep")
    fields: List[Any] = [state.get(k) for k in ("epoch", "batches", "length", "drawn")]  # checked below
    epoch, batches, length, drawn = fields
    _field(_is_int(epoch) and epoch >= 0, "epoch", "an int >= 0")
    _field(_is_int(batches) and batches >= 0, "batches", "an int >= 0")
    _field(length is None or _is_int(length) and length >= batches, "length", "None or an int >= state['batches']")
    _field(drawn is None or _is_int(drawn) and drawn >= 0, "drawn", "None or an int >= 0")
    for name in ("in_epoch", "epoch_set"):
        _field(isinstance(state.get(name), bool), name, "True or False")
    _field(isinstance(state.get("sampling"), dict), "sampling", "a dict")
    ranks: Any = state.get("ranks")
    _field(isinstance(ranks, dict) and all(_is_int(v) for v in ranks.values()), "ranks", "a dict of ints")
    _field(_int_list(state.get("sampler_epochs")), "sampler_epochs", "a list of ints")
    record = state.get("sampler_record")
    _field(record is None or _int_list(record), "sampler_record", "None or a list of ints")
    _field(state.get("decision") is None or isinstance(state.get("decision"), str), "decision", "None or a str")
    start = None if state.get("start") is None else RngState.from_json(state["start"], "state['start']")
    ahead = None if state.get("ahead") is None else Ambient.from_json(state["ahead"], "state['ahead']")
    parsed = LoaderState(epoch, batches, state["in_epoch"], length, state["sampling"], ranks, state["sampler_epochs"],
                         record, state["epoch_set"], start, RngState.from_json(state.get("now"), "state['now']"),
                         ahead, drawn, state.get("stream"), state.get("decision"))
    if parsed.rest_of_epoch and (start is None or drawn is None):
        raise StateError("the state is inside an epoch but holds no state['start'] or state['drawn'] to redraw it")
    return parsed


def _digest(body: Mapping[str, Any]) -> str:
    """sha256 of the fields autoloader wrote, as canonical JSON (so a JSON or torch.save round trip keeps it)."""
    own = {k: v for k, v in body.items() if k != "stream"}
    for name in ("start", "now"):
        if isinstance(own.get(name), dict):
            own[name] = {k: v for k, v in own[name].items() if k not in _OWN}
    text = json.dumps(own, sort_keys=True, separators=(",", ":"), default=lambda o: f"<{type(o).__name__}>")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _field(ok: bool, name: str, expected: str) -> None:
    if not ok:
        raise StateError(f"state[{name!r}] must be {expected}")


# -- what a state is checked against ---------------------------------------------------------------------------------
def sampling_of(loader: Any) -> Dict[str, Any]:
    """What decides the order of ``loader``'s epochs apart from the RNGs: two loaders that differ here do not draw the
    same epochs from the same states (NOTE [ Exact resume ], ``sampling``)."""
    dataset = getattr(loader, "dataset", None)  # a ThreadedDataset has its dataset's length
    sampler, batch_sampler = getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)
    return {"dataset": "IterableDataset" if isinstance(dataset, IterableDataset) else "map-style",
            "len(dataset)": _length(dataset),
            "sampler": None if sampler is None else type(sampler).__name__, "len(sampler)": _length(sampler),
            "replacement": getattr(sampler, "replacement", None),
            "batch_sampler": None if batch_sampler is None else type(batch_sampler).__name__,
            "batch_size": getattr(loader, "batch_size", None), "drop_last": getattr(loader, "drop_last", None)}


def ranks(loader: Any) -> Dict[str, int]:
    """This process's place: the torch.distributed world (when initialised) and the sampler's replicas, if any."""
    found: Dict[str, int] = {}
    if dist.is_available() and dist.is_initialized():
        found.update(world_size=dist.get_world_size(), rank=dist.get_rank())
    for part in parts_of(loader).values():
        if isinstance(getattr(part, "num_replicas", None), int) and "num_replicas" not in found:
            found.update(num_replicas=part.num_replicas, sampler_rank=int(getattr(part, "rank", 0)))
    return found


def check(state: LoaderState, loader: Any) -> None:
    """A ValueError naming what changed when ``state`` cannot resume ``loader`` exactly."""
    here = ranks(loader)
    for name, saved in state.ranks.items():
        if name in here and here[name] != saved:
            raise ValueError(f"load_state_dict(state): the state was saved with {name}={saved} but this loader has "
                             f"{name}={here[name]}: an exact resume needs the same world size and each rank its own "
                             f"state; resume with {saved} processes, or start the epoch afresh without the state")
    sampling = sampling_of(loader)
    for name, saved in state.sampling.items():
        if sampling.get(name) != saved:
            raise ValueError(f"load_state_dict(state): the state was saved with {name}={saved!r} but this loader has "
                             f"{name}={sampling.get(name)!r}: pass the same dataset, batch_size, shuffle, sampler, "
                             f"batch_sampler and drop_last as the run that saved it, or start without the state")
    saved_gens, here_gens = set(state.now.generators), set(generators(parts_of(loader)))
    if saved_gens != here_gens:
        raise ValueError(f"load_state_dict(state): the state was saved with generators on "
                         f"{sorted(saved_gens) or 'nothing'}, this loader has them on "
                         f"{sorted(here_gens) or 'nothing'}: pass the same generator= (DataLoader or sampler) as the "
                         f"run that saved it")
    length = epoch_length(loader)
    if state.length is not None and length is not None and length != state.length:
        raise ValueError(f"load_state_dict(state): the saved epoch had {state.length} batches, this loader has "
                         f"{length}: dataset, batch_size, drop_last or sampler changed since the state was saved")


def epoch_length(loader: Any) -> Optional[int]:
    """Batches per epoch; None when the sampler has no len()."""
    return _length(loader)


def _length(obj: Any) -> Optional[int]:
    try:
        return len(obj)
    except TypeError:
        return None


def epochs_of(samplers: List[Any]) -> List[int]:
    return [s.epoch for s in samplers if isinstance(getattr(s, "epoch", None), int)]


# -- across ranks --------------------------------------------------------------------------------------------------
def own_rank(state: Any) -> Any:
    """This rank's part of a state ``gather`` made; a clear error when the world size changed."""
    if not isinstance(state, dict) or "per_rank" not in state:
        return state
    world, rank = _world()
    saved, parts = state.get("world_size"), state.get("per_rank")
    if not (_is_int(saved) and isinstance(parts, list) and len(parts) == saved):
        raise ValueError("load_state_dict(state): state['per_rank'] must hold one state per rank of "
                         "state['world_size']: the state is damaged; load the saved state unchanged")
    if world != saved:
        raise ValueError(f"load_state_dict(state): the state was saved by world_size={saved} processes but this run "
                         f"has world_size={world}: each rank resumes its own part of the data, so resume with "
                         f"{saved} processes, or start the epoch afresh")
    return parts[rank]


def _world() -> tuple:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0
