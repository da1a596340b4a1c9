"""``Run``, the one measured loop (autoloader.measure.run), driven directly over real DataLoaders and real workers:
where each mode stops, which workers it stops (and when), what it measures, and how a failure comes out of it.

Nothing here depends on timing beyond "a step that sleeps 10 ms takes at least 10 ms": the window's end is checked
against its own rule (``Window.complete``), and every trial's limit is far beyond what it needs.
"""
from __future__ import annotations

import gc
import math
import os
import signal
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader

import fault_data as fd
from autoloader.config import LoaderConfig
from autoloader.consumer import Consumer
from autoloader.measure.failures import classify
from autoloader.measure.window import WindowSpec
from autoloader.measure.window_rule import MIN_OPENED
from autoloader.measure.run import END, Run, served
from autoloader.measure.trial import trial_loader

from autoloader.request import Request
from helpers import live_children, wait_no_children
from workloads import LatencyBound

CPU = Consumer(None, torch.device("cpu"))
WORKERS = LoaderConfig(2, 2)
BATCH = 4
FAR = 60.0
"""A limit no run here comes near: its window always ends by its own rule, never by the clock."""
STEP_S = 0.01
"""The simulated training step between batches of a candidate: 50 of them fill the 0.5 s window whatever the speed
of the machine."""


def _pids() -> set:
    return {p.pid for p in live_children()}


def _loader(n: int = 400, *, config: LoaderConfig = WORKERS, dataset=None) -> DataLoader:
    """A plain DataLoader over ``n`` samples (``LatencyBound``: sample ``i`` is ``full(16, i)``), in order."""
    dataset = LatencyBound(n=n, latency_s=0.001) if dataset is None else dataset
    return DataLoader(dataset, batch_size=BATCH, **config.loader_kwargs())


def _ids(batches) -> list:
    return [int(i) for batch in batches for i in batch[:, 0]]


def _drive_candidate(run: Run, *, step_s: float = STEP_S):
    """Drive a candidate's run as the online epoch scheduler does (request, complete/measure, fetch), sleeping
    ``step_s`` per batch until it is measured, then on to the loader's end. Returns (batches, worker pids at each
    batch, the batch count when it was measured)."""
    batches, pids, measured_at = [], [], None
    with run.guarded():
        while True:
            run.request()
            if measured_at is None and run.complete():
                run.measure()
                measured_at = len(batches)
            batch, failure = run.fetch()
            if failure is not None:
                raise failure
            if batch is END:
                run.finish()
                break
            batches.append(batch)
            pids.append(_pids())
            if measured_at is None:
                time.sleep(step_s)
    run.stop()
    return batches, pids, measured_at


def _join_retiring() -> None:
    """Wait for every helper thread retiring a run's workers (``procs.retire``) to finish."""
    for thread in threading.enumerate():
        if thread.name.startswith("autoloader-retire"):
            thread.join(timeout=15)


# -- trial ------------------------------------------------------------------------------------------------------------

def test_a_trial_stops_once_its_window_is_complete_and_stop_reaps_its_workers():
    request = Request.checked(LatencyBound(n=64, latency_s=0.001), BATCH)
    run = Run(trial_loader(request, WORKERS, limit_s=FAR), WORKERS, mode="trial", consumer=CPU, batch_size=BATCH,
              limit_s=FAR)
    batches = list(served(run, until_complete=True))  # the sampler never ends: only the window's rule ends it
    window = run.window
    assert len(batches) == run.record.delivered == len(window.marks) > WORKERS.burst_batches()
    assert window.complete(deadline=math.inf), "stopped before the window was complete"
    marks, window.marks = window.marks, window.marks[:-1]
    assert not window.complete(deadline=math.inf), "went on after the window was complete"
    window.marks = marks
    result = run.result
    assert result is not None and result.ok and result.steady and result.config == WORKERS
    assert result.batches == len(marks) - WORKERS.burst_batches() and result.samples_per_s > 0
    record = run.record
    assert not record.user and record.startup_s is not None and record.startup_s > 0
    # The driver still runs the step on the last batch: the workers are stopped by stop(), not by the loop's end.
    workers = {p.pid for p in window.edges.tracker.procs}
    assert len(workers) == 2 and workers <= _pids()
    run.stop()
    assert _pids() == set(), "stop() returned with a trial's worker still running"
    stop_s = run.record.stop_s
    run.stop()  # idempotent
    assert run.record.stop_s == stop_s


