"""``memory_budget=`` and ``native_threads=`` checked by ``Request.checked`` (so by ``make_loader`` and ``tune``
before any work): each error names the argument, the value and the fix."""
import numpy as np
import pytest

from autoloader import make_loader
from autoloader.request import Request
from workloads import InMemory


@pytest.mark.parametrize("value, expected", [
    (None, None), (0.5, 0.5), (1.0, 1.0), (1, 1), (8 * 2**30, 8 * 2**30), (np.int64(4096), 4096),
    (np.float32(0.25), 0.25),
])
def test_memory_budget_accepts_bytes_or_a_fraction(value, expected):
    got = Request.checked(InMemory(n=10), 2, device="cpu", memory_budget=value).memory_budget
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("value, error, words", [
    ("8GB", TypeError, ["memory_budget", "'8GB'", "memory_budget=0.5", "8 * 2**30"]),
    (True, TypeError, ["memory_budget", "True"]),
    ([1], TypeError, ["memory_budget"]),
    (0, ValueError, ["memory_budget=0", ">= 1 byte", "memory_budget=0.5"]),
    (-5, ValueError, ["memory_budget=-5", ">= 1 byte"]),
    (0.0, ValueError, ["memory_budget=0.0", "(0, 1]"]),
    (1.5, ValueError, ["memory_budget=1.5", "(0, 1]", "as an int"]),
    (float("nan"), ValueError, ["memory_budget=nan", "(0, 1]"]),
    (8e9, ValueError, ["memory_budget=8000000000.0", "memory_budget=8000000000"]),
])
def test_memory_budget_errors_name_the_argument_and_the_fix(value, error, words):
    refused_naming_the_fix("memory_budget", value, error, words)


def refused_naming_the_fix(argument, value, error, words):
    """``argument=value`` raises ``error`` with every one of ``words`` in it, from ``Request.checked`` and from
    ``make_loader`` alike."""
    with pytest.raises(error) as info:
        Request.checked(InMemory(n=10), 2, device="cpu", **{argument: value})
    for word in words:
        assert word in str(info.value), str(info.value)
    with pytest.raises(error, match=argument):
        make_loader(InMemory(n=10), 2, device="cpu", cache=False, **{argument: value})


@pytest.mark.parametrize("value, expected", [(None, None), (False, False), (1, 1), (8, 8), (np.int64(2), 2)])
def test_native_threads_accepts_none_false_or_a_positive_int(value, expected):
    got = Request.checked(InMemory(n=10), 2, device="cpu", native_threads=value).native_threads
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("value, error, words", [
    (True, ValueError, ["native_threads=True", "leave it out", "native_threads=1", "native_threads=False"]),
    (0, ValueError, ["native_threads=0", ">= 1", "native_threads=False"]),
    (-2, ValueError, ["native_threads=-2"]),
    (1.5, TypeError, ["native_threads", "1.5", "float"]),
    ("1", TypeError, ["native_threads", "'1'"]),
])
def test_native_threads_errors_name_the_argument_and_the_fix(value, error, words):
    refused_naming_the_fix("native_threads", value, error, words)
