"""The consumer step that trials are timed against: nothing, a simulated step of N seconds, or the user's callable."""
from __future__ import annotations

import math
import numbers
import time
from typing import Any, Callable, Dict, Optional, Union

import torch

Step = Union[None, float, int, Callable[[Any], Any]]

_CYCLES_PER_S: Dict[int, float] = {}


def check_step(step: Any) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``step`` is None, a number of seconds >= 0, or a callable."""
    if step is None or callable(step):
        return
    if isinstance(step, bool) or not isinstance(step, numbers.Real):
        raise TypeError(
            f"step must be None, a number of seconds per batch, or a callable taking a batch; got {type(step).__name__}"
            f" {step!r}. Pass step=0.05 to simulate a 50 ms training step, or step=train_step."
        )
    if not math.isfinite(float(step)) or step < 0:
        raise ValueError(f"step={step!r} must be a finite number of seconds >= 0 (e.g. step=0.05)")


def _cuda_cycles_per_second(device: torch.device) -> float:
    """Calibrate ``torch.cuda._sleep`` (a spin of N GPU clock cycles) against CUDA events, once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CYCLES_PER_S:
        cycles = 10_000_000
        best = 0.0
        with torch.cuda.device(index):
            torch.cuda._sleep(1000)
            for _ in range(3):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(cycles)
                end.record()
                end.synchronize()
                best = max(best, cycles / (start.elapsed_time(end) / 1000.0))
        _CYCLES_PER_S[index] = best
    return _CYCLES_PER_S[index]


class Consumer:
    """Eats one batch the way training will.

    ``None``: nothing beyond the transfer the prefetcher already did. A number: a simulated step of that many seconds
    that leaves the host CPU free, as a real GPU step does (``time.sleep`` on CPU; on CUDA a GPU-side spin calibrated
    to seconds, queued asynchronously). A callable: called with the batch. ``synchronize()`` waits for queued device
    work; trials call it at the end of their timed window only (see NOTE [ Trial timing ] in trial.py).
    """

    def __init__(self, step: Step, device: torch.device) -> None:
        check_step(step)
        self.step = step
        self.device = torch.device(device)
        self._cycles: Optional[int] = None
        if isinstance(step, numbers.Real) and step > 0 and self.device.type == "cuda":
            self._cycles = int(float(step) * _cuda_cycles_per_second(self.device))

    @property
    def is_noop(self) -> bool:
        return self.step is None or (not callable(self.step) and float(self.step) == 0.0)

    def __call__(self, batch: Any) -> None:
        step = self.step
        if step is None:
            return
        if callable(step):
            step(batch)
        elif self._cycles is not None:
            torch.cuda._sleep(self._cycles)
        elif step > 0:
            time.sleep(float(step))

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def seconds_per_batch(self, batch: Any, *, seconds: float = 0.25, max_calls: int = 20) -> float:
        """Time the step alone on one batch already on the device: calls it back to back, then synchronises."""
        if self.is_noop:
            return 0.0
        self(batch)
        self.synchronize()
        calls = 0
        start = time.perf_counter()
        while calls < max_calls:
            self(batch)
            calls += 1
            if calls >= 2 and time.perf_counter() - start >= seconds:
                break
        self.synchronize()
        return (time.perf_counter() - start) / calls
