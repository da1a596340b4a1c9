"""One run of index batches through Ray Data, read in order with a limit on every wait.

``Feed(ray, payload, batches, config, ...)`` builds ``from_items`` (one row per batch: its place and its pickled
indices) -> ``map_batches(work.load_block)`` with ``config``'s pool, block and prefetch, ``preserve_order`` set on
this dataset's own context (the user's ``DataContext`` is not touched), and reads it in a thread of its own, which
unpickles (and pins, for CUDA) each batch while the loop trains. ``feed.next()`` waits at most ``wait_s`` for each
batch; ``feed.close()`` stops the thread and the Ray execution. The loop never waits on Ray without a limit: a
batch that does not come is a ``TimeoutError`` naming the fix, a failed task a ``RuntimeError`` naming the
dataset's own exception."""
from __future__ import annotations

import math
import pickle
import queue
import re
import threading
import warnings
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch

from ..loader.batch import map_tensors
from .records import RayConfig
from .work import load_block

TASK_RETRIES = 2
"""Times Ray runs a task again after its worker or node died (Ray Data's default, -1, retries forever: a payload a
worker cannot import would then never fail)."""
_END = object()
_POLL_S = 0.1


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def dataset_for(ray: Any, payload: Any, batches: Sequence[Any], config: RayConfig, *, batched: bool) -> Any:
    """The Ray dataset of ``batches`` (index batches, in order) loaded with ``config``."""
    rows = [{"pos": k, "idx": pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)} for k, index in enumerate(batches)]
    blocks = max(1, math.ceil(len(rows) / config.batches_per_task))
    ds = ray.data.from_items(rows, override_num_blocks=blocks)
    with warnings.catch_warnings():  # max_retries has no named parameter in ray 2.60 yet
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        ds = ds.map_batches(load_block, batch_size=config.batches_per_task, batch_format="numpy",
                            fn_args=(payload, batched), compute=ray.data.TaskPoolStrategy(size=config.tasks),
                            num_cpus=config.cpus, max_retries=TASK_RETRIES)
    context = ds.context
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    return ds


class Feed:
    """The batches of one run, in order, each within ``wait_s`` (see the module docstring). ``pin``: copy each batch
    into page-locked memory in the reading thread (for CUDA)."""

    def __init__(self, ray: Any, payload: Any, batches: Sequence[Any], config: RayConfig, *, batched: bool,
                 wait_s: float, pin: bool = False) -> None:
        self.count, self.wait_s, self.pin = len(batches), wait_s, pin
        self._dataset = dataset_for(ray, payload, batches, config, batched=batched)
        self._prefetch = config.prefetch
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._next = 0
        self._thread = threading.Thread(target=self._run, name="autoloader-ray-feed", daemon=True)
        self._thread.start()

    def _blocks(self) -> Iterator[Any]:
        return self._dataset.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=self._prefetch)

    def _run(self) -> None:
        blocks: Optional[Iterator[Any]] = None
        try:
            blocks = self._blocks()
            for block in blocks:
                for pos, raw in zip(block["pos"], block["batch"]):
                    batch = pickle.loads(raw)
                    if self.pin:
                        batch = pinned(batch)
                    if not self._put((int(pos), batch)):
                        return
            self._put(_END)
        except BaseException as err:  # handed to the loop, which raises it there
            self._put(_Failed(err))
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()  # stops Ray Data's execution of a run left early

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> Tuple[int, Any]:
        """The next batch ``(place in the run, batch)``; StopIteration after the last. Raises TimeoutError when none
        came within ``wait_s``, RuntimeError when a task failed or Ray Data broke the order."""
        try:
            item = self._queue.get(timeout=self.wait_s)
        except queue.Empty:
            raise TimeoutError(
                f"autoloader: no batch came from Ray within {self.wait_s:.0f} s (batch {self._next} of {self.count}): "
                f"the cluster may have no CPU free for the pool (`ray status` shows what holds them), or a task is "
                f"stuck in the dataset's __getitem__; pass timeout=<seconds> to make_loader to wait longer") from None
        if item is _END:
            raise StopIteration
        if isinstance(item, _Failed):
            raise task_failure(item.error, self._next) from item.error
        pos, batch = item
        if pos != self._next:
            raise RuntimeError(f"autoloader: Ray Data returned batch {pos} where batch {self._next} was due: its "
                               f"preserve_order was not honoured; please report this with your ray version")
        self._next += 1
        return pos, batch

    def close(self) -> None:
        """Stop reading: the thread ends (and Ray's execution with it) once Ray hands it its current block."""
        self._stop.set()
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        self._thread.join(timeout=2 * _POLL_S)


def original_error(error: BaseException) -> BaseException:
    """The dataset's own exception inside Ray's wrappers (``RayTaskError``, ``UserCodeException``)."""
    seen: List[BaseException] = []
    current: Optional[BaseException] = error
    while current is not None and current not in seen:
        seen.append(current)
        module = type(current).__module__
        if not module.startswith("ray"):
            return current
        current = getattr(current, "cause", None) or current.__cause__
    return seen[-1]


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def described(error: BaseException) -> str:
    """``Type: message`` of the dataset's own exception: the first one in Ray's chain that is not Ray's, else the
    first such line of the worker's traceback that Ray's message carries (the chain does not survive pickling)."""
    cause = original_error(error)
    if not type(cause).__module__.startswith("ray"):
        return f"{type(cause).__name__}: {cause}"
    for line in str(error).splitlines():
        found = _RAISED.match(line.strip())
        if found and not found.group(1).startswith(("ray", "Ray", "UserCodeException")):
            return line.strip()
    return f"{type(cause).__name__}: {cause}"


def task_failure(error: BaseException, position: int) -> BaseException:
    """What the loop gets for a failed run: ConnectionError when Ray itself went away, else a RuntimeError naming
    the dataset's own exception."""
    cause = original_error(error)
    if isinstance(cause, ConnectionError) or type(cause).__name__ in ("RaySystemError", "GetTimeoutError"):
        return ConnectionError(f"autoloader lost Ray while loading batch {position} ({type(cause).__name__}: "
                               f"{cause}): check that the cluster is up (`ray status`), then iterate again")
    return RuntimeError(f"autoloader: a Ray task failed while loading batch {position} of the epoch: "
                        f"{described(error)} (raised by the dataset or collate_fn in a Ray worker; its traceback is "
                        f"above). Fix the dataset; no batch after it was served")


def pinned(batch: Any) -> Any:
    """``batch`` with every tensor in page-locked memory."""
    return map_tensors(lambda t: t.pin_memory() if isinstance(t, torch.Tensor) else t, batch)
