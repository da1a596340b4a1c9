"""What ``PrefetchLoader.state_dict()`` holds (torchdata's ``StatefulDataLoader`` protocol), across ranks, and the
checks on ``load_state_dict()``; ``resume.py`` serves the rest of the interrupted epoch.

# NOTE [ Exact resume ]
# An epoch is its index sampler's order (NOTE [ Exact epochs across candidates ] in tuning/slices.py), so resuming
# after k batches = redraw that order and skip k index batches, never a sample. The state holds:
# - ``start``: the RNG at the epoch's start, taken by PrefetchLoader just before ``iter()`` of the wrapped loader: the
#   global torch RNG, every generator on the loader, its sampler and its batch sampler's sampler (deduplicated), and
#   the ``state_dict()`` of a sampler or batch sampler that has one.
# - ``now``: the same generators (and global RNG) when ``state_dict()`` was called.
# - ``epoch``, ``batches`` (yielded to the loop), the samplers' epochs (``DistributedSampler.set_epoch``), the ranks.
# On the first ``iter()`` after a load: put the ``start`` states back, call ``slicer.epoch()`` (it draws exactly what
# ``iter(plain)`` draws, in the same order), ``skip(k)`` it, then put the ``now`` states back, so the RNGs continue as
# in the uninterrupted run (the loop's own draws, the next epoch's order). The rest is served by a DataLoader over
# the source's remaining batches: the decision's or a candidate's (online), else one with the wrapped DataLoader's
# settings. Its worker seeds come from a private generator, so random augmentation in workers is not replayed, as
# with any change of ``num_workers``. A state saved between epochs (or before the first) only restores the ``now``
# states and the epoch numbers.
"""
from __future__ import annotations

import base64
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

FORMAT = 1
_ROLES = ("loader", "sampler", "batch_sampler", "batch_sampler.sampler")


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _parts(loader: Any) -> Dict[str, Any]:
    batch_sampler = getattr(loader, "batch_sampler", None)
    return {"loader": loader, "sampler": getattr(loader, "sampler", None), "batch_sampler": batch_sampler,
            "batch_sampler.sampler": getattr(batch_sampler, "sampler", None)}


def _generators(loader: Any) -> Dict[str, torch.Generator]:
    found: Dict[str, torch.Generator] = {}
    for role, part in _parts(loader).items():
        gen = getattr(part, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found.values()):
            found[role] = gen
    return found


def capture(loader: Any, *, samplers: bool) -> Dict[str, Any]:
    """The RNG states (and, with ``samplers``, the samplers' own ``state_dict()``) that decide ``loader``'s epoch."""
    taken: Dict[str, Any] = {"torch": _encode(torch.get_rng_state()),
                             "generators": {role: _encode(g.get_state()) for role, g in _generators(loader).items()}}
    if samplers:
        taken["samplers"] = {role: part.state_dict() for role, part in _parts(loader).items()
                             if role != "loader" and callable(getattr(part, "state_dict", None))
                             and callable(getattr(part, "load_state_dict", None))}
    return taken


def restore(loader: Any, taken: Dict[str, Any]) -> None:
    """Put back what ``capture`` took."""
    torch.set_rng_state(_decode(taken["torch"]))
    generators = _generators(loader)
    for role, text in taken["generators"].items():
        if role not in generators:
            raise ValueError(f"the saved loader state has a {role} generator but this loader's {role} has none: "
                             f"pass the same generator= (or sampler) as the run that saved it")
        generators[role].set_state(_decode(text))
    parts = _parts(loader)
    for role, sampler_state in taken.get("samplers", {}).items():
        parts[role].load_state_dict(sampler_state)


def ranks(loader: Any) -> Dict[str, int]:
    """This process's place: the torch.distributed world (when initialised) and the sampler's replicas, if any."""
    found: Dict[str, int] = {}
    if dist.is_available() and dist.is_initialized():
        found.update(world_size=dist.get_world_size(), rank=dist.get_rank())
    for part in _parts(loader).values():
        if isinstance(getattr(part, "num_replicas", None), int) and "num_replicas" not in found:
            found.update(num_replicas=part.num_replicas, sampler_rank=int(getattr(part, "rank", 0)))
    return found


def _world() -> Tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def gather(own: Dict[str, Any]) -> Dict[str, Any]:
    """Every rank's state in one dict (a collective under a group of several processes), else ``own`` itself."""
    world, _ = _world()
    if world == 1:
        return own
    states: List[Any] = [None] * world
    dist.all_gather_object(states, own)
    return {"format": FORMAT, "world_size": world, "per_rank": states}


def own_rank(state: Any) -> Any:
    """This rank's part of a state ``gather`` made; a clear error when the world size changed."""
    if not isinstance(state, dict) or "per_rank" not in state:
        return state
    world, rank = _world()
    if world != state["world_size"]:
        raise ValueError(f"load_state_dict(state): the state was saved by world_size={state['world_size']} "
                         f"processes but this run has world_size={world}: each rank resumes its own part of the "
                         f"data, so resume with {state['world_size']} processes, or start the epoch afresh")
    return state["per_rank"][rank]


def check(state: Any, loader: Any) -> None:
    """A clear error when ``state`` cannot resume ``loader`` exactly (another format, world size, rank, epoch size)."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"load_state_dict(state): state must be a dict from PrefetchLoader.state_dict() with format "
                         f"{FORMAT}, got format {got!r}")
    here = ranks(loader)
    for name, saved in state["ranks"].items():
        if name in here and here[name] != saved:
            raise ValueError(f"load_state_dict(state): the state was saved with {name}={saved} but this loader has "
                             f"{name}={here[name]}: an exact resume needs the same world size and each rank its own "
                             f"state; resume with {saved} processes, or start the epoch afresh without the state")
    saved, here_generators = set(state["now"]["generators"]), set(_generators(loader))
    if saved != here_generators:
        raise ValueError(f"load_state_dict(state): the state was saved with generators on {sorted(saved) or 'nothing'}"
                         f", this loader has them on {sorted(here_generators) or 'nothing'}: pass the same "
                         f"generator= (DataLoader or sampler) as the run that saved it")
    length = epoch_length(loader)
    if state["length"] is not None and length is not None and length != state["length"]:
        raise ValueError(f"load_state_dict(state): the saved epoch had {state['length']} batches, this loader has "
                         f"{length}: dataset, batch_size, drop_last or sampler changed since the state was saved")


def epoch_length(loader: Any) -> Optional[int]:
    """Batches per epoch; None when the sampler has no len()."""
    try:
        return len(loader)
    except TypeError:
        return None


def epochs_of(samplers: List[Any]) -> List[int]:
    return [s.epoch for s in samplers if isinstance(getattr(s, "epoch", None), int)]
