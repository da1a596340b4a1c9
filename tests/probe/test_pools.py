"""The native thread pools of a process (autoloader.probe._pools): a pool's record and its JSON, what a report may
claim of a limit (``limit_held``), the module pools read from imported modules only, and every pool unknown (never a
partial list) without threadpoolctl."""
from __future__ import annotations

import sys
import types

import pytest

from autoloader.probe._pools import (NativePool, library_pools, limit_held, module_pools, module_threads, pools_here,
                                     threadpoolctl)

BLAS = NativePool("libscipy_openblas", "blas", "openblas", 8, 2)
OMP = NativePool("libgomp", "openmp", "openmp", 4)


def test_a_pool_keeps_its_limit_else_what_it_found_and_says_so():
    assert (BLAS.kept, OMP.kept) == (2, 4)
    assert BLAS.label() == "libscipy_openblas (blas) 8 -> 2"
    assert OMP.label() == "libgomp (openmp) 4"
    assert NativePool("cv2", "opencv", "cv2", 3, 3).label() == "cv2 (opencv) 3", "a limit it already met is no change"


def test_a_pool_round_trips_through_json_and_refuses_anything_else():
    assert NativePool.from_dict(BLAS.to_dict()) == BLAS and NativePool.from_dict(OMP.to_dict()) == OMP
    for bad in ([1], {**OMP.to_dict(), "extra": 1}, {**OMP.to_dict(), "found": -1}, {**OMP.to_dict(), "found": True},
                {**OMP.to_dict(), "library": 5}, {**OMP.to_dict(), "limited_to": "2"}):
        with pytest.raises(ValueError, match="native pool"):
            NativePool.from_dict(bad)


@pytest.mark.parametrize("limit, pools, held", [
    (None, [BLAS], None), (None, None, None), (2, None, False), (2, [], True), (2, [BLAS], True),
    (2, [BLAS, OMP], False), (4, [BLAS, OMP], True)])
def test_a_limit_is_held_only_when_every_pool_was_seen_within_it(limit, pools, held):
    assert limit_held(limit, pools) is held


@pytest.fixture
def modules(monkeypatch):
    """Stand-ins for cv2 and numexpr in ``sys.modules`` (as imported by the user), removed after the test."""
    def put(name, **attributes):
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attributes))
    monkeypatch.delitem(sys.modules, "cv2", raising=False)
    monkeypatch.delitem(sys.modules, "numexpr", raising=False)
    return put


def test_module_pools_are_read_only_from_imported_modules(modules):
    assert module_threads("cv2") is None and module_pools() == []
    modules("cv2", getNumThreads=lambda: 6)
    modules("numexpr", get_num_threads=lambda: "3")
    assert module_pools() == [NativePool("cv2", "opencv", "cv2", 6), NativePool("numexpr", "numexpr", "numexpr", 3)]


def test_a_broken_module_pool_is_unknown_not_an_error(modules):
    def broken():
        raise RuntimeError("stubbed")
    modules("cv2", getNumThreads=broken)
    modules("numexpr")
    assert module_threads("cv2") is None and module_threads("numexpr") is None and module_pools() == []


def test_without_threadpoolctl_every_pool_is_unknown(monkeypatch, modules):
    modules("cv2", getNumThreads=lambda: 2)
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import raises ImportError
    assert threadpoolctl() is None and library_pools() is None
    assert pools_here() is None, "never the module pools alone, which would read as 'no BLAS pool'"


def test_with_threadpoolctl_the_loaded_libraries_come_first(modules):
    if threadpoolctl() is None:
        pytest.skip("threadpoolctl is not installed")
    modules("numexpr", get_num_threads=lambda: 1)
    libraries, every = library_pools(), pools_here()
    assert every == libraries + [NativePool("numexpr", "numexpr", "numexpr", 1)]
    assert all(isinstance(p.found, int) and p.found >= 0 and p.limited_to is None for p in libraries)
