"""Hooks (the per-test watchdog, --benchmarks and --stress) and shared fixtures only; helpers live in helpers.py."""
import faulthandler
import os
import sys
import threading

import psutil
import pytest

from helpers import USER_CODE, USER_MODULE, wait_no_children

WATCHDOG_S = float(os.environ.get("AUTOLOADER_TEST_WATCHDOG_S", "240"))
"""A test still running after this many seconds is stuck: the watchdog prints every thread's stack and ends the run
(the benchmarks get ten times as long)."""
_WATCHDOG_FD = None


def pytest_addoption(parser):
    parser.addoption("--benchmarks", action="store_true", default=False,
                     help="run the benchmarks in tests/benchmarks (slow; not part of the default run)")
    parser.addoption("--stress", action="store_true", default=False,
                     help="run the fault stress test in tests/stress (minutes; not part of the default run)")


def pytest_configure(config):
    """Keep a descriptor of the real stderr: the one pytest captures into is lost when the watchdog ends the run."""
    global _WATCHDOG_FD
    try:
        fileno = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        fileno = sys.__stderr__.fileno()
    _WATCHDOG_FD = os.dup(fileno)


def _stuck(nodeid: str, limit: float) -> None:
    """The watchdog's verdict: every thread's stack on the real stderr, the test's children killed, the run ended
    with exit status 3, so CI fails within minutes instead of hanging for its 90."""
    fd = _WATCHDOG_FD if _WATCHDOG_FD is not None else 2
    os.write(fd, f"\n\n*** watchdog: {nodeid} is still running after {limit:.0f} s; every thread's stack follows, "
                 f"then the run ends (AUTOLOADER_TEST_WATCHDOG_S sets the limit)\n".encode())
    faulthandler.dump_traceback(file=fd, all_threads=True)
    children = psutil.Process().children(recursive=True)
    os.write(fd, f"*** killing {len(children)} child process(es): {[c.pid for c in children]}\n".encode())
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            continue
    os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A per-test watchdog: a Python timer that reports and ends a stuck run, and faulthandler's C-level timer
    (which needs no GIL) 30 s later in case the stuck thread holds the GIL."""
    long = {"benchmarks", "stress"} | ({"properties"} if os.environ.get("AUTOLOADER_PROPERTIES") else set())
    limit = WATCHDOG_S * (10 if long & set(item.path.parts) else 1)
    timer = threading.Timer(limit, _stuck, args=(item.nodeid, limit))
    timer.daemon = True
    timer.start()
    fd = _WATCHDOG_FD if _WATCHDOG_FD is not None else 2
    faulthandler.dump_traceback_later(limit + 30, exit=True, file=fd)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


def pytest_collection_modifyitems(config, items):
    """The benchmarks and the stress test run only when asked for (--benchmarks, --stress)."""
    for folder, option in (("benchmarks", "--benchmarks"), ("stress", "--stress")):
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=f"{folder}: run with {option}")
        for item in items:
            if folder in item.path.parts:
                item.add_marker(skip)


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


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A directory holding the user's module, used as the cwd; AUTOLOADER_CACHE_DIR is its ``cache`` folder."""
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_CODE)
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)  # the cwd first, as load_dataset makes it
    yield tmp_path
    sys.modules.pop(USER_MODULE, None)
