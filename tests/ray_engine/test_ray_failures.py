"""What a failed Ray run means (autoloader/ray/failures.py): the innermost exception found through Ray's wrappers
(``cause`` attributes, Python's chain, cycles), a worker's or a node's death named as what it was with the retries
and the fix, a module missing on a node as the ``MissingModule`` it is, Ray itself lost as a ConnectionError, anything
else described by its innermost exception; and a batch that raised in a worker raised as its own exception with a note
naming the batch and the worker's traceback. No Ray needed: Ray's exception classes are stand-ins of the same names
and module; tests/integrations/test_ray_engine.py fails real tasks."""
import pickle

import pytest

from autoloader.ray.failures import TASK_RETRIES, described, original_error, raised, run_failure
from autoloader.ray.transport import Failure
from autoloader.ray.work import MissingModule


def ray_error(name, message=""):
    return type(name, (Exception,), {"__module__": "ray.exceptions"})(message)


def test_the_innermost_exception_is_found_through_rays_wrappers_and_cycles():
    own = KeyError("label")
    outer, inner = ray_error("RayTaskError", "outer"), ray_error("UserCodeException", "inner")
    outer.cause, inner.__cause__ = inner, own  # Ray's ``cause`` attribute, then Python's chain
    assert original_error(outer) is own
    first, second = ray_error("RayTaskError", "a"), ray_error("RayTaskError", "b")
    first.cause, second.cause = second, first  # a cycle of Ray's own: the last one seen
    assert original_error(first) is second
    assert original_error(own) is own


def test_a_message_with_only_rays_lines_is_described_by_rays_exception():
    error = ray_error("RayTaskError", "RaySystemError: worker died\nray.exceptions.RayTaskError: again")
    assert described(error) == "RayTaskError: RaySystemError: worker died\nray.exceptions.RayTaskError: again"
    wrapped = ray_error("UserCodeException", "UDF failed\nTraceback (most recent call last):\n  File x\n"
                                             "ValueError: sample 20 is corrupt\n\nThe above exception was the cause")
    assert described(wrapped) == "ValueError: sample 20 is corrupt"


@pytest.mark.parametrize("name, words", [
    ("OutOfMemoryError", "Ray's memory monitor killed the worker loading it"),
    ("WorkerCrashedError", "the Ray worker loading it died"),
    ("NodeDiedError", "the node running it died (preempted"),
    ("ObjectLostError", "its data was lost with a node"),
])
def test_a_death_past_rays_retries_is_named_as_what_it_was_with_the_fix(name, words):
    death = ray_error(name, "details of the death\nmore lines")
    outer = ray_error("RayTaskError", "task failed")
    outer.cause = death
    error = run_failure(outer, 17)
    assert type(error) is RuntimeError
    message = str(error)
    assert message.startswith("autoloader: batch 17 of the epoch, or one loading beside it, could not be loaded: "
                              + words)
    assert f"({name}: details of the death)" in message and f"{TASK_RETRIES + 1} times and gave up" in message
    assert "autoloader.ray.failures.TASK_RETRIES" in message and "Fix: " in message


def test_a_missing_module_is_raised_as_itself_through_rays_wrapper():
    missing = MissingModule("mydata", "n1", "RaySystemError: No module named 'mydata'")
    dual = type("RayTaskError(MissingModule)", (Exception,), {"__module__": "ray.exceptions"})("wrapped")
    dual.cause = missing
    assert run_failure(dual, 0) is missing


@pytest.mark.parametrize("name", ["RaySystemError", "GetTimeoutError", "RpcError"])
def test_ray_going_away_is_a_connection_error_naming_ray_status(name):
    failure = run_failure(ray_error(name, "node lost"), 12)
    assert isinstance(failure, ConnectionError)
    assert f"lost Ray while loading batch 12 ({name}: node lost)" in str(failure)
    assert "`ray status`" in str(failure) and "iterate again" in str(failure)


def test_anything_else_is_a_runtime_error_naming_the_innermost_exception():
    outer = ray_error("RayTaskError", "task failed")
    outer.cause = ValueError("Ray Data's own bug")
    error = run_failure(outer, 3)
    assert type(error) is RuntimeError and "while loading batch 3 of the epoch: ValueError: Ray Data's own bug" \
        in str(error)


def test_a_batch_that_raised_is_its_own_exception_with_a_note_naming_the_batch_and_the_workers_traceback():
    try:
        raise KeyError("sample 57")
    except KeyError as err:
        failure = pickle.loads(pickle.dumps(Failure.of(err)))  # as it travels
    error = raised(failure, 5)
    assert type(error) is KeyError and error.args == ("sample 57",)
    assert "raised loading batch 5 of the epoch in a Ray worker" in error.__notes__[0]
    assert "KeyError: 'sample 57'" in error.__notes__[0]


def test_a_batch_whose_exception_could_not_travel_is_described():
    failure = Failure(None, "Odd", "1-2", "Traceback ...\nOdd: 1-2")
    error = raised(failure, 0)
    assert type(error) is RuntimeError and str(error).startswith("Odd: 1-2 (raised in a Ray worker; the exception "
                                                                 "itself could not be pickled")
