"""One run of an epoch through Ray Data: the batches of one ``Chunk`` of the epoch's order (order.py), loaded by a pool
of Ray tasks and read in order, with a limit on every wait.

``Feed(ray, payload, chunk, config, ...)`` puts the chunk into Ray's object store (one object, within
``waits.PUT``), builds a Ray dataset of ``Blocks``: one read task per block of ``RayConfig.batches_per_task``
consecutive positions, each reading its indices from the chunk by position and loading them (``work.load_block``),
no row per batch built here. The tasks run ``RayConfig.tasks`` at a time, ``RayConfig.cpus`` each, within Ray Data's
resource limits for this execution (``RayConfig.cluster_cpus``); ``preserve_order`` and the rest are set on this
dataset's own context (the user's ``DataContext`` is not touched). A thread of its own reads the blocks
(``iter_batches(batch_format="pyarrow")``, ``RayConfig.prefetch`` ahead) and unpacks each batch (transport.py: one copy,
page-locked for CUDA) while the loop trains. ``feed.next()`` waits at most ``first`` for the run's first batch and
``wait`` for each one after; ``feed.close()`` stops the thread and the Ray execution, and ``feed.ended(deadline)`` waits
for both to be gone (a thread still in Ray when the user shuts Ray down makes Ray start again on that thread: its
processes died with the thread, and the process with them, in 1 CI run in 5). A batch whose loading raised
comes out as its ``transport.Failure``; a failed run as the error ``failures.run_failure`` names."""
from __future__ import annotations

import functools
import itertools
import math
import queue
import threading
import time
import warnings
from typing import Any, Iterator, List, Optional, Tuple

from . import failures
from .order import Chunk
from .records import RayConfig
from .session import EXECUTOR_PREFIX, ITERATOR_THREAD, reading
from .transport import unpack
from .waits import PUT, Limit, bounded
from .work import load_block

_END = object()
_POLL_S = 0.1
_RUNS = itertools.count()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def blocks_of(count: int, block: int) -> List[Tuple[int, int]]:
    """``(first, stop)`` of each block of ``block`` consecutive positions among ``count``."""
    return [(first, min(count, first + block)) for first in range(0, count, block)]


def _datasource(ray: Any) -> Any:
    class Blocks(ray.data.Datasource):
        """The blocks of a run: each read task loads positions ``first`` to ``stop - 1`` of the chunk."""

        def __init__(self, payload: Any, chunk_ref: Any, chunk: Chunk, block: int) -> None:
            self.payload, self.chunk_ref, self.block = payload, chunk_ref, block
            self.start, self.count, self.batched = chunk.start, chunk.count, chunk.batched

        def estimate_inmemory_data_size(self) -> Optional[int]:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                           data_context: Any = None) -> List[Any]:
            from ray.data.block import BlockMetadata

            return [ray.data.ReadTask(functools.partial(load_block, self.payload, self.chunk_ref, self.start + first,
                                                        self.start + stop, self.batched),
                                      BlockMetadata(num_rows=stop - first, size_bytes=None, input_files=None,
                                                    exec_stats=None))
                    for first, stop in blocks_of(self.count, self.block)]

    return Blocks


def dataset_for(ray: Any, payload: Any, chunk_ref: Any, chunk: Chunk, config: RayConfig, *, name: str) -> Any:
    """The Ray dataset of one run (see the module docstring), named ``name`` (its execution's thread is
    ``StreamingExecutor-<name>_...``)."""
    from ray.data import ExecutionResources

    source = _datasource(ray)(payload, chunk_ref, chunk, config.batches_per_task)
    with warnings.catch_warnings():  # max_retries has no named parameter in ray 2.60 yet
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        ds = ray.data.read_datasource(source, compute=ray.data.TaskPoolStrategy(size=config.tasks),
                                      num_cpus=config.cpus,
                                      override_num_blocks=math.ceil(chunk.count / config.batches_per_task),
                                      ray_remote_args={"max_retries": failures.TASK_RETRIES})
    ds.set_name(name)
    context = ds.context
    context.execution_options.preserve_order = True
    context.execution_options.resource_limits = ExecutionResources(cpu=config.cluster_cpus)
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    return ds


