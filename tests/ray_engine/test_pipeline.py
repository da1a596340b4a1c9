"""The reading side of a Ray run (autoloader/ray/pipeline.py): ``Feed`` hands batches out in order, each within its
wait, turns a failed task, a broken order and a batch that never comes into errors naming the fix, and stops its
reading thread (and the blocks' iterator) when closed early; the dataset's own exception is found inside Ray's
wrappers. No Ray needed: ``Feed`` reads a stand-in for the Ray dataset (blocks of ``pos`` and pickled ``batch``, as
``work.load_block`` makes them); the real one is in tests/integrations/test_ray_engine.py."""
import pickle
import threading
import time

import numpy as np
import pytest
import torch

from autoloader.ray import pipeline
from autoloader.ray.pipeline import Feed, described, original_error, task_failure
from autoloader.ray.records import RayConfig


class Blocks:
    """A Ray dataset's ``iter_batches`` over ``blocks`` (lists of ``(pos, batch)``); ``fail``: raised after them;
    ``hold``: an event the iterator waits for before ending."""

    def __init__(self, blocks, fail=None, hold=None):
        self.blocks, self.fail, self.hold = blocks, fail, hold
        self.asked, self.closed = None, threading.Event()

    def iter_batches(self, **kwargs):
        self.asked = kwargs
        return self._iterate()

    def _iterate(self):
        try:
            for block in self.blocks:
                pos = np.array([p for p, _ in block])
                raw = np.empty(len(block), dtype=object)
                raw[:] = [pickle.dumps(batch) for _, batch in block]
                yield {"pos": pos, "batch": raw}
            if self.hold is not None:
                self.hold.wait(30)
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed.set()


def _feed(monkeypatch, blocks, *, count=None, wait_s=5.0, config=RayConfig(1, prefetch=3)):
    made = []
    monkeypatch.setattr(pipeline, "dataset_for", lambda ray, payload, batches, config, *, batched: made.append(
        (batches, config, batched)) or blocks)
    feed = Feed(None, "payload", list(range(count if count is not None else sum(map(len, blocks.blocks)))), config,
                batched=True, wait_s=wait_s)
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


def test_batches_come_in_order_unpickled_then_stop_iteration(monkeypatch):
    blocks = Blocks([[(0, torch.tensor([0])), (1, {"y": 1})], [(2, "two")]])
    feed, made = _feed(monkeypatch, blocks, config=RayConfig(2, batches_per_task=2, prefetch=3))
    got = _drain(feed)
    assert [pos for pos, _ in got] == [0, 1, 2] and got[1][1] == {"y": 1} and got[2][1] == "two"
    assert torch.equal(got[0][1], torch.tensor([0])) and isinstance(got[0][0], int)
    assert made == [([0, 1, 2], RayConfig(2, batches_per_task=2, prefetch=3), True)]
    assert blocks.asked == {"batch_size": None, "batch_format": "numpy", "prefetch_batches": 3}
    assert feed.count == 3


def test_a_batch_out_of_place_is_an_error_naming_preserve_order(monkeypatch):
    feed, _ = _feed(monkeypatch, Blocks([[(0, "a"), (2, "c"), (1, "b")]]))
    assert feed.next() == (0, "a")
    with pytest.raises(RuntimeError, match=r"returned batch 2 where batch 1 was due: its preserve_order"):
        feed.next()
    feed.close()


def test_a_failed_task_is_raised_at_the_batch_it_failed_naming_the_datasets_exception(monkeypatch):
    class RayTaskError(Exception):
        __module__ = "ray.exceptions"

    wrapper = RayTaskError("task failed")
    wrapper.cause = ValueError("sample 7 is corrupt")
    feed, _ = _feed(monkeypatch, Blocks([[(0, "a"), (1, "b")]], fail=wrapper), count=4)
    assert [feed.next(), feed.next()] == [(0, "a"), (1, "b")]
    with pytest.raises(RuntimeError, match=r"loading batch 2 of the epoch: ValueError: sample 7 is corrupt") as info:
        feed.next()
    assert info.value.__cause__ is wrapper
    feed.close()


def test_a_batch_that_does_not_come_is_a_timeout_naming_the_fix_within_its_wait(monkeypatch):
    hold = threading.Event()
    blocks = Blocks([[(0, "a")]], hold=hold)
    feed, _ = _feed(monkeypatch, blocks, count=5, wait_s=0.3)
    assert feed.next() == (0, "a")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 0 s \(batch 1 of 5\).*`ray status`.*pass timeout=<seconds> to "
                                           r"make_loader"):
        feed.next()
    assert 0.25 < time.monotonic() - started < 3
    hold.set()
    feed.close()
    assert blocks.closed.wait(5)


def test_closing_a_run_left_early_stops_the_thread_and_the_blocks_iterator(monkeypatch):
    blocks = Blocks([[(k, k) for k in range(4)] for _ in range(50)])  # far more than the queue holds
    feed, _ = _feed(monkeypatch, blocks)
    assert feed.next() == (0, 0)
    feed.close()
    assert blocks.closed.wait(5), "the blocks' iterator was not closed: Ray Data's execution would run on"
    feed._thread.join(5)
    assert not feed._thread.is_alive()


def test_the_datasets_own_exception_is_found_through_rays_wrappers_and_cycles():
    class RayTaskError(Exception):
        __module__ = "ray.exceptions"

    class UserCodeException(Exception):
        __module__ = "ray.data.exceptions"

    own = KeyError("label")
    outer, inner = RayTaskError("outer"), UserCodeException("inner")
    outer.cause, inner.__cause__ = inner, own  # Ray's ``cause`` attribute, then Python's chain
    assert original_error(outer) is own
    first, second = RayTaskError("a"), RayTaskError("b")
    first.cause, second.cause = second, first  # a cycle of Ray's own: the last one seen
    assert original_error(first) is second
    assert original_error(own) is own


def test_a_message_with_only_rays_lines_is_described_by_rays_exception():
    class RayTaskError(Exception):
        __module__ = "ray.exceptions"

    error = RayTaskError("RaySystemError: worker died\nray.exceptions.RayTaskError: again")
    assert described(error) == "RayTaskError: RaySystemError: worker died\nray.exceptions.RayTaskError: again"


@pytest.mark.parametrize("name", ["RaySystemError", "GetTimeoutError"])
def test_ray_going_away_is_a_connection_error_naming_ray_status(name):
    error = type(name, (Exception,), {"__module__": "ray.exceptions"})("node lost")
    failure = task_failure(error, 12)
    assert isinstance(failure, ConnectionError)
    assert f"lost Ray while loading batch 12 ({name}: node lost)" in str(failure)
    assert "`ray status`" in str(failure) and "iterate again" in str(failure)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (page-locked memory)")
def test_a_pinned_batch_has_every_tensor_page_locked_and_the_rest_unchanged():
    batch = {"x": torch.zeros(3), "pair": (torch.ones(2), "name"), "n": 4}
    out = pipeline.pinned(batch)
    assert out["x"].is_pinned() and out["pair"][0].is_pinned() and out["pair"][1] == "name" and out["n"] == 4
    assert not batch["x"].is_pinned() and torch.equal(out["pair"][0], batch["pair"][0])
