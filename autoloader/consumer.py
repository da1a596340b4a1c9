"""The consumer step that trials are timed against: nothing, a simulated step of N seconds, or the user's callable."""
from __future__ import annotations

import math
import numbers
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Tuple, Union

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
    """Calibrate ``torch.cuda._sleep`` (a spin of N GPU clock cycles) against CUDA events, once per device.

    The clock is warmed first (about 100 ms of spinning: an idle GPU runs slow clocks until it has work), then the
    median of five ~50 ms spins is taken, so one spin that shared the GPU with another job does not skew it.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CYCLES_PER_S:
        with torch.cuda.device(index):
            estimate = _spin_rate(1_000_000)
            _spin_rate(int(0.1 * estimate))
            rates = sorted(_spin_rate(int(0.05 * estimate)) for _ in range(5))
        _CYCLES_PER_S[index] = rates[len(rates) // 2]
    return _CYCLES_PER_S[index]


def _spin_rate(cycles: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(max(1, cycles))
    end.record()
    end.synchronize()
    return max(1, cycles) / max(1e-6, start.elapsed_time(end) / 1000.0)


LEAD_STEPS = 2
"""How many steps the host may queue ahead of the GPU during a trial (see NOTE [ Trial timing ])."""


class Consumer:
    """Eats one batch the way training will.

    ``None``: nothing beyond the transfer the prefetcher already did. A number: a simulated step of that many seconds
    that leaves the host CPU free, as a real GPU step does (``time.sleep`` on CPU; on CUDA a GPU-side spin calibrated
    to seconds, queued asynchronously on ``device``). A callable: called with the batch. On CUDA, ``pace()`` after each
    step keeps the host at most ``LEAD_STEPS`` steps ahead of the GPU, and ``synchronize()`` waits for all queued work
    (see NOTE [ Trial timing ] in run.py); on the CPU both are no-ops.
    """

    def __init__(self, step: Step, device: torch.device) -> None:
        check_step(step)
        self.step = step
        self.device = torch.device(device)
        self._cycles: Optional[int] = None
        self._events: Deque[Any] = deque()
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
            with torch.cuda.device(self.device):
                torch.cuda._sleep(self._cycles)
        elif step > 0:
            time.sleep(float(step))

    def pace(self) -> None:
        """Bound the host's lead over an asynchronous device: record an event after this step and wait for the one
        recorded ``LEAD_STEPS`` steps ago."""
        if self.device.type != "cuda":
            return
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._events.append(event)
        if len(self._events) > LEAD_STEPS:
            self._events.popleft().synchronize()

    def synchronize(self) -> None:
        self._events.clear()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def seconds_per_batch(self, batch: Any, *, seconds: float = 0.25, max_calls: int = 20) -> float:
        """Time the step alone on one batch already on the device: each call synchronised, so the 0.25 s stop sees
        the device's time, not how fast the host queues work (``cost_per_batch``'s wall seconds)."""
        return self.cost_per_batch(batch, seconds=seconds, max_calls=max_calls)[0]

    def cost_per_batch(self, batch: Any, *, seconds: float = 0.25, max_calls: int = 20) -> Tuple[float, float]:
        """(wall seconds, this process's CPU seconds) of the step alone on one batch already on the device, each call
        synchronised, for ``seconds`` and at least two calls (at most ``max_calls``): the step's pace, and the CPUs it
        keeps busy meanwhile (a CPU step's intra-op pool; a GPU step's host work)."""
        if self.is_noop:
            return 0.0, 0.0
        self(batch)
        self.synchronize()
        calls = 0
        start, cpu = time.perf_counter(), time.process_time()
        while calls < max_calls:
            self(batch)
            self.synchronize()
            calls += 1
            if calls >= 2 and time.perf_counter() - start >= seconds:
                break
        return (time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls
