"""Helpers shared by several test files (importable as ``helpers``: setup.cfg puts tests/ on the path).

conftest.py holds only hooks and fixtures; what a test calls goes here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator, Optional
from unittest import mock

import psutil
import torch

from autoloader.probe import CpuInfo, DiskInfo, GpuInfo, MachineProfile, MemoryInfo, ShmInfo
from autoloader.config import LoaderConfig
from autoloader.loader.epoch_iter import release_reraise
from autoloader.results import TrialResult, TuneResult

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MIB = 1 << 20
GIB = 1 << 30


# ---------------------------------------------------------------- child processes

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


def pool_threads() -> list:
    """The threads of every live ``DaemonPool`` (loader/thread_pool.py) in this process."""
    return [t for t in threading.enumerate() if t.name.startswith("autoloader-threads")]


def wait_no_children(timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not live_children():
            return []
        time.sleep(0.05)
    return live_children()


def round_trip(state: dict, how: str) -> dict:
    """A checkpoint state as written and read back: ``how="json"``, else torch.save and torch.load(weights_only=True)."""
    if how == "json":
        return json.loads(json.dumps(state))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# ---------------------------------------------------------------- the autotune command

USER_MODULE = "autotune_user_data"
"""The user's module the CLI tests load datasets from (written by the ``work`` fixture in conftest.py)."""
USER_CODE = textwrap.dedent('''
    import time
    import torch
    from torch.utils.data import Dataset

    class Squares(Dataset):
        """Tiny samples with a 0.2 ms cost each, so every trial is short."""
        def __init__(self, n=192):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            end = time.perf_counter() + 0.0002
            while time.perf_counter() < end:
                pass
            return torch.full((8,), float(i)), i

    def make_ds():
        return Squares()

    def make_list():
        return [1, 2, 3]

    answer = 42
    ''')


def run_cli(args, cwd, timeout=120, prefix=()):
    """``autotune ARGS`` in a subprocess run in ``cwd``, with ``cwd/cache`` as its cache; ``prefix`` goes before the
    interpreter (e.g. ``taskset -c 0``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOLOADER_CACHE_DIR": str(Path(cwd) / "cache")}
    return subprocess.run([*prefix, sys.executable, "-m", "autoloader.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def one_line_error(err: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err


# ---------------------------------------------------------------- fake results and profiles

def trial(n, rate, *, prefetch=2, status="ok", reason=None, batch_bytes=MIB, **kw):
    config = LoaderConfig(n, prefetch if n else None, False, False)
    return TrialResult(config=config, status=status, reason=reason, samples_per_s=rate if status == "ok" else None,
                       startup_s=0.1, stall_fraction=0.2 if status == "ok" else None,
                       worker_cpu_util=0.9 if n and status == "ok" else None, batch_bytes=batch_bytes, **kw)


def tuned_result(**kw):
    """A TuneResult; knob keywords (num_workers=..., threads=...) set its ``config``, the rest its fields."""
    trials = (trial(0, 500.0), trial(2, 980.0), trial(4, 1000.0),
              trial(8, None, status="skipped", reason="memory: 8 workers x 900 MiB exceed the budget"),
              trial(16, None, status="failed", reason="worker died: killed"))
    knobs = dict(num_workers=2, prefetch_factor=2, pin_memory=False, persistent_workers=True, threads=1,
                 native_threads=None)
    knobs.update({k: kw.pop(k) for k in list(kw) if k in knobs})
    base = dict(config=LoaderConfig(**knobs), samples_per_s=980.0, bottleneck="cpu", source="tuned", trials=trials,
                consumer_samples_per_s=2000.0, seconds=6.5, reason="fewest workers within 5% of the best",
                created=1.7e9)
    base.update(kw)
    return TuneResult(**base)


def drive_search(search, model):
    """Run a ``Search``'s generator, answering each candidate with ``model(config)`` (a fake ``TrialResult``): the
    configurations it asked for, in order, and its result."""
    steps = search.steps()
    asked = []
    candidate = next(steps)
    try:
        while True:
            asked.append(candidate.config)
            candidate = steps.send(model(candidate.config))
    except StopIteration as done:
        return asked, done.value


def full_profile():
    """A MachineProfile with every fact known (two fake GPUs, a measured disk)."""
    G = GIB
    return MachineProfile(
        cpu=CpuInfo(usable=3, logical=8, physical=4, model="Test CPU", affinity=6, quota=2.5),
        memory=MemoryInfo(total_bytes=16 * G, available_bytes=10 * G, limit_bytes=8 * G, budget_bytes=7 * G),
        shm=ShmInfo("/dev/shm", 8 * G, None),
        disk=DiskInfo("/data", 640.0, 12000.0, 9000.0, "o_direct"),
        gpus=(GpuInfo(0, "Fake GPU", 80 * G), GpuInfo(1, "Fake GPU", 80 * G)),
        start_method="spawn", torch_version="2.13.0", python_version="3.11.7",
        thread_env={"OMP_NUM_THREADS": "1"}, created=1700000000.5)


def probe_files(directory):
    """The disk probe's scratch files left in ``directory`` (there should be none)."""
    return sorted(n for n in os.listdir(directory) if n.startswith(".autoloader-disk-probe-"))