class Feed:
    """The batches of one run, in order, each within its wait (see the module docstring). ``first``: the limit for the
    run's first batch; ``wait``: for each one after it. ``pin``: unpack each batch into page-locked memory (CUDA)."""

    def __init__(self, ray: Any, payload: Any, chunk: Chunk, config: RayConfig, *, first: Limit, wait: Limit,
                 pin: bool = False) -> None:
        self.start, self.count, self.pin = chunk.start, chunk.count, pin
        self.first, self.wait, self.config = first, wait, config
        self.received = 0
        """Batches the reading thread got from Ray (the loop may not have them yet)."""
        chunk_ref = bounded(PUT, lambda: ray.put(chunk), detail=f"{chunk.nbytes:,} bytes of the epoch's order")
        self.name = f"autoloader_run{next(_RUNS)}"
        self._dataset = dataset_for(ray, payload, chunk_ref, chunk, config, name=self.name)
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._next = self.start
        self._helpers: List[threading.Thread] = []
        """The threads Ray Data's iterator started for this run (seen as its first block came; another run's started
        in that instant may be among them)."""
        self._thread = threading.Thread(target=self._run, name="autoloader-ray-feed", daemon=True)
        self._thread.start()
        reading(self._thread, self._stop)

    @property
    def blocks_left(self) -> int:
        """Blocks of this run the reading thread has not received yet (all are being loaded, or queued in Ray)."""
        return math.ceil((self.count - self.received) / self.config.batches_per_task)

    def _blocks(self) -> Iterator[Any]:
        return self._dataset.iter_batches(batch_size=None, batch_format="pyarrow",
                                          prefetch_batches=self.config.prefetch)

    def _run(self) -> None:
        blocks: Optional[Iterator[Any]] = None
        before = set(threading.enumerate())
        try:
            blocks = self._blocks()
            for table in blocks:
                if not self.received:
                    self._helpers = [t for t in threading.enumerate() if t not in before and t.name == ITERATOR_THREAD]
                self.received += table.num_rows
                for item in unpack(table, pin=self.pin):
                    if not self._put(item):
                        return
                del table
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
        """The next ``(position in the epoch, batch or transport.Failure)``; StopIteration after the run's last.
        Raises TimeoutError naming the limit when none came in time, the error ``failures.run_failure`` names when
        the run failed, RuntimeError when Ray Data broke the order."""
        limit = self.first if self._next == self.start else self.wait
        try:
            item = self._queue.get(timeout=limit.seconds)
        except queue.Empty:
            raise limit.error(f"batch {self._next} of the epoch, in a run of batches {self.start} to "
                              f"{self.start + self.count - 1}") from None
        if item is _END:
            if self._next != self.start + self.count:
                raise RuntimeError(f"autoloader: Ray Data ended the run after batch {self._next - 1} where batch "
                                   f"{self.start + self.count - 1} was the last; please report this with your ray "
                                   f"version")
            raise StopIteration
        if isinstance(item, _Failed):
            raise failures.run_failure(item.error, self._next) from item.error
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

    def ended(self, deadline: float) -> bool:
        """Wait until ``deadline`` (``time.monotonic()``) for the closed run's threads to end: its reading thread,
        Ray Data's iterator's (each asks Ray for one more block after the iterator closed) and its execution thread
        (which goes on cancelling the tasks of a run left early); whether all did."""
        prefix = f"{EXECUTOR_PREFIX}{self.name}_"
        for thread in [self._thread, *self._helpers,
                       *(t for t in threading.enumerate() if t.name.startswith(prefix))]:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        return True
