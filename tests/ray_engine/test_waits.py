"""Every wait's limit (autoloader/ray/waits.py): ``bounded`` returns the call's result or raises its exception, and
gives up within the limit with a TimeoutError naming what was waited for, the limit's name and seconds, and the fix,
undoing a call that returns too late; every limit has a fix and a name that is its attribute. No Ray needed; each
limit is hit through its caller in test_pipeline.py (PUT, STARTUP, BATCH), test_session.py (CONNECT, INIT, CLOSE),
test_cluster.py (QUERY, NODES), test_source_epochs.py (PUT of the dataset)."""
import threading
import time

import pytest

from autoloader.ray import waits
from autoloader.ray.waits import Limit, bounded

LIMITS = [value for value in vars(waits).values() if isinstance(value, Limit)]


def test_every_limit_is_named_after_its_attribute_and_says_the_fix():
    assert {limit.name for limit in LIMITS} == {"CONNECT", "INIT", "QUERY", "PUT", "NODES", "STARTUP", "BATCH", "CLOSE"}
    for limit in LIMITS:
        assert getattr(waits, limit.name) is limit and limit.seconds > 0 and limit.fix and limit.what
        message = str(limit.error("here"))
        assert f"within {limit.seconds:g} s (here) (autoloader.ray.waits.{limit.name}): {limit.fix}" in message


def test_a_call_within_its_limit_returns_or_raises_as_it_would():
    assert bounded(Limit("X", 5.0, "x", "y"), lambda: 42) == 42
    with pytest.raises(KeyError, match="own"):
        bounded(Limit("X", 5.0, "x", "y"), lambda: {}["own"])


def test_a_call_past_its_limit_is_given_up_on_in_time_and_undone_when_it_returns():
    release, undone = threading.Event(), []
    limit = Limit("QUERY", 0.2, "a question to the Ray cluster", "check `ray status`")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"a question to the Ray cluster did not finish within 0.2 s "
                                           r"\(ray.nodes\(\)\) \(autoloader.ray.waits.QUERY\): check `ray status`"):
        bounded(limit, lambda: release.wait(10) and "late", detail="ray.nodes()", late=undone.append)
    assert time.monotonic() - started < 1.5
    release.set()
    deadline = time.monotonic() + 5
    while not undone and time.monotonic() < deadline:
        time.sleep(0.01)
    assert undone == ["late"], "a call that returned after the caller gave up is undone"


def test_with_seconds_keeps_everything_but_the_seconds():
    assert waits.BATCH.with_seconds(3).seconds == 3.0 and waits.BATCH.with_seconds(3).fix == waits.BATCH.fix
