"""The contenders of ``test_bench_peers.py``, as ``peers_run.py`` opens them: each takes the dataset and the run's
spec, returns an ``Opened`` (a fresh epoch iterator, its configuration, its shutdown). Libraries are imported here,
inside each function: a run imports only its own contender's (``peers_run.py`` checks the import first, so the
import is not counted in the setup time)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List

import torch
from torch.utils.data import DataLoader, SequentialSampler, default_collate

from peers_data import flatten


@dataclass
class Opened:
    epoch: Callable[[], Iterator[Any]]
    """A fresh iterator over one epoch (its workers start here, as a DataLoader's do)."""
    config: Callable[[], str]
    """The configuration it runs with (read after the run: online tuning changes it)."""
    close: Callable[[], None]


def _autoloader(ds: Any, spec: Dict[str, Any], mode: str) -> Opened:
    from autoloader import make_loader

    kwargs: Dict[str, Any] = dict(cache=False, tuning="online" if mode == "online" else "trials")
    if mode == "threads":
        kwargs["threads"] = True
    if spec.get("budget") and mode != "online":
        kwargs["budget"] = spec["budget"]
    holder = [make_loader(ds, spec["batch_size"], **kwargs)]

    def config() -> str:
        t = holder[0].tuning
        text = f"{t.num_workers} workers"
        threads = getattr(t, "threads", 1) or 1
        if threads > 1:
            text += f" x {threads} threads"
        pf = getattr(getattr(t, "config", None), "prefetch_factor", None)
        if t.num_workers and pf not in (None, 2):
            text += f", prefetch {pf}"
        trials = getattr(t, "trials", None)
        return text + (f" ({len(trials)} trials)" if trials else "")

    def close() -> None:
        loader = holder.pop()
        for dl in (loader, getattr(loader, "loader", None)):  # persistent workers: shut down now
            if dl is not None and getattr(dl, "_iterator", None) is not None:
                dl._iterator = None
        del loader
    return Opened(lambda: iter(holder[0]), config, close)


def _plain(ds: Any, spec: Dict[str, Any], workers: int) -> Opened:
    holder = [DataLoader(ds, spec["batch_size"], num_workers=workers, prefetch_factor=2 if workers else None)]
    return Opened(lambda: iter(holder[0]), lambda: f"num_workers={workers}", holder.clear)


def _tf(ds: Any, spec: Dict[str, Any], _: Any) -> Opened:
    import tensorflow as tf

    first = ds[0]
    single = isinstance(first, torch.Tensor)
    parts = [t.numpy() for t in flatten(first)]
    dtypes = [tf.as_dtype(p.dtype) for p in parts]

    def fetch(i: Any) -> List[Any]:  # the same __getitem__, its tensors handed to TensorFlow as numpy arrays
        return [t.numpy() for t in flatten(ds[int(i)])]

    def mapped(i: Any) -> Any:
        out = tf.py_function(fetch, [i], dtypes)
        return tuple(tf.ensure_shape(o, p.shape) for o, p in zip(out, parts))

    holder = [tf.data.Dataset.range(len(ds)).map(mapped, num_parallel_calls=tf.data.AUTOTUNE)
              .batch(spec["batch_size"]).prefetch(tf.data.AUTOTUNE)]

    def epoch() -> Iterator[Any]:
        for batch in holder[0].as_numpy_iterator():  # tf tensors -> numpy -> torch (zero copy) inside the window
            tensors = [torch.from_numpy(b) for b in batch]
            yield tensors[0] if single else tuple(tensors)
    return Opened(epoch, lambda: "AUTOTUNE map + prefetch", holder.clear)


def _spdl(ds: Any, spec: Dict[str, Any], concurrency: int) -> Opened:
    from spdl.pipeline import PipelineBuilder

    pipeline = (PipelineBuilder().add_source(range(len(ds)))
                .pipe(ds.__getitem__, concurrency=concurrency, output_order="input")
                .aggregate(spec["batch_size"]).pipe(default_collate).add_sink(3)
                .build(num_threads=concurrency + 1))
    started: List[bool] = []

    def epoch() -> Iterator[Any]:
        if not started:
            pipeline.start()
            started.append(True)
        return pipeline.get_iterator(timeout=300)

    def close() -> None:
        if started:
            pipeline.stop(timeout=30)
    return Opened(epoch, lambda: f"concurrency={concurrency} (threads)", close)


def _torchdata(ds: Any, spec: Dict[str, Any], how: Any) -> Opened:
    from torchdata.nodes import Batcher, Loader, Mapper, ParallelMapper, Prefetcher, SamplerWrapper

    method, workers = how
    node = ParallelMapper(SamplerWrapper(SequentialSampler(ds)), map_fn=ds.__getitem__, num_workers=workers,
                          method=method, in_order=True)
    node = Prefetcher(Mapper(Batcher(node, batch_size=spec["batch_size"]), default_collate), prefetch_factor=2)
    holder = [Loader(node)]

    def close() -> None:
        """torchdata.nodes 0.11 has no public close: call the ``_shutdown`` its iterators' ``__del__`` calls,
        outermost first (the prefetch thread holds the nodes below it)."""
        seen: set = set()

        def down(obj: Any, depth: int = 0) -> None:
            if obj is None or id(obj) in seen or depth > 20:
                return
            seen.add(id(obj))
            shutdown = getattr(obj, "_shutdown", None)
            if callable(shutdown):
                shutdown()
            for name in ("root", "_it", "source"):
                down(getattr(obj, name, None), depth + 1)
        down(holder.pop())
    return Opened(lambda: iter(holder[0]), lambda: f"{method} num_workers={workers}", close)


CONTENDERS: Dict[str, Callable[[Any, Dict[str, Any], Any], Opened]] = {
    "autoloader": lambda ds, spec, mode: _autoloader(ds, spec, mode),
    "plain": _plain, "tf": _tf, "spdl": _spdl, "torchdata": _torchdata,
}
LIBRARY = {"tf": "tensorflow", "spdl": "spdl", "torchdata": "torchdata", "autoloader": "autoloader"}
