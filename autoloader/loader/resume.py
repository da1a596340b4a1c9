"""The rest of an interrupted epoch, exactly (NOTE [ Exact resume ] in state.py): redraw its order, skip the batches
already yielded by index, serve the others; an IterableDataset resumes through its own ``state_dict()``."""
from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, Optional, Tuple

from torch.utils.data import DataLoader, IterableDataset

from ..tuning.slices import EpochSlicer, EpochSource
from .state import restore

log = logging.getLogger("autoloader.prefetch")

_COPIED = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
           "pin_memory_device")


def resumed_epoch(loader: Any, state: Dict[str, Any]) -> Iterator[Any]:
    """The rest of the saved epoch, exactly (NOTE [ Exact resume ] in state.py); ``loader`` is what PrefetchLoader wraps
    (a DataLoader, or a source with ``slicer`` and ``resume``, online tuning's)."""
    slicer = getattr(loader, "slicer", None)
    if slicer is None and not isinstance(loader, DataLoader):
        raise TypeError(f"load_state_dict: a wrapped {type(loader).__name__} cannot be resumed mid-epoch; wrap a "
                        f"torch.utils.data.DataLoader (or use make_loader)")
    restore(loader, state["start"])
    slicer = slicer or EpochSlicer(loader)
    source = slicer.epoch()
    source.skip(state["batches"])
    restore(loader, {**state["now"], "samplers": {}})
    log.info("resuming epoch %d after batch %d of %s", state["epoch"], state["batches"], state["length"])
    if callable(getattr(loader, "resume", None)):
        return loader.resume(source)
    return _rest(loader, source)


def _rest(loader: DataLoader, source: EpochSource) -> Iterator[Any]:
    """The source's remaining batches through a DataLoader with ``loader``'s settings (in order, not persistent)."""
    part = source.take(None)
    workers = loader.num_workers
    part.expect(workers, loader.prefetch_factor if workers else None)
    kwargs = {name: getattr(loader, name) for name in _COPIED}
    if workers:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    rest = DataLoader(loader.dataset, **part.sampling(), generator=part.private_generator(), in_order=True, **kwargs)
    yield from rest


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
