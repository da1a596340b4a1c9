"""A batch on its way to the device: copied on the device's side CUDA stream while the consumer works on the batch
before it, converted and normalised there (``load``), and handed to the consumer's stream (``handed``); on the CPU
only converted. The rule for when the next batch is read ahead (``reads_ahead``) is here too.

# NOTE [ Stream synchronisation ]
# Batch i+1 is copied (and converted) on one side stream while the consumer's stream runs its step on batch i.
# Three rules keep that correct, with no host-device synchronisation:
# 1. Before the side stream writes batch i+1, it waits on the consumer's current stream
#    (``side.wait_stream(consumer)``): work the consumer queued (e.g. on tensors that feed the batch) is done.
# 2. Before batch i is handed out, the consumer stream waits on the side stream. This happens before batch i+1's
#    copy is queued, so the consumer waits for batch i's copy only and the copy of i+1 overlaps its step.
# 3. Each handed-out tensor was allocated on the side stream; ``record_stream(consumer)`` tells the caching
#    allocator not to reuse its memory until the consumer's queued work on it has finished.
# The side stream is the device's one (NOTE [ One side stream per device ] in device.py): a stream per epoch or
# per loader strands each one's cached blocks in a pool no later stream can use (timm issue 2781).
# On the CPU the same loop runs with ``contextlib.nullcontext()`` in place of the stream context, no copy, and
# nothing read ahead (``reads_ahead``): the next batch is fetched when the loop asks for it. Reading ahead loads
# batch i+1 (and makes its RNG draws, with num_workers=0) before the loop's draws after batch i; a checkpoint
# taken then keeps what it needs to load that batch again (NOTE [ Exact resume ], ``ahead``, in resume/state.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch

from .batch import Batch, iter_tensors, map_tensors
from .epoch_iter import END, Failed
from .lost_worker import reported
from .source import BatchError, consumed
from .transform import InputTransform


def load(it: Iterator[Batch], stream: Optional["torch.cuda.Stream"], device: torch.device,
         transform: InputTransform) -> Any:
    """The next batch of ``it``, copied to ``device`` on ``stream`` (rule 1 of NOTE [ Stream synchronisation ]; None:
    not copied) and transformed; ``END`` when ``it`` is exhausted, ``Failed`` when its loading, copy or transform
    raised (NOTE [ A batch that raises ] in source.py; a worker's broken connection as torch's report of its death:
    NOTE [ A connection a dead worker broke ] in lost_worker.py)."""
    try:
        batch = next(it)
    except StopIteration:
        return END
    except Exception as exc:  # noqa: B036 - raised at the loop's next(); the epoch goes on if the source does
        exc = reported(exc)  # NOTE [ A connection a dead worker broke ]
        return Failed(exc, consumed(exc))
    if isinstance(batch, BatchError):
        return Failed(batch.exception, True)
    if stream is None and not transform.active:
        return batch
    consumer = torch.cuda.current_stream(device) if stream is not None else None
    context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    try:
        with context:
            if stream is not None and consumer is not None:  # both or neither
                stream.wait_stream(consumer)
                batch = map_tensors(lambda t: t.to(device, non_blocking=True), batch)
            if transform.active:
                batch = transform(batch)
    except Exception as exc:  # noqa: B036 - this batch's failure (e.g. normalize on a malformed batch)
        return Failed(exc, True)
    return batch


def handed(stream: Optional["torch.cuda.Stream"], device: torch.device, batch: Batch) -> None:
    """Before a batch is handed out: the consumer's stream waits for its copy, and its tensors are recorded on the
    consumer's stream (NOTE [ Stream synchronisation ], rules 2 and 3). Nothing without a side stream."""
    if stream is None:
        return
    consumer = torch.cuda.current_stream(device)
    consumer.wait_stream(stream)
    for tensor in iter_tensors(batch):
        if tensor.is_cuda:
            tensor.record_stream(consumer)


def reads_ahead(stream: Optional["torch.cuda.Stream"]) -> bool:
    """Whether the prefetcher fetches the next batch before handing out the current one: only with a side stream,
    so that its copy overlaps the consumer's step (NOTE [ Stream synchronisation ]); on the CPU nothing would overlap,
    and reading ahead would load (and draw for) a batch before the loop's own draws, unlike a plain DataLoader."""
    return stream is not None
