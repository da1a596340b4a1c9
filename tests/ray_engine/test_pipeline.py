"""The reading side of a Ray run (autoloader/ray/pipeline.py): ``Feed`` puts the chunk once within ``waits.PUT``,
hands batches out in order (a batch that raised as its ``Failure``), each within its limit (the run's first within
``first``, the others within ``wait``), turns a failed run, a broken order, a run cut short and a batch that never
comes into errors naming the fix, and stops its reading thread (and the blocks' iterator) when closed early. No Ray
needed: ``Feed`` reads a stand-in for the Ray dataset (Arrow blocks as ``work.load_block`` makes them); the real one
is in tests/integrations/test_ray_engine.py."""
import threading
import time

import pytest
import torch

pytest.importorskip("pyarrow", reason="pyarrow comes with Ray Data: pip install '.[ray]'")

from autoloader.ray import pipeline  # noqa: E402
from autoloader.ray.order import chunk_of  # noqa: E402
from autoloader.ray.pipeline import Feed, blocks_of  # noqa: E402
from autoloader.ray.records import RayConfig  # noqa: E402
from autoloader.ray.session import ITERATOR_THREAD  # noqa: E402
from autoloader.ray.transport import Failure, pack  # noqa: E402
from autoloader.ray.waits import BATCH, PUT, STARTUP  # noqa: E402


class Blocks:
    """A Ray dataset's ``iter_batches`` over ``blocks`` (lists of ``(pos, batch)``); ``fail``: raised after them;
    ``hold``: an event the iterator waits for before ending."""

    def __init__(self, blocks, fail=None, hold=None, first_delay=0.0):
        self.blocks, self.fail, self.hold, self.first_delay = blocks, fail, hold, first_delay
        self.asked, self.closed = None, threading.Event()

    def iter_batches(self, **kwargs):
        self.asked = kwargs
        return self._iterate()

    def _iterate(self):
        try:
            time.sleep(self.first_delay)
            for block in self.blocks:
                yield pack(block)
            if self.hold is not None:
                self.hold.wait(30)
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed.set()


class StandInRay:
    def __init__(self, put_delay=0.0):
        self.put_delay, self.puts = put_delay, []

    def put(self, value):
        time.sleep(self.put_delay)
        self.puts.append(value)
        return ("ref", len(self.puts))


def _feed(monkeypatch, blocks, *, count=None, start=0, first=STARTUP, wait=BATCH, ray=None,
          config=RayConfig(1, prefetch=3)):
    made = []
    monkeypatch.setattr(pipeline, "dataset_for", lambda ray, payload, ref, chunk, config, name: made.append(
        (payload, ref, chunk, config)) or blocks)
    total = count if count is not None else sum(map(len, blocks.blocks))
    chunk = chunk_of([[k] for k in range(start, start + total)], start=start, batched=True)
    feed = Feed(ray or StandInRay(), "payload", chunk, config, first=first, wait=wait)
    return feed, made


def _drain(feed):
    out = []
    try:
        while True:
            out.append(feed.next())
    except StopIteration:
        return out
    finally:
        feed.close()


def test_batches_come_in_order_with_failures_in_their_place_then_stop_iteration(monkeypatch):
    failure = Failure.of(KeyError("sample 1"))
    blocks = Blocks([[(5, torch.tensor([0])), (6, failure)], [(7, "two")]])
    ray = StandInRay()
    feed, made = _feed(monkeypatch, blocks, start=5, config=RayConfig(2, batches_per_task=2, prefetch=3), ray=ray)
    assert feed.blocks_left == 2
    got = _drain(feed)
    assert [pos for pos, _ in got] == [5, 6, 7] and got[2][1] == "two" and torch.equal(got[0][1], torch.tensor([0]))
    assert isinstance(got[1][1], Failure) and isinstance(got[1][1].error, KeyError)
    assert len(ray.puts) == 1 and made[0][:2] == ("payload", ("ref", 1)) and made[0][2] is ray.puts[0]
    assert blocks.asked == {"batch_size": None, "batch_format": "pyarrow", "prefetch_batches": 3}
    assert feed.received == 3 and feed.blocks_left == 0


def test_a_batch_out_of_place_is_an_error_naming_preserve_order(monkeypatch):
    feed, _ = _feed(monkeypatch, Blocks([[(0, "a"), (2, "c"), (1, "b")]]))
    assert feed.next() == (0, "a")
    with pytest.raises(RuntimeError, match=r"returned batch 2 where batch 1 was due: its preserve_order"):
        feed.next()
    feed.close()


def test_a_run_cut_short_is_an_error_not_a_short_epoch(monkeypatch):
    feed, _ = _feed(monkeypatch, Blocks([[(0, "a")]]), count=3)
    assert feed.next() == (0, "a")
    with pytest.raises(RuntimeError, match=r"ended the run after batch 0 where batch 2 was the last"):
        feed.next()
    feed.close()


