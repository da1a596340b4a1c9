"""The online epoch scheduler (NOTE [ Online epoch scheduler ] in tuning/phases.py) driven with fake runs and a
scripted search: which stage serves each batch, the phases each one goes through, what the search is told, and that
the loop gets every batch of the epoch once, in order, whatever happens. No process, no clock: each fake run says
when its window is complete and what it measured."""
from __future__ import annotations

import os
import signal
import time

import pytest

from autoloader.supervise.torch_watch import install_first
from torch.utils.data import DataLoader

from autoloader.coordination import Coordinator
from autoloader.loader.slices import EpochSlicer
from autoloader.results import EpochTrace, TrialResult
from autoloader.search.switching import MAX_WINDOW_BOUND_S, WINDOW_SHARE
from autoloader.tuning import scheduler as scheduler_module
from autoloader.tuning.scheduler import EpochScheduler
from autoloader.tuning.handover import SERIAL_TAIL
from scheduler_fakes import FakeServing, BATCHES, Agreeing, ScriptedPlan, Step, config_of, serve


# -- the table ---------------------------------------------------------------------------------------------------------

SCENARIOS = {
    # name: (steps, decision, the moves made, (workers, delivered) per stage, what the search was told). A candidate
    # measured after 6 batches is decided on as the loop asks for a 7th, before it is loaded (one process), then serves
    # its tail, that 7th first: 2 batches without workers (``SERIAL_TAIL``), else what it holds in flight (workers x
    # prefetch 2). Ranks fetch the 7th first and agree on it (test_ranks_...).
    "measured, kept": (
        [Step(0, 100.0), Step(2, 300.0)], 2,
        [("measuring", "switch"), ("tail", "tail-served"), ("measuring", "keep"), ("serving", "ended")],
        [(0, 8), (2, 32)], [(0, "ok"), (2, "ok")]),
    "measured, then another decision": (
        [Step(0, 100.0), Step(2, 300.0), Step(4, 290.0)], 2,
        [("measuring", "switch"), ("tail", "tail-served"), ("measuring", "switch"), ("tail", "tail-served"),
         ("measuring", "switch"), ("tail", "tail-served"), ("serving", "ended")],
        [(0, 8), (2, 10), (4, 14), (2, 8)], [(0, "ok"), (2, "ok"), (4, "ok")]),
    "a candidate's workers die": (
        [Step(0, 100.0), Step(2, 300.0, fail_at=3), Step(1, 200.0)], 1,
        [("measuring", "switch"), ("tail", "tail-served"), ("measuring", "failed"), ("measuring", "keep"),
         ("serving", "ended")],
        [(0, 8), (2, 3), (1, 29)], [(0, "ok"), (2, "failed"), (1, "ok")]),
    "the epoch ends before the window opens": (
        [Step(0, 100.0, measure_after=None)], 0,
        [("measuring", "ended")], [(0, 40)], []),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_scenario_serves_every_batch_once_with_the_moves_of_the_table(name, monkeypatch):
    steps, decide, moves, stages, told = SCENARIOS[name]
    plan = ScriptedPlan(steps, decide)
    served = serve(plan, monkeypatch=monkeypatch)
    assert served["error"] is None
    assert served["got"] == list(range(2 * BATCHES)), "every batch once, in the plain DataLoader's order"
    assert served["moves"] == moves
    assert [(r.config.num_workers, r.record.delivered) for r in served["runs"]] == stages
    assert plan.told == told
    assert all(r.stopped is not None for r in served["runs"]), "a run was left running"
    assert served["source"].done


@pytest.mark.parametrize("workers", [2, 0])
@pytest.mark.parametrize("ranks", [False, True])
def test_a_measured_candidate_serves_what_it_holds_in_flight_while_the_next_one_starts(workers, ranks, monkeypatch):
    """NOTE [ Hidden switch ]: the 2-worker candidate holds 4 batches when its window closes (the serial one loads
    ``SERIAL_TAIL``): it serves them (its tail) and the next candidate's first batch is the one right after them. One
    process decides as the loop asks for the 7th batch, which is the tail's first; ranks fetch it first and agree on
    it (NOTE [ Online epoch scheduler ])."""
    plan = ScriptedPlan([Step(workers, 300.0), Step(1, 200.0)], 1)
    served = serve(plan, coordinator=Agreeing() if ranks else None, monkeypatch=monkeypatch)
    first, second = served["runs"]
    assert first.record.delivered == 6 + (1 if ranks else 0) + (config_of(workers).in_flight() or SERIAL_TAIL)
    assert served["got"] == list(range(2 * BATCHES))
    assert second.record.delivered == BATCHES - first.record.delivered


def test_ranks_whose_tails_differ_switch_without_one_and_the_batch_fetched_is_reissued(monkeypatch):
    plan = ScriptedPlan([Step(2, 300.0), Step(1, 200.0)], 1)
    served = serve(plan, coordinator=Agreeing(same_tail=False), monkeypatch=monkeypatch)
    assert served["moves"][:1] == [("measuring", "plain-switch")]
    first, _ = served["runs"]
    assert first.record.delivered == 6, "the batch fetched with the decision is not handed out"
    assert len(served["got"]) == 2 * BATCHES, sorted(set(range(2 * BATCHES)) - set(served["got"]))
    assert first.stopped == "orderly"
    assert served["got"] == list(range(2 * BATCHES)), "its in-flight batches went to the next candidate"


def test_a_candidate_over_the_memory_budget_at_its_first_batch_stops_without_a_tail(monkeypatch):
    """NOTE [ Memory budget ]: a candidate whose workers measured over the budget at their first batch is "skipped"
    and stopped at once (a tail would keep its workers beside the next candidate's): its in-flight batches go on."""
    plan = ScriptedPlan([Step(8, 900.0, measure_after=1, over_budget=True), Step(2, 300.0)], 2)
    served = serve(plan, monkeypatch=monkeypatch)
    assert served["moves"][0] == ("measuring", "plain-switch")
    assert plan.told[0] == (8, "skipped")
    big = served["runs"][0]
    assert big.record.delivered == 1 and big.stopped == "orderly"
    assert served["got"] == list(range(2 * BATCHES)), "every batch once, in order"


def test_a_next_candidate_that_would_pass_the_memory_budget_beside_the_tail_starts_after_it_stops(monkeypatch):
    """NOTE [ Hidden switch ]: both pools at once would pass the memory budget (``Plan.fits_beside``), so the measured
    candidate stops first, its batches in flight re-issued to the next one, as when the ranks' tails differ."""
    plan = ScriptedPlan([Step(8, 900.0), Step(12, 1300.0, too_big_beside=True)], 12)
    served = serve(plan, monkeypatch=monkeypatch)
    assert served["moves"][0] == ("measuring", "plain-switch")
    first = served["runs"][0]
    assert first.record.delivered == 6 and first.stopped == "orderly", "no tail served beside the next pool"
    assert served["got"] == list(range(2 * BATCHES)), "every batch once, in order"


def test_whether_a_switch_repays_counts_the_fork_cost_the_search_measured(monkeypatch):
    """``switching.repays`` is asked with the plan's ``fork_s`` (the largest pool's start, as measured), not the
    constant, over the rest of the epoch and then over a whole one; said no to both, the candidate goes first next
    epoch (the plan does not settle: ``ScriptedPlan.settle``)."""
    plan = ScriptedPlan([Step(0, 100.0), Step(2, 300.0)], 2)
    plan.fork_s = 0.07
    asked = []
    monkeypatch.setattr(scheduler_module, "repays_next_epoch", lambda **kw: asked.append(kw) and False)
    served = serve(plan, monkeypatch=monkeypatch, repays=lambda **kw: asked.append(kw) and False)
    assert [kw["fork_s"] for kw in asked] == [0.07, 0.07] and [kw["workers"] for kw in asked] == [2, 2]
    assert "remaining_s" in asked[0] and "epoch_s" in asked[1], "the rest of the epoch, then a whole one"
    assert ("measuring", "defer") in served["moves"] and plan.carried == 0


def test_a_switch_that_would_not_repay_over_a_whole_epoch_either_settles_on_the_run_in_force(monkeypatch):
    """Said no over the rest of the epoch and over a whole one (``switching.repays``, ``repays_next_epoch``), the
    search settles on the run in force when that is its choice (``Plan.settle``): it serves on, decided."""
    monkeypatch.setattr(scheduler_module, "repays_next_epoch", lambda **kw: False)
    settling = ScriptedPlan([Step(0, 100.0), Step(2, 300.0)], 2)
    settled = []
    settling.settle = lambda result, *, epoch: settled.append(result.config.num_workers) or True
    served = serve(settling, monkeypatch=monkeypatch, repays=lambda **kw: False)
    assert settled == [0] and ("measuring", "keep") in served["moves"] and ("measuring", "defer") not in \
        served["moves"], served["moves"]


def test_an_epoch_that_ends_before_the_window_opens_asks_the_search_to_carry_the_candidate(monkeypatch):
    plan = ScriptedPlan([Step(3, 100.0, measure_after=None)], 0)
    serve(plan, monkeypatch=monkeypatch)
    assert plan.carried == 1 and plan.told == [], "carried to the next epoch, not told a partial measurement"


@pytest.mark.parametrize("carried", [True, False])
def test_a_candidate_carried_to_the_next_epoch_keeps_its_persistent_workers(carried, monkeypatch):
    """NOTE [ Online switching ]: a candidate whose window had not opened by the epoch's end goes on next epoch on the
    same workers (not forked again), as the decision's do; one that is not carried (its attempts spent) is stopped."""
    monkeypatch.setattr(FakeServing, "persistent", True)
    plan = ScriptedPlan([Step(3, 100.0, measure_after=None)], 0)
    monkeypatch.setattr(plan, "retry_next_epoch", lambda: carried)
    served = serve(plan, monkeypatch=monkeypatch)
    run = served["runs"][0]
    assert (served["kept"] is not None) == carried and run.serving.released == carried
    assert (run.stopped is None) == carried, "kept running for the next epoch, else stopped"


def test_a_measuring_window_is_told_at_the_batch_upon_which_its_slice_was_drawn_out(monkeypatch):
    """NOTE [ Trial timing ], 6.: the fake run holds ``in_flight() + 1`` batches ahead (2 workers: 5), so its slice
    of the 40-batch epoch is drawn out as it hands out batch 35 (the fake window marks every request, the first one's
    too: 36 marks then)."""
    plan = ScriptedPlan([Step(2, 100.0, measure_after=1000)], 2)
    served = serve(plan, monkeypatch=monkeypatch)
    assert served["runs"][0].window.drawn_at == BATCHES - 5 + 1


def test_the_configuration_in_force_fails_as_a_dataloader_does(monkeypatch):
    """A failure once the search kept the configuration (measured no more) reaches the loop: the serving row."""
    plan = ScriptedPlan([Step(2, 300.0, fail_at=20)], 2)
    served = serve(plan, monkeypatch=monkeypatch)
    assert isinstance(served["error"], RuntimeError) and "killed by signal" in str(served["error"])
    assert served["moves"] == [("measuring", "keep")]
    assert served["got"] == list(range(2 * 20)), "the batches before the failure, in order"
    assert served["runs"][0].stopped == "failed"


# -- signals between two stages ----------------------------------------------------------------------------------------

@pytest.fixture
def raising_signals():
    """SIGCHLD raising as torch's handler does when a worker it watches has died, SIGINT as an interactive process
    has it (whatever this run inherited), both restored after."""
    install_first()

    def worker_died(signum, frame):
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    previous = {signal.SIGCHLD: signal.signal(signal.SIGCHLD, worker_died),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _after_the_first_stage(plan, signum):
    """Send ``signum`` to this process as the first stage ends, after its guard exited: the next candidate's workers
    (a hidden switch started them during the first one's tail) already run and no run's guard is active."""
    ended = []

    def after_stage(serving_s):
        ended.append(serving_s)
        if len(ended) == 1:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)  # the handler runs here, or at the next line
    plan.after_stage = after_stage


def test_a_worker_dying_between_two_stages_fails_the_started_candidate_not_the_loop(raising_signals, monkeypatch):
    """It reached torch's handler unwrapped, raised in the scheduler, in 1 of 40 online stress runs (once inside a
    lock: a hang). The epoch's guard holds it and the started stage's guard raises it as that candidate's failure."""
    plan = ScriptedPlan([Step(0, 100.0), Step(2, 300.0), Step(1, 200.0)], 1)
    _after_the_first_stage(plan, signal.SIGCHLD)
    served = serve(plan, monkeypatch=monkeypatch, guarded=True)
    assert served["error"] is None, f"a worker's death reached the loop: {served['error']!r}"
    assert plan.told == [(0, "ok"), (2, "failed"), (1, "ok")]
    assert served["got"] == list(range(2 * BATCHES)), "its batches went to the next candidate"
    assert all(r.stopped is not None for r in served["runs"])


def test_a_ctrl_c_between_two_stages_stops_the_one_a_switch_started(raising_signals, monkeypatch):
    plan = ScriptedPlan([Step(0, 100.0), Step(2, 300.0)], 2)
    _after_the_first_stage(plan, signal.SIGINT)
    served = serve(plan, monkeypatch=monkeypatch, guarded=True)
    assert isinstance(served["error"], KeyboardInterrupt)
    first, started = served["runs"]
    assert first.stopped == "orderly" and started.stopped == "failed", "the started stage was left running"


def test_a_window_bound_before_two_batches_is_a_share_of_the_epoch_at_the_pace_of_the_workers_to_come():
    """After a probe of one slow batch (70 ms, of 250), the first candidate's window had the longest bound (4 s) and
    measured 9 workers for 2 s of a 4 s epoch: at 9 workers' pace the epoch lasts about 2 s, a share of which bounds
    it. With no batch served, the bound stays the longest."""
    source = EpochSlicer(DataLoader(list(range(500)), batch_size=2)).epoch()
    trace = EpochTrace(0, 0.0)
    scheduler = EpochScheduler(source, plan=ScriptedPlan([], 0), build=lambda *_: None, coordinator=Coordinator(),
                               trace=trace)
    assert scheduler._bound_s(9) == MAX_WINDOW_BOUND_S
    trace.batches.append((0.07, 2))
    epoch = source.remaining + 1  # the one served, and those to come
    assert abs(scheduler._bound_s(9) - max(0.25, WINDOW_SHARE * 0.07 / 9 * epoch)) < 1e-9
    assert abs(scheduler._bound_s(0) - WINDOW_SHARE * 0.07 * epoch) < 1e-9, "serial: the batch's own pace"


def test_a_runs_start_is_recorded_before_the_switch_it_decides_is_weighed(monkeypatch):
    """``Plan.record_start`` comes as the window completes, before ``Plan.fork_s`` prices the switch (``repays``):
    recorded only as the stage ended, the first pool's start (234 ms a worker on 2 CPUs, drawn seed 13) was unknown
    when the switch away from it was weighed, which took it at ``FORK_S`` and paid a second start in a 1.5 s epoch."""

    class Watching(ScriptedPlan):
        def tell(self, outcome: TrialResult, *, epoch: int) -> None:
            self.known_at_tell.append(list(self.starts))
            super().tell(outcome, epoch=epoch)

    plan = Watching([Step(2, 300.0), Step(1, 200.0)], 1)
    plan.known_at_tell = []
    served = serve(plan, monkeypatch=monkeypatch)
    assert served["error"] is None
    first = served["runs"][0]
    assert first.record.forked == 2
    assert plan.known_at_tell[0] == [(2, pytest.approx(first.record.start_s + first.record.first_wait_s))]