# ---------------------------------------------------------------- benchmarks

_TABLES_WRITTEN = set()


def selected_workloads(default: str, known) -> list:
    """The workloads a benchmark runs: ``AUTOLOADER_BENCH_WORKLOADS`` (comma-separated), else ``default``; a
    ValueError naming any that is not in ``known``."""
    selected = [n.strip() for n in os.environ.get("AUTOLOADER_BENCH_WORKLOADS", default).split(",") if n.strip()]
    unknown = sorted(set(selected) - set(known))
    if unknown:
        raise ValueError(f"AUTOLOADER_BENCH_WORKLOADS: unknown {unknown}; known: {sorted(known)}")
    return selected


def measured_as(config: LoaderConfig) -> LoaderConfig:
    """``config`` as a trial runs it: trials never keep workers alive (``TuneResult.config`` may say they will), so
    a tuner's choice and the same sweep point are one configuration."""
    return dataclasses.replace(config, persistent_workers=False)


@contextlib.contextmanager
def longer_windows(seconds: float) -> Iterator[None]:
    """Trials timed at least ``seconds`` (``measure.window.Window``'s ``min_window_s``): ``run_trial`` takes no
    such argument, so the benchmark's trials build their windows with it while this lasts (tune() never does)."""
    from autoloader.measure import run as measure_run

    with mock.patch.object(measure_run, "Window", functools.partial(measure_run.Window, min_window_s=seconds)):
        yield


def emit_table(text: str) -> None:
    """Print a benchmark's markdown tables and write them to ``AUTOLOADER_BENCH_TABLE`` when set: the first module of
    a run truncates the file, later ones append, so ``pytest tests/benchmarks`` leaves every module's tables."""
    print("\n" + text)
    path = os.environ.get("AUTOLOADER_BENCH_TABLE")
    if path:
        with open(path, "a" if path in _TABLES_WRITTEN else "w") as fh:
            fh.write(text + "\n\n")
        _TABLES_WRITTEN.add(path)


# ---------------------------------------------------------------- a loader against a plain DataLoader

def plain(value):
    """A batch as plain values that keep what a user can tell apart: a tensor as its dtype and values, an array
    likewise, a namedtuple, tuple, list or dict with its type; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy
        return ("array", str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return (type(value).__name__, {k: plain(v) for k, v in value.items()})
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [plain(v) for v in value])
    return value


def said(error: BaseException) -> str:
    """What an exception says, the same whether it was raised in the main process or re-raised from a worker."""
    lines = str(error).strip().splitlines() or [""]
    last = lines[-1]
    return last.split(": ", 1)[1] if last.startswith(type(error).__name__ + ": ") else last.strip("'\"")


def drain(loader, *, limit: int = 1000) -> list:
    """One epoch of ``loader`` as a loop that logs an exception and goes on sees it: each batch as ``plain`` values,
    each exception as ``("raised", type name, what it says)``."""
    out: list = []
    it = iter(loader)
    while len(out) < limit:
        try:
            batch = next(it)
        except StopIteration:
            break
        except Exception as error:
            out.append(("raised", type(error).__name__, said(error)))
            release_reraise(error)  # a plain DataLoader's would keep its workers until a collection
        else:
            out.append(plain(batch))
    return out


def raised(loader) -> Optional[tuple]:
    """``(type name, what it says)`` of the exception an epoch of ``loader`` raises (at ``iter()`` or ``next()``), None
    when none; the exception itself is not kept (a test frame holding it would hold the DataLoader in a cycle)."""
    try:
        for _ in loader:
            pass
    except Exception as error:
        release_reraise(error)
        return type(error).__name__, said(error)
    return None


def paired(got, want):
    """``zip(got, want)`` after checking both hold the same number of items, and at least one: a comparison through
    ``zip`` alone passes on an empty loader."""
    got, want = list(got), list(want)
    assert len(got) == len(want) > 0, f"{len(got)} items against {len(want)}"
    return zip(got, want)


def in_the_lock_window(action, on_window):
    """Run ``action`` with a profile hook that calls ``on_window(frame)`` right after ``Condition.__enter__`` has
    acquired its lock and before it returns: where a signal arriving then would have its handler run (the window
    where raising leaks the lock: tests/supervise/test_signals.py, test_deaths.py)."""
    fired = []

    def hook(frame, event, arg):
        if event == "c_return" and not fired and frame.f_code.co_name == "__enter__" \
                and frame.f_code.co_filename == threading.__file__:
            fired.append(frame)
            sys.setprofile(None)  # done: an exception raised at the first line of the finally below would skip it
            on_window(frame)

    sys.setprofile(hook)
    try:
        action()
    finally:
        sys.setprofile(None)
    assert fired, "the profile hook never saw Condition.__enter__ acquire its lock"
