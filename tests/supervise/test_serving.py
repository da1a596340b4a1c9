"""``Serving`` (autoloader.supervise.serving): one DataLoader's batches served one ``next()`` at a time, the error
that came instead returned (never raised), one stop however often it is asked for, the workers reaped in a helper
thread or at once, and the AttributeError of a half-built iterator's ``__del__`` kept off stderr. A failed run's stop
order is in test_procs.py."""
from __future__ import annotations

import logging
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader

from autoloader.supervise import serving as serving_module
from autoloader.supervise.serving import END, Record, Serving, WorkerProcesses, quiet_half_built_iterators
from autoloader.supervise.signals import SignalGuard
from helpers import wait_no_children

TESTS = pathlib.Path(__file__).resolve().parents[1]


class Numbers:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return index


class Broken:
    """A loader whose iterator cannot be made (``iter()`` raises)."""

    def __iter__(self):
        raise OSError("too many open files")


def _serving(loader, **kwargs) -> Serving:
    return Serving(loader, guard=SignalGuard(limit_s=None), **kwargs)


def _settled(serving: Serving, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not serving.settled() and time.monotonic() < deadline:
        time.sleep(0.02)
    return serving.settled()


def test_record_switch_s_adds_what_the_loop_waited_for():
    record = Record(start_s=0.5, first_wait_s=0.25, stop_s=1.0, elapsed=9.0)
    assert record.switch_s == 1.75


def test_serving_without_workers_hands_out_every_batch_then_end():
    serving = _serving(DataLoader(Numbers(), batch_size=3))
    served = [serving.next() for _ in range(4)]
    assert [batch.tolist() for batch, _ in served[:3]] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert served[3] == (END, None) and all(error is None for _, error in served)
    assert serving.record.user is False
    serving.stop()
    assert serving.stopped and _settled(serving) and serving.record.elapsed > 0


def test_an_iterator_that_cannot_be_made_is_returned_as_the_users_error():
    serving = _serving(Broken())
    serving.start()
    assert serving.record.start_s >= 0
    batch, error = serving.next()
    assert batch is END and isinstance(error, OSError) and serving.record.user is True
    assert serving.next()[1] is error, "the same failure, each time it is asked"
    serving.stop(error)
    assert serving.stopped


def test_a_stop_happens_once_and_a_release_keeps_the_workers_loader():
    serving = _serving(DataLoader(Numbers(), batch_size=4), owned=False)
    assert serving.next()[1] is None
    serving.stop()
    first = serving.processes.stopped_at
    serving.stop()
    assert serving.processes.stopped_at == first
    kept = _serving(DataLoader(Numbers(), batch_size=4))
    kept.next()
    kept.release()
    assert kept.stopped and kept.loader is not None, "released: its DataLoader keeps its workers for a later epoch"


@pytest.mark.parametrize("retire", [True, False])
def test_workers_are_stopped_and_reaped_in_a_helper_thread_or_at_once(retire):
    loader = DataLoader(Numbers(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    calls = []
    serving = _serving(loader, retire=retire, before_stop=lambda: calls.append("before_stop"))
    assert torch.equal(serving.next()[0], torch.tensor([0, 1]))
    serving.keep_workers()
    assert len(serving.processes.current()) == 2
    serving.stop()
    assert (serving.processes.retiring is not None) == retire
    assert calls == ([] if retire else ["before_stop"]), "a trial's queued device work first, before an at-once stop"
    assert _settled(serving)
    assert wait_no_children() == []


def test_a_loader_without_workers_stops_at_once_without_a_helper_thread_or_a_collection(monkeypatch):
    """An online probe's stop: nothing to shut down, so no helper thread (starting one beside 16 workers just forked
    cost the loop 85 ms) and no ``gc.collect()`` (0.1-0.3 s holding the GIL)."""
    collected = []
    monkeypatch.setattr(serving_module._procs.gc, "collect", lambda *a: collected.append(a) or 0)
    serving = _serving(DataLoader(Numbers(), batch_size=2), retire=True)
    assert torch.equal(serving.next()[0], torch.tensor([0, 1]))
    serving.stop()
    assert serving.stopped and serving.processes.retiring is None and serving.loader is None
    assert collected == [] and serving.settled()


def test_worker_processes_are_not_settled_before_a_stop(monkeypatch):
    processes = WorkerProcesses()
    assert not processes.settled() and processes.current() == []
    processes.stopped_at = time.perf_counter()
    assert processes.settled(), "no helper thread: settled at the stop"
    monkeypatch.setattr(serving_module, "SETTLE_S", 0.0)

    class Stuck:
        def is_alive(self):
            return True

    processes.retiring = Stuck()
    assert processes.settled(), "a helper still reaping past SETTLE_S no longer holds the next window"


class _HalfBuiltDataLoaderIter:
    def __del__(self):
        raise AttributeError("'_HalfBuiltDataLoaderIter' object has no attribute '_shutdown'")


class _Other:
    def __del__(self):
        raise AttributeError("not an iterator's")


def test_a_half_built_iterators_del_error_is_logged_not_printed(caplog):
    seen = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with caplog.at_level(logging.DEBUG, logger="autoloader.trial"), quiet_half_built_iterators():
            _HalfBuiltDataLoaderIter()
            _Other()
        assert sys.unraisablehook == seen.append, "the hook before it is back"
    finally:
        sys.unraisablehook = previous
    assert [str(u.exc_value) for u in seen] == ["not an iterator's"]
    assert "half-built DataLoader iterator" in caplog.text


@pytest.mark.parametrize("error", [None, GeneratorExit()])
def test_at_interpreter_exit_a_stop_only_drops_its_references_and_starts_no_thread(monkeypatch, error):
    """NOTE [ Process cleanup ], 5.: a thread started while the interpreter finalizes never runs, and
    ``Thread.start`` waits for it forever; multiprocessing's exit handler ended the workers already."""
    loader = DataLoader(Numbers(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    serving = _serving(loader, retire=True)
    assert torch.equal(serving.next()[0], torch.tensor([0, 1]))
    started = []
    monkeypatch.setattr(serving, "_exiting", lambda: True)  # procs.exiting, as the run bound it
    monkeypatch.setattr(serving_module.threading.Thread, "start", lambda self: started.append(self.name))
    serving.stop(error)
    assert serving.stopped and serving.loader is None and serving.processes.retiring is None
    assert started == []
    monkeypatch.undo()
    del loader
    assert wait_no_children() == [], "dropped, the iterator shut its workers down (the interpreter goes on here)"


def test_a_script_that_leaves_an_online_epoch_after_a_switch_exits_at_once(tmp_path):
    """It hung at exit: the epoch left while a global still held its iterator (``it = iter(loader)`` in a script) is
    finalized with the modules, and it stopped its candidate by starting a thread."""
    script = tmp_path / "leave.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from workloads import LatencyBound
        from autoloader import make_loader
        loader = make_loader(LatencyBound(n=20000, latency_s=0.004), 16, tuning="online", cache=False, device="cpu")
        batches = iter(loader)  # kept: the epoch is finalized with the modules, at exit
        for i, batch in enumerate(batches):
            if i == 100:
                break
        print("left at", i)
    """))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-W", "ignore", str(script)], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and "left at 100" in done.stdout, done.stderr[-2000:]
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 45, "it exits as soon as the loop left (about 3 s here)"


def test_a_start_records_the_workers_it_forked_not_those_it_adopted():
    """What ``Plan.fork_s`` is measured from: a pool of persistent workers reused (a decision's, measured again)
    costs no fork."""
    loader = DataLoader(Numbers(), batch_size=2, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    first = _serving(loader, owned=False)
    assert torch.equal(first.next()[0], torch.tensor([0, 1])) and first.record.forked == 2
    workers = first.processes.current()
    first.release()
    again = _serving(loader, owned=False)
    again.adopt(workers)
    assert torch.equal(again.next()[0], torch.tensor([0, 1])) and again.record.forked == 0
    again.stop()
    serial = _serving(DataLoader(Numbers(), batch_size=2))
    serial.start()
    assert serial.record.forked == 0
    serial.stop()
    del loader, first, again
    assert wait_no_children() == []