def test_a_failed_run_is_raised_at_the_batch_it_failed_named_as_what_it_was(monkeypatch):
    class RayTaskError(Exception):
        __module__ = "ray.exceptions"

    class WorkerCrashedError(Exception):
        __module__ = "ray.exceptions"

    wrapper = RayTaskError("task failed")
    wrapper.cause = WorkerCrashedError("The worker died unexpectedly while executing this task.")
    feed, _ = _feed(monkeypatch, Blocks([[(0, "a"), (1, "b")]], fail=wrapper), count=4)
    assert [feed.next(), feed.next()] == [(0, "a"), (1, "b")]
    with pytest.raises(RuntimeError, match=r"batch \d+ of the epoch, or one loading beside it, could not be loaded: "
                                           r"the Ray worker loading it died .*WorkerCrashedError.* gave up") as info:
        feed.next()
    assert info.value.__cause__ is wrapper
    feed.close()


@pytest.mark.parametrize("which", ["first", "wait"])
def test_a_batch_that_does_not_come_is_a_timeout_naming_its_limit_within_it(monkeypatch, which):
    hold = threading.Event()
    blocks = Blocks([] if which == "first" else [[(0, "a")]], hold=hold)
    feed, _ = _feed(monkeypatch, blocks, count=5, first=STARTUP.with_seconds(0.3), wait=BATCH.with_seconds(0.3))
    if which == "wait":
        assert feed.next() == (0, "a")
    started = time.monotonic()
    name = "STARTUP" if which == "first" else "BATCH"
    with pytest.raises(TimeoutError, match=rf"within 0.3 s \(batch {0 if which == 'first' else 1} of the epoch, in a "
                                           rf"run of batches 0 to 4\) \(autoloader.ray.waits.{name}\).*`ray status`.*"
                                           rf"timeout=<seconds>"):
        feed.next()
    assert 0.25 < time.monotonic() - started < 3
    hold.set()
    feed.close()
    assert blocks.closed.wait(5)


def test_putting_the_chunk_waits_within_its_limit(monkeypatch):
    monkeypatch.setattr(pipeline, "PUT", PUT.with_seconds(0.2))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ray.put of the dataset or an epoch's order .* within 0.2 s .*"
                                           r"autoloader.ray.waits.PUT.*`ray memory`"):
        _feed(monkeypatch, Blocks([[(0, "a")]]), ray=StandInRay(put_delay=2.0))
    assert time.monotonic() - started < 1.5


def test_closing_a_run_left_early_stops_the_thread_and_the_blocks_iterator(monkeypatch):
    blocks = Blocks([[(k, k)] for k in range(200)])  # far more than the queue holds
    feed, _ = _feed(monkeypatch, blocks)
    assert feed.next() == (0, 0)
    feed.close()
    assert blocks.closed.wait(5), "the blocks' iterator was not closed: Ray Data's execution would run on"
    feed._thread.join(5)
    assert not feed._thread.is_alive()


def test_a_closed_run_has_ended_once_its_reading_thread_and_its_execution_have(monkeypatch):
    """A thread still in Ray when the user shuts Ray down makes Ray start again on it (its processes die with that
    thread): ``ended`` waits for the reading thread, blocked in Ray until its current block comes, for Ray Data's
    execution thread of this run (``StreamingExecutor-<run's name>_...``), not for another run's, and for the threads
    its iterator started."""
    hold, helper, execution, other = (threading.Event() for _ in range(4))

    class Helped(Blocks):
        def _iterate(self):  # Ray Data's iterator reads blocks in threads of its own, started as it begins
            threading.Thread(target=helper.wait, args=(30,), name=ITERATOR_THREAD).start()
            yield from super()._iterate()

    blocks = Helped([[(0, 0)]], hold=hold)
    feed, _ = _feed(monkeypatch, blocks)
    threads = [threading.Thread(target=execution.wait, args=(30,), name=f"StreamingExecutor-{feed.name}_ab12_0"),
               threading.Thread(target=other.wait, args=(30,), name="StreamingExecutor-autoloader_elsewhere_cd34_0")]
    try:
        for thread in threads:
            thread.start()
        assert feed.next() == (0, 0)
        feed.close()
        assert not feed.ended(time.monotonic() + 0.3), "the reading thread waits in Ray for its block"
        hold.set()
        assert not feed.ended(time.monotonic() + 0.3), "Ray Data's execution of the run goes on"
        execution.set()
        assert not feed.ended(time.monotonic() + 0.3), "the iterator's thread still asks Ray for its block"
        helper.set()
        started = time.monotonic()
        assert feed.ended(time.monotonic() + 5) and time.monotonic() - started < 2, "another run's is not waited for"
    finally:
        for event in (hold, helper, execution, other):
            event.set()


def test_blocks_cover_every_position_once_in_order():
    assert blocks_of(7, 3) == [(0, 3), (3, 6), (6, 7)] and blocks_of(0, 3) == [] and blocks_of(2, 5) == [(0, 2)]