def test_a_trial_without_workers_measures_in_the_main_process():
    request = Request.checked(LatencyBound(n=64, latency_s=0.001), BATCH)
    serial = LoaderConfig(0)
    run = Run(trial_loader(request, serial, limit_s=FAR), serial, mode="trial", consumer=CPU, batch_size=BATCH,
              limit_s=FAR)
    for _ in served(run, until_complete=True):
        assert _pids() == set()
    run.stop()
    assert run.result.ok and run.result.worker_cpu_util is None and run.window.edges.tracker is None


# -- candidate --------------------------------------------------------------------------------------------------------

def test_a_candidate_is_measured_once_then_serves_on_with_the_same_workers_and_nothing_in_the_batches():
    # its window closes when confident or at its bound (the scheduler's rule): 0.3 s, a third of the 100 batches, so
    # a loaded machine's jitter cannot keep it open to the loader's end
    run = Run(_loader(400), WORKERS, mode="candidate", consumer=CPU, batch_size=BATCH, limit_s=FAR,
              window=WindowSpec("candidate", 0.3))
    batches, pids, measured_at = _drive_candidate(run)
    result = run.result
    assert measured_at is not None and result is not None, "the window never completed"
    assert result.ok and result.steady and result.config == WORKERS and result.samples_per_s > 0
    assert run.window.skip <= WORKERS.burst_batches(), "opened at the burst's end at the latest (or once drained)"
    assert result.batches == measured_at - run.window.skip, "the window counts the batches before measure()"
    assert all(isinstance(b, torch.Tensor) for b in batches), "only the loader's batches are handed out"
    assert _ids(batches) == list(range(400)), "every sample once, in order"
    assert run.record.delivered == 100 and not run.measuring
    assert len(pids[0]) == 2 and all(p == pids[0] for p in pids), "the workers changed: the candidate restarted"
    rate, stall = run.rate_and_stall
    assert rate is not None and rate > 0 and 0.0 <= stall <= 1.0
    assert wait_no_children() == []


def test_a_candidate_is_patient_with_a_slow_step():
    """The step takes longer than the candidate's soft limit: the window still holds its batches (a trial would have
    been cut at its limit)."""
    run = Run(_loader(200), WORKERS, mode="candidate", consumer=CPU, batch_size=BATCH, limit_s=0.05)
    _, _, measured_at = _drive_candidate(run, step_s=0.02)
    assert measured_at is not None and run.result.ok and run.result.batches >= MIN_OPENED, \
        "measured on the batches after its window opened, not cut at the limit"
    assert wait_no_children() == []


# -- serve ------------------------------------------------------------------------------------------------------------

def test_serving_a_loader_it_does_not_own_leaves_persistent_workers_alive():
    config = LoaderConfig(2, 2, persistent_workers=True)
    loader = _loader(64, config=config)
    pids = []
    for _epoch in range(2):
        run = Run(loader, config, mode="serve", consumer=CPU, batch_size=BATCH, owned=False)
        batches = list(served(run, until_complete=False))
        assert _ids(batches) == list(range(64)) and run.result is None
        rate, stall = run.rate_and_stall
        assert rate is not None and rate > 0 and stall is not None and 0.0 <= stall <= 1.0
        assert run.window.marks == [], "serving measures no window"
        pids.append(_pids())
        del run, batches
    assert len(pids[0]) == 2 and pids[0] == pids[1], "the persistent workers were stopped or restarted"
    _join_retiring()  # had a run started to retire them (it must not), let it finish
    assert _pids() == pids[0], "a run stopped the workers of a loader it does not own"
    del loader  # the DataLoader's own iterator shuts its workers down, as after a plain loop
    gc.collect()
    assert wait_no_children() == []


def test_serving_too_few_batches_has_no_rate():
    run = Run(_loader(16), WORKERS, mode="serve", consumer=CPU, batch_size=BATCH, owned=True)
    assert len(list(served(run, until_complete=False))) == 4
    assert run.rate_and_stall == (None, None)
    assert wait_no_children() == []


