import time

import psutil
import pytest


def pytest_addoption(parser):
    parser.addoption("--benchmarks", action="store_true", default=False,
                     help="run the benchmarks in tests/benchmarks (slow; not part of the default run)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--benchmarks"):
        return
    skip = pytest.mark.skip(reason="benchmark: run with --benchmarks")
    for item in items:
        if "benchmarks" in item.path.parts:
            item.add_marker(skip)


def live_children():
    """Children of this process that are still running (zombies are reaped by the time we look again)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


def wait_no_children(timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not live_children():
            return []
        time.sleep(0.05)
    return live_children()


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test must leave no child process behind (DataLoader workers included)."""
    yield
    left = wait_no_children()
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An isolated AUTOLOADER_CACHE_DIR for the test."""
    path = tmp_path / "cache"
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(path))
    return path
