"""What runs inside Ray's worker processes: one read task loads a block of consecutive batches of a run, as a
DataLoader's fetcher does (``dataset.__getitems__`` or ``dataset[i]`` per index, then ``collate_fn``), each batch's
indices read by position from the run's chunk of the epoch's order (order.py), and returns them as one Arrow table
(transport.py). A batch whose loading raised is returned as the exception it raised (``transport.Failure``): the other
batches of the block are loaded and served, and the driver raises it at that batch's ``next()``.

Ray reuses its worker processes from task to task and epoch to epoch, so each process keeps the few objects it was
sent, by object reference (``KEEP``: the payload, the dataset and ``collate_fn``, and the chunks): a task
deserialises the dataset only the first time its process sees it, which is what an actor pool would give, without
Ray Data restarting the pool every epoch. A payload the worker cannot unpickle because a module is missing on its
node is ``MissingModule``, which names the module and the fix, and is not retried. Imported by name in every worker:
autoloader must be installed on every node (README, Integrations, "Ray Data").
"""
from __future__ import annotations

import collections
import re
from typing import Any, Iterator, Optional, Tuple

from .order import Chunk, ChunkReader
from .transport import Failure, pack

KEEP = 4
"""Objects a worker process keeps: the loader's payload and chunk, and a trial's or another loader's beside them."""
_KEPT: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
_MISSING = re.compile(r"No module named '([^']+)'")


class MissingModule(ImportError):
    """A Ray worker cannot import a module the dataset or ``collate_fn`` needs (``module``), on node ``node``."""

    def __init__(self, module: str, node: str, detail: str) -> None:
        super().__init__(
            f"engine='ray': a Ray worker on node {node} cannot import the module {module!r}, which the dataset or "
            f"collate_fn needs ({detail}). Install it on every node of the cluster, or pass runtime_env="
            f"{{'py_modules': [<the module's folder>]}} or runtime_env={{'working_dir': '<your code>'}} to "
            f"make_loader (Ray ships it to every worker)")
        self.module, self.node, self.detail = module, node, detail

    def __reduce__(self) -> Tuple[Any, ...]:
        return (MissingModule, (self.module, self.node, self.detail))


def _get(ref: Any) -> Any:
    import ray

    try:
        return ray.get(ref)
    except Exception as err:  # noqa: BLE001 - Ray wraps the worker's unpickling failure in its own system error
        found = _MISSING.search(str(err)) or _MISSING.search(str(getattr(err, "__cause__", "") or ""))
        if found is None:
            raise
        node = ray.get_runtime_context().get_node_id()
        raise MissingModule(found.group(1), node, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}") from None


def kept(ref: Any) -> Any:
    """The object behind ``ref``, fetched from Ray only the first time this process sees it; a chunk as its
    ``ChunkReader``."""
    key = ref.hex()
    if key in _KEPT:
        _KEPT.move_to_end(key)
        return _KEPT[key]
    value = _get(ref)
    if isinstance(value, Chunk):
        value = value.batches()
    _KEPT[key] = value
    while len(_KEPT) > KEEP:
        _KEPT.popitem(last=False)
    return value


def fetch(dataset: Any, collate_fn: Any, index: Any, batched: bool) -> Any:
    """One batch, as torch's map-style fetcher makes it (``torch/utils/data/_utils/fetch.py``, torch 2.13)."""
    if batched:
        getitems = getattr(dataset, "__getitems__", None)
        data = getitems(index) if getitems else [dataset[i] for i in index]
    else:
        data = dataset[index]
    return collate_fn(data)


def load_batches(dataset: Any, collate_fn: Any, order: ChunkReader, first: int, stop: int,
                 batched: bool) -> Iterator[Tuple[int, Any]]:
    """``(position, batch or Failure)`` for positions ``first`` to ``stop - 1``: a batch that raised is its failure,
    and the next one is loaded all the same (as a DataLoader's worker goes on)."""
    for position in range(first, stop):
        failure: Optional[Failure] = None
        try:
            batch = fetch(dataset, collate_fn, order.read(position), batched)
        except Exception as err:  # noqa: BLE001 - the dataset's own exception, raised at the loop's next()
            failure = Failure.of(err)
        yield position, failure if failure is not None else batch


def load_block(payload: Any, chunk: Any, first: int, stop: int, batched: bool) -> Iterator[Any]:
    """Ray Data's read function for one block: the batches at positions ``first`` to ``stop - 1`` of the run's
    ``chunk`` (a reference), loaded with the ``payload``'s dataset and ``collate_fn``, as one Arrow table."""
    dataset, collate_fn = kept(payload)
    order = kept(chunk)
    yield pack(list(load_batches(dataset, collate_fn, order, first, stop, batched)))