# -- failures ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["trial", "candidate"])
@pytest.mark.parametrize("config", [LoaderConfig(0), WORKERS], ids=["serial", "workers"])
def test_the_datasets_error_surfaces_unchanged_and_the_workers_are_stopped_at_once(mode, config):
    dataset = fd.Raising("always", n=64)
    loader = trial_loader(Request.checked(dataset, BATCH), config, limit_s=FAR) if mode == "trial" else \
        _loader(config=config, dataset=dataset)
    run = Run(loader, config, mode=mode, consumer=CPU, batch_size=BATCH, limit_s=FAR)
    del loader
    with pytest.raises(fd.CorruptSample, match="sample 3 is corrupt") as info:
        list(served(run, until_complete=mode == "trial")) if mode == "trial" else _drive_candidate(run)
    assert run.record.user, "the error came from the user's dataset"
    run.stop(info.value)
    assert _pids() == set(), "a failed run's workers outlived it"
    with pytest.raises(fd.CorruptSample) as again:
        classify(info.value, config, user=run.record.user, threads_tuned=False)
    assert again.value is info.value, "the user's error is re-raised as it is"


def test_a_worker_killed_during_a_candidate_fails_it_and_is_never_raised_in_the_step():
    run = Run(_loader(100_000), WORKERS, mode="candidate", consumer=CPU, batch_size=BATCH, limit_s=FAR)
    in_step, error = [], None
    try:
        for i, _ in enumerate(_driven(run)):
            assert run.result is None, "the worker's death was never noticed"
            if i == 2:
                victim = sorted(_pids())[0]
                os.kill(victim, signal.SIGKILL)
                try:
                    time.sleep(0.5)  # the user's step: a worker's death must not be raised here
                except BaseException as exc:  # noqa: B036 - recorded: the assertion below names it
                    in_step.append(exc)
    except Exception as exc:  # noqa: BLE001 - classified below
        error = exc
    assert in_step == [], f"raised inside the user's step: {in_step!r}"
    assert error is not None, "the run ended normally after one of its workers was killed"
    run.stop(error)
    result = classify(error, WORKERS, user=run.record.user, threads_tuned=False, startup_s=run.record.startup_s)
    assert result.status == "failed" and "worker" in result.reason, result
    assert result.config == WORKERS and result.startup_s == run.record.startup_s
    assert _pids() == set(), "a failed candidate's workers are stopped at once, not in a helper thread"


class _DiesOnceFlagged(torch.utils.data.Dataset):
    """Each sample takes 0.2 s; once ``flag`` exists, worker 1 SIGKILLs itself at the end of the sample it is on and
    worker 0 takes 2.5 s more: the shutdown joins worker 0 first, so worker 1 stays unreaped and watched meanwhile."""

    def __init__(self, flag) -> None:
        self.flag = str(flag)

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.2)
        if os.path.exists(self.flag):
            if torch.utils.data.get_worker_info().id == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(2.5)
        return torch.full((16,), i)


def test_a_worker_dying_while_its_candidate_retires_raises_nowhere(tmp_path):
    """A candidate stopped in order is shut down in a helper thread; torch's SIGCHLD handler raises "DataLoader
    worker (pid X) is killed" in the main thread, wherever it is, for any worker it still watches. A worker that dies
    then must not raise in what runs next, outside any guard (the next stage's setup, the user's loop): it did in 1
    stress run of 90, and a raise inside a lock hangs (NOTE [ Process cleanup ], step 4)."""
    flag = tmp_path / "die"
    run = Run(DataLoader(_DiesOnceFlagged(flag), batch_size=1, **WORKERS.loader_kwargs()), WORKERS,
              mode="candidate", consumer=CPU, batch_size=1, limit_s=FAR)
    with run.guarded():
        for _ in range(2):
            run.request()
            batch, failure = run.fetch()
            assert failure is None and batch is not END
    flag.touch()
    run.stop()
    raised = None
    try:
        time.sleep(1.5)  # the user's loop: the workers finish their sample and die meanwhile
    except RuntimeError as exc:
        raised = exc
    _join_retiring()
    assert raised is None, f"a retired candidate's worker death was raised outside autoloader: {raised}"
    assert wait_no_children() == []


def _driven(run: Run):
    """A candidate's batches, one by one, as the scheduler hands them out (the step runs in the caller's loop)."""
    with run.guarded():
        while True:
            run.request()
            if run.result is None and run.complete():
                run.measure()
            batch, failure = run.fetch()
            if failure is not None:
                raise failure
            if batch is END:
                return
            yield batch
