"""``procs.drop``: letting go of a DataLoader iterator runs its shutdown at once, and pays for a full garbage
collection only when a reference cycle holds the iterator (NOTE [ Process cleanup ], step 1); a failed run's workers are
terminated only once that shutdown told them to stop (step 2)."""
from __future__ import annotations

import gc
import time
import weakref

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

from autoloader.supervise import procs
from autoloader.supervise.serving import Serving
from autoloader.supervise.signals import SignalGuard
from workloads import LatencyBound


@pytest.fixture
def collections(monkeypatch):
    """Every ``gc.collect()`` call, counted; each still collects."""
    calls = []
    real = gc.collect

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(gc, "collect", counted)
    return calls


def _loader() -> DataLoader:
    return DataLoader(LatencyBound(n=16, latency_s=0.0), batch_size=4)


def test_an_iterator_freed_by_its_last_reference_costs_no_collection_even_if_its_loader_is_kept(collections):
    loader = _loader()
    iterator = iter(loader)
    gone = weakref.ref(iterator)
    references = [iterator, loader]
    del iterator
    procs.drop(references)
    assert gone() is None and references == []
    assert collections == [], "a full collection ran for a loader the caller still holds"


def test_an_iterator_held_by_a_reference_cycle_is_collected(collections):
    iterator = iter(_loader())
    iterator.itself = iterator  # a cycle, as a traceback's frames make
    gone = weakref.ref(iterator)
    references = [iterator]
    del iterator
    procs.drop(references)
    assert collections and gone() is None


@pytest.mark.parametrize("references", [[], [None], [None, object()]], ids=["nothing", "no-iterator", "loader-only"])
def test_nothing_to_free_costs_no_collection(references, collections):
    procs.drop(references)
    assert references == [] and collections == []


class StuckAfter:
    """Samples 0 and 1 at once, then every worker blocks in ``__getitem__`` for a minute (a stuck read)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index >= 2:
            time.sleep(60)
        return index


def test_a_failed_stop_terminates_workers_only_after_their_shutdown_began(monkeypatch):
    # The stress run of 2026-12-04 hung 1 Ctrl-C in 240: the workers were SIGTERMed first, one of them while it held
    # the done event's lock (shared with this process), and the DataLoader's shutdown then blocked in Event.set().
    loader = DataLoader(StuckAfter(), batch_size=1, num_workers=2, multiprocessing_context="fork")
    serving = Serving(loader, guard=SignalGuard(limit_s=None), retire=False)
    assert [serving.next()[0] for _ in range(2)] == [torch.tensor([0]), torch.tensor([1])]
    done = serving._it._workers_done_event  # private, read only to check the order (the iterator is not held)
    workers = serving.processes.current()
    assert len(workers) == 2
    seen = []
    real = procs.terminate

    def terminate(procs_, **kwargs):
        seen.append(done.is_set())
        return real(procs_, **kwargs)

    monkeypatch.setattr(procs, "terminate", terminate)
    began = time.monotonic()
    serving.stop(RuntimeError("the candidate failed"))
    assert time.monotonic() - began < 10
    assert seen and all(seen), f"stuck workers terminated, and only once their shutdown had set the event: {seen}"
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_readings_memory_reads_a_spread_sample_of_a_large_pool_and_scales_its_total(monkeypatch):
    """``WorkerTracker``: memory is read of ``MEMORY_SAMPLE`` workers at most, the first always among them, the same
    ones at every reading (growth is per worker); the total counts every worker running at the sample's mean."""
    monkeypatch.setattr(procs, "MEMORY_SAMPLE", 3)
    loader = DataLoader(LatencyBound(n=64, latency_s=0.0), batch_size=4, num_workers=7, persistent_workers=True)
    it = iter(loader)
    next(it)
    workers = procs.new_children(set())
    try:
        tracker = procs.WorkerTracker(workers)
        first, second = tracker.sample(), tracker.sample()
        assert len(first.uss_by_pid) == 3 and workers[0].pid in first.uss_by_pid, first.uss_by_pid
        assert first.uss_by_pid.keys() == second.uss_by_pid.keys()
        mean = sum(first.uss_by_pid.values()) / 3
        assert abs(first.uss_total - 7 * mean) <= 7, (first.uss_total, mean)
        assert first.mean_uss == sum(first.uss_by_pid.values()) // 3
        assert tracker.sample(memory=False).uss_by_pid == {} and tracker.sample(memory=False).cpu_s >= 0
    finally:
        del it, loader
        procs.reap(workers)
