"""The emulated N-core host of the cores benchmark (tests/cores_data.py): its slots are shared by forked workers, its
virtual CPU clock adds up where the tuner reads it, and a slot held by a process that died is given back."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import psutil
import pytest
from torch.utils.data import DataLoader

from autoloader.measure import cpuclock
from autoloader.supervise import procs
from autoloader.probe import probe_machine
from cores_data import CoresDataset, VirtualHost

FORK = multiprocessing.get_context("fork")


def _work(host: VirtualHost, seconds: float) -> None:
    host.work(seconds)


def _work_then_wait(host: VirtualHost, seconds: float, done, release) -> None:
    host.work(seconds)
    done.set()
    release.wait(30)


def _hold_forever(host: VirtualHost, holding) -> None:
    host.record()
    holding.set()
    host.hold(60)


def _run_all(host: VirtualHost, count: int, seconds: float) -> float:
    started = time.perf_counter()
    workers = [FORK.Process(target=_work, args=(host, seconds)) for _ in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert all(w.exitcode == 0 for w in workers)
    return time.perf_counter() - started


def test_slots_are_shared_by_forked_workers():
    host = VirtualHost(2)
    try:
        # 4 processes of 0.3 s on 2 emulated cores: two waves, never one (a lower bound, safe on a slow machine)
        assert _run_all(host, 4, 0.3) >= 0.58
        claimed = host.table[:host._claimed.value]
        assert len(claimed) == 4 and all(claimed["cpu"] >= 0.3) and claimed["wait"].sum() >= 0.5
    finally:
        host.close()


def test_virtual_cpu_clock_adds_up_where_the_tuner_reads_it():
    host = VirtualHost(16, init_s=0.1)
    try:
        real = probe_machine(disk=False, gpus=False).cpu.usable
        with host.emulate():
            assert probe_machine(disk=False, gpus=False).cpu.usable == 16
            main_before, _ = cpuclock.cpu_and_delay()
            host.work(0.2)  # the main process pays no init
            assert cpuclock.cpu_and_delay()[0] - main_before >= 0.2
            children_before = procs._children_cpu_s()
            done, release = FORK.Event(), FORK.Event()
            worker = FORK.Process(target=_work_then_wait, args=(host, 0.3, done, release))
            worker.start()
            try:
                assert done.wait(30)
                tracker = procs.WorkerTracker([psutil.Process(worker.pid)])
                assert tracker.sample(memory=False).cpu_s >= 0.4  # 0.3 of work + 0.1 of init, read alive
            finally:
                release.set()
                worker.join(30)
            assert procs._children_cpu_s() - children_before >= 0.4  # and once waited for
            assert tracker.sample(memory=False).cpu_s >= 0.4
        assert probe_machine(disk=False, gpus=False).cpu.usable == real
        assert time.process_time() < 0.2 + cpuclock.cpu_and_delay()[0]  # the real clock is back
    finally:
        host.close()


def test_fork_cost_is_paid_by_the_parent_and_counted():
    host = VirtualHost(4, fork_s=0.15)
    try:
        with host.emulate():
            cpu_before = time.process_time()
            took = _run_all(host, 2, 0.0)
            assert took >= 0.3 and time.process_time() - cpu_before >= 0.3
        assert _run_all(host, 2, 0.0) < 0.3 + 5  # outside emulate(): no fork cost (generous: a loaded machine)
    finally:
        host.close()


def test_a_slot_held_by_a_killed_process_is_given_back():
    host = VirtualHost(1)
    holding = FORK.Event()
    holder = FORK.Process(target=_hold_forever, args=(host, holding))
    holder.start()
    try:
        assert holding.wait(30)
        deadline = time.monotonic() + 30
        while not host.table["holding"][:host._claimed.value].any() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
        started = time.perf_counter()
        host.work(0.01)
        assert time.perf_counter() - started < 10
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join(30)
        host.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_over_the_emulated_host(workers):
    host = VirtualHost(4)
    try:
        loader = DataLoader(CoresDataset(host, 16, sample_s=0.001), batch_size=4, num_workers=workers)
        assert [int(b[0, 0]) for b in loader] == [0, 4, 8, 12]
        assert host.table["cpu"][:host._claimed.value].sum() >= 0.016
    finally:
        host.close()
