"""autoloader/loader/lost_worker.py: a connection a killed worker broke reaches the loop as torch's report of that
worker's death, chained to it, and that report is consumed (no late SIGCHLD repeats it); anything else goes on
unchanged (NOTE [ A connection a dead worker broke ])."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils import signal_handling

from autoloader.loader.epoch_iter import Failed
from autoloader.loader.lost_worker import broken_connection, reported
from autoloader.loader.stream_copy import load
from autoloader.loader.transform import InputTransform

from helpers import live_children, wait_no_children

NONE = InputTransform(normalize=None, dtype=None, input_key=None)


class Numbers(Dataset):
    def __len__(self) -> int:
        return 1 << 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), i)


def broken() -> EOFError:
    """An EOFError raised where a dead worker's raises: inside ``multiprocessing``, reading a closed connection."""
    mine, theirs = multiprocessing.Pipe()
    theirs.close()
    try:
        mine.recv()
    except EOFError as exc:
        return exc
    finally:
        mine.close()
    raise AssertionError("reading a pipe whose other end is closed raised nothing")


def raised_here(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: B036 - the test's own
        return caught


def test_only_a_connection_error_raised_inside_multiprocessing_is_a_broken_worker_connection():
    assert broken_connection(broken())
    assert not broken_connection(raised_here(ConnectionResetError(104, "Connection reset by peer")))  # the dataset's
    assert not broken_connection(raised_here(EOFError("Caught EOFError in DataLoader worker process 0.")))
    assert not broken_connection(raised_here(ValueError("a bad sample")))
    assert not broken_connection(ConnectionResetError())  # never raised: no traceback


class ChildSignals:
    """SIGCHLD held back while the test kills a worker and asks (torch's handler would report the death first)."""

    def __enter__(self) -> "ChildSignals":
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        return self

    def __exit__(self, *exc: object) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def test_a_killed_workers_broken_connection_becomes_torchs_report_and_no_late_signal_repeats_it():
    before = {p.pid for p in live_children()}
    it = iter(DataLoader(Numbers(), batch_size=4, num_workers=1))
    next(it)
    worker = next(p for p in live_children() if p.pid not in before)
    connection_error = broken()
    try:
        with ChildSignals():
            os.kill(worker.pid, signal.SIGKILL)
            death = load(_raising(connection_error), None, torch.device("cpu"), NONE)
            signal_handling._error_if_any_worker_fails()  # what the late SIGCHLD runs: reported once, nothing left
        assert isinstance(death, Failed) and isinstance(death.exception, RuntimeError), death
        assert f"DataLoader worker (pid {worker.pid}) is killed by signal" in str(death.exception)
        assert death.exception.__cause__ is connection_error
        assert not death.consumed  # a worker's death used no batch: a checkpoint does not count it
    finally:
        del it
    assert not wait_no_children()


def _raising(exc: BaseException):
    raise exc
    yield  # a generator: ``load`` calls next() on it


def test_a_broken_connection_with_no_death_goes_on_unchanged_after_the_wait():
    connection_error = broken()
    start = time.monotonic()
    assert reported(connection_error, wait_s=0.05) is connection_error
    assert time.monotonic() - start < 5


def test_any_other_error_goes_on_unchanged_at_once():
    for exc in (raised_here(ConnectionResetError(104, "Connection reset by peer")), raised_here(ValueError("bad"))):
        start = time.monotonic()
        assert reported(exc, wait_s=30) is exc
        assert time.monotonic() - start < 5
        assert load(_raising(exc), None, torch.device("cpu"), NONE).exception is exc



class Remote(Dataset):
    """A dataset reading over a connection that broke (a network dataset's reset connection, a dead
    ``multiprocessing.Manager``): its own EOFError, raised inside ``multiprocessing`` as a dead worker's is."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        raise broken()


def test_a_datasets_own_connection_error_without_workers_is_raised_at_once():
    """``num_workers=0``: no worker can have died, so the dataset's own connection error is no broken worker
    connection and is not held for a death (it was held ``DEATH_WAIT_S`` before, on every batch)."""
    it = iter(DataLoader(Remote(), batch_size=2, num_workers=0))
    try:
        next(it)
    except EOFError as exc:
        own = exc
    else:
        raise AssertionError("the dataset's EOFError was not raised")
    assert broken_connection(broken())  # the same error outside a fetcher: what a dead worker's looks like
    assert not broken_connection(own)  # raised inside multiprocessing too, but under DataLoader's fetcher
    start = time.monotonic()
    assert reported(own, wait_s=30) is own and time.monotonic() - start < 5
    failed = load(iter(DataLoader(Remote(), batch_size=2, num_workers=0)), None, torch.device("cpu"), NONE)
    assert isinstance(failed, Failed) and isinstance(failed.exception, EOFError)


def test_the_prefetcher_raises_the_datasets_own_connection_error_itself():
    from autoloader import PrefetchLoader

    loader = PrefetchLoader(DataLoader(Remote(), batch_size=2, num_workers=0), device="cpu")
    it = iter(loader)
    for _ in range(2):  # each batch that raises is raised by its next(), and the epoch goes on
        try:
            next(it)
        except EOFError as exc:
            assert not isinstance(exc, RuntimeError) and exc.__cause__ is None
        else:
            raise AssertionError("the dataset's EOFError was not raised")

