"""The rest of an interrupted epoch, exactly (NOTE [ Exact resume ] in state.py): redraw its order, skip the batches
already yielded by index, make the pulls the saver had made ahead, serve the others; an IterableDataset resumes
through its own ``state_dict()``."""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Tuple

import torch
from torch.utils.data import IterableDataset

from ..slices import EpochSlicer, EpochSource
from .rng import RngState, parts_of, preserved

log = logging.getLogger("autoloader.prefetch")


def redrawn(source: Any, *, start: RngState, batches: int, drawn: int, now: RngState) -> EpochSource:
    """The saved epoch drawn again from its starting RNG states ``start``, its first ``batches`` skipped and the
    saver's other pulls made (``drawn`` in all), every RNG then as at ``state_dict()`` (``now``): NOTE [ Exact resume ]
    in state.py. ``source``: what PrefetchLoader wraps."""
    slicer = source.slicer
    if slicer is None:
        raise TypeError(f"load_state_dict(state): a wrapped {type(source.template).__name__} cannot be resumed mid-epoch; "
                        f"wrap a torch.utils.data.DataLoader (or use make_loader), or start without the state")
    parts = parts_of(source.template)
    epoch = same_order(slicer, parts, start, min(2, batches, drawn))
    epoch.skip(batches, drawn=drawn)
    now.put(parts, samplers=False)
    return epoch


def ended_at(source: Any, *, start: RngState, batches: int, drawn: int) -> bool:
    """For an epoch whose sampler has no len(): whether no batch follows its first ``batches``, found by redrawing it
    from ``start`` with every RNG then put back as it was (NOTE [ Exact resume ] in state.py: a state saved after an
    epoch's last batch resumes at the next epoch). ``source``: what PrefetchLoader wraps (a ``source.Source``)."""
    if source.slicer is None:
        return False
    parts = parts_of(source.template)
    with preserved(parts):
        start.put(parts)
        epoch = source.slicer.epoch()
        epoch.skip(batches, drawn=drawn)
        return epoch.ends_here()


def same_order(slicer: EpochSlicer, parts: Mapping[str, Any], states: RngState, pulls: int) -> EpochSource:
    """An epoch drawn from ``states`` whose first ``pulls`` batches were drawn twice (``states`` put back before each
    draw); they wait in it for the next slices. An order that differs between two draws from the same states comes
    from an RNG the state does not hold (a sampler's private ``random.Random`` without ``state_dict()``), and resuming
    would silently serve another order: a ValueError."""
    states.put(parts)
    if pulls == 0:
        return slicer.epoch()
    source = slicer.epoch()
    probe = source.draw(pulls)
    states.put(parts)
    source = slicer.epoch()
    again = source.draw(pulls)
    if _listed(again) != _listed(probe):
        raise ValueError("load_state_dict(state): this loader's sampler drew another order from the same saved RNG "
                         "states: its randomness is not in torch's, Python's or numpy's global RNG, a generator= or "
                         "its own state_dict(); give the sampler state_dict()/load_state_dict() (or a "
                         "torch.Generator), or start the epoch afresh")
    source.hold(again)
    return source


def _listed(value: Any) -> Any:
    """Index batches as plain lists, to compare two draws."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_listed(v) for v in value]
    return value


def check_next_order(source: Any, now: RngState) -> None:
    """For a state saved between epochs: the next epoch's first batches, drawn twice from the saved ``now``
    (``same_order``), then every RNG put back as saved."""
    parts = parts_of(source.template)
    if isinstance(getattr(source.template, "dataset", None), IterableDataset) or source.slicer is None:
        now.put(parts)
        return
    same_order(source.slicer, parts, now, 2)
    now.put(parts)


def stream_rule(loader: Any) -> Tuple[Optional[Any], str]:
    """For an IterableDataset: the dataset whose ``state_dict`` resumes it, or why it cannot be resumed."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, IterableDataset):
        return None, ""
    if not (callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))):
        return None, (f"its IterableDataset ({type(dataset).__name__}) has no state_dict()/load_state_dict(): give it "
                      f"both (the position in its stream), or restart the epoch instead of resuming it")
    if getattr(loader, "num_workers", 0):
        return None, (f"its IterableDataset is read by {loader.num_workers} worker processes, whose copies of the "
                      f"dataset the main process cannot ask for their state: use num_workers=0 to resume it")
    return dataset, ""
