"""This process's limits as autoloader.probe._process reads them: the start method workers will use (never fixing
the default as a side effect) and ``ulimit -n`` (None for unlimited)."""
from __future__ import annotations

import multiprocessing
import resource

import pytest

from autoloader.probe._process import open_files_limit, start_method


def test_the_users_context_decides_the_start_method():
    assert start_method("spawn") == "spawn"
    assert start_method(multiprocessing.get_context("fork")) == "fork"


def test_without_a_context_the_default_is_read_not_fixed():
    before = multiprocessing.get_start_method(allow_none=True)
    method = start_method()
    assert multiprocessing.get_start_method(allow_none=True) == before, "reading the method must not set it"
    assert method == (before or multiprocessing.get_all_start_methods()[0])


def test_open_files_limit_follows_the_soft_limit_and_reads_infinity_as_none(monkeypatch):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = min(512, soft if soft != resource.RLIM_INFINITY else 512)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard))
    try:
        assert open_files_limit() == (lower, None if hard == resource.RLIM_INFINITY else hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert open_files_limit() == (None, None)


@pytest.mark.parametrize("name", ["fork", "forkserver"])
def test_a_context_object_is_read_by_its_start_method(name):
    if name not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{name} is not available here")
    assert start_method(multiprocessing.get_context(name)) == name
