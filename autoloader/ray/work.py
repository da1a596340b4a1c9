"""What runs inside Ray's worker processes: a block of index batches loaded and collated as a DataLoader's fetcher
does (``dataset.__getitems__`` or ``dataset[i]`` per index, then ``collate_fn``), each batch pickled for the driver.

Ray reuses its worker processes from task to task and epoch to epoch, so each process keeps the few payloads
(dataset, ``collate_fn``) it was sent, by object reference (``KEEP``): a task deserialises the dataset only the first
time its process sees it, which is what an actor pool would give, without Ray Data restarting the pool every epoch.
Imported by name in every worker: autoloader must be installed on every node (README, "Ray Data")."""
from __future__ import annotations

import collections
import pickle
from typing import Any, Dict, Tuple

import numpy as np

KEEP = 2
"""Payloads a worker process keeps (the loader's, and a trial's or another loader's beside it)."""
_PAYLOADS: "collections.OrderedDict[str, Tuple[Any, Any]]" = collections.OrderedDict()


def _payload(ref: Any) -> Tuple[Any, Any]:
    key = ref.hex()
    if key in _PAYLOADS:
        _PAYLOADS.move_to_end(key)
        return _PAYLOADS[key]
    import ray

    value = ray.get(ref)
    _PAYLOADS[key] = value
    while len(_PAYLOADS) > KEEP:
        _PAYLOADS.popitem(last=False)
    return value


def fetch(dataset: Any, collate_fn: Any, index: Any, batched: bool) -> Any:
    """One batch, as torch's map-style fetcher makes it (``torch/utils/data/_utils/fetch.py``, torch 2.13)."""
    if batched:
        getitems = getattr(dataset, "__getitems__", None)
        data = getitems(index) if getitems else [dataset[i] for i in index]
    else:
        data = dataset[index]
    return collate_fn(data)


def load_block(rows: Dict[str, np.ndarray], payload: Any, batched: bool) -> Dict[str, np.ndarray]:
    """Ray Data's map function: ``rows`` holds ``pos`` (the batch's place in the epoch) and ``idx`` (its pickled
    indices); returns ``pos`` and each batch pickled."""
    dataset, collate_fn = _payload(payload)
    out = [pickle.dumps(fetch(dataset, collate_fn, pickle.loads(raw), batched), protocol=pickle.HIGHEST_PROTOCOL)
           for raw in rows["idx"]]
    batches = np.empty(len(out), dtype=object)
    batches[:] = out
    return {"pos": np.asarray(rows["pos"]), "batch": batches}
