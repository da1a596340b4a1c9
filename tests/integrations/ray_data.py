"""Datasets of the Ray integration tests, importable in Ray's workers (their PYTHONPATH holds this folder)."""
from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset

from _helpers import Indexed

__all__ = ["Blocking", "Cold", "Dies", "Failing", "Gathered", "Indexed", "KeyFailing", "SlowLow", "Timed", "Where"]


class Where(Indexed):
    """``(image, index, node id)``: the node whose worker loaded the sample (the driver reports "driver")."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.driver = os.getpid()

    def __getitem__(self, index: int):
        image, index = super().__getitem__(index)
        node = "driver"
        if os.getpid() != self.driver:
            import ray

            node = ray.get_runtime_context().get_node_id()
        return image, index, node


class Failing(Indexed):
    """Raises ``ValueError`` for index ``bad`` when loaded outside the driver."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad, self.driver = bad, os.getpid()

    def __getitem__(self, index: int):
        if index == self.bad and os.getpid() != self.driver:
            raise ValueError(f"sample {index} is corrupt")
        return super().__getitem__(index)


class Blocking(Dataset):
    """Sleeps ``seconds`` per sample from index ``after`` on, outside the driver: a task that does not come back in
    time."""

    def __init__(self, n: int, seconds: float, after: int = 0) -> None:
        self.n, self.seconds, self.after, self.driver = n, seconds, after, os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if os.getpid() != self.driver and index >= self.after:
            time.sleep(self.seconds)
        return torch.zeros(2), index


class SlowLow(Indexed):
    """Indexed, but in Ray's workers a sample below ``slow`` sleeps ``seconds`` and the others ``fast``: the blocks of
    the low indices take longest, so tasks started later finish first."""

    def __init__(self, n: int, *, slow: int = 8, seconds: float = 0.2, fast: float = 0.002) -> None:
        super().__init__(n)
        self.slow, self.seconds, self.fast, self.driver = slow, seconds, fast, os.getpid()

    def __getitem__(self, index: int):
        if os.getpid() != self.driver:
            time.sleep(self.seconds if index < self.slow else self.fast)
        return super().__getitem__(index)


class Timed(SlowLow):
    """SlowLow's samples with the loading process and when it loaded them: ``(image, index, pid, start, end)``."""

    def __getitem__(self, index: int):
        start = time.time()
        image, index = super().__getitem__(index)
        return image, index, os.getpid(), start, time.time()


class KeyFailing(Indexed):
    """``__getitem__`` raises ``KeyError`` for index ``bad``, wherever it runs (a new user's corrupt sample)."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, index: int):
        if index == self.bad:
            raise KeyError(f"sample {index} has no label")
        return super().__getitem__(index)


class Dies(Indexed):
    """The Ray worker loading index ``bad`` dies (``os._exit``) the first ``times`` times it is asked (counted by
    files in ``marks``): a crash in native code, or a preempted worker."""

    def __init__(self, n: int, *, bad: int, times: int, marks: str) -> None:
        super().__init__(n)
        self.bad, self.times, self.marks, self.driver = bad, times, marks, os.getpid()

    def __getitem__(self, index: int):
        if index == self.bad and os.getpid() != self.driver:
            done = len(os.listdir(self.marks))
            if done < self.times:
                open(os.path.join(self.marks, f"death{done}"), "w").close()
                os._exit(17)
        return super().__getitem__(index)


_WARM: set = set()


class Cold(SlowLow):
    """SlowLow whose first sample in each worker process sleeps ``cold`` seconds first (per ``token``): a cluster's
    workers starting, importing torch and the dataset's module."""

    def __init__(self, n: int, *, token: str, cold: float, seconds: float, slow: int) -> None:
        super().__init__(n, slow=slow, seconds=seconds, fast=seconds)
        self.token, self.cold = token, cold

    def __getitem__(self, index: int):
        if os.getpid() != self.driver and self.token not in _WARM:
            time.sleep(self.cold)
            _WARM.add(self.token)
        return super().__getitem__(index)


class Gathered(SlowLow):
    """SlowLow whose samples, in Ray's workers, first wait until ``parties`` worker processes are loading at once (each
    leaves a file named by its pid in ``folder``; at most ``within`` seconds, then a TimeoutError naming how many came):
    proof that that many tasks were in flight together, in as many processes, however slowly Ray launches them."""

    def __init__(self, n: int, *, folder: str, parties: int = 4, slow: int = 8, seconds: float = 0.3,
                 fast: float = 0.01, within: float = 90.0, timed: bool = False) -> None:
        super().__init__(n, slow=slow, seconds=seconds, fast=fast)
        self.folder, self.parties, self.within, self.timed = folder, parties, within, timed

    def __getitem__(self, index: int):
        start = time.time()
        sample = self._gathered(index)
        return (*sample, os.getpid(), start, time.time()) if self.timed else sample

    def _gathered(self, index: int):
        """The sample, after the rendezvous (``timed``: with Timed's pid and times after it)."""
        if os.getpid() != self.driver:
            open(os.path.join(self.folder, str(os.getpid())), "w").close()
            deadline = time.monotonic() + self.within
            while len(os.listdir(self.folder)) < self.parties:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(os.listdir(self.folder))} of {self.parties} worker processes were "
                                       f"loading at once within {self.within:g} s")
                time.sleep(0.02)
        return super().__getitem__(index)
