"""The online epoch scheduler's contract (NOTE [ Online epoch scheduler ]), over drawn searches: whatever candidates
the search names, whatever each measures, wherever one's workers die, whether or not the ranks' tails match, the loop
gets every batch of the epoch once, in the plain DataLoader's order (or, when the configuration the search kept
fails, the batches before the failure and the failure, as from a DataLoader); every run is stopped; the search is
told about its candidates in the order it named them, a failure only for one that failed; each move is a row of the
table."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoloader.tuning.phases import TRANSITIONS
from scheduler_fakes import BATCHES, Agreeing, ScriptedPlan, Step, serve

steps = st.lists(st.builds(Step, workers=st.integers(0, 4), rate=st.floats(1.0, 1000.0),
                           measure_after=st.one_of(st.none(), st.integers(1, 12)),
                           fail_at=st.one_of(st.none(), st.integers(0, 14))), min_size=1, max_size=5).map(
    lambda script: [s if s.workers else Step(0, s.rate, s.measure_after) for s in script])  # no worker, no death


@given(script=steps, decide=st.integers(0, 4), ranks=st.sampled_from(["one process", "same tails", "tails differ"]))
def test_every_batch_once_in_order_whatever_the_search_does(script, decide, ranks):
    import pytest

    plan = ScriptedPlan(script, decide)
    coordinator = None if ranks == "one process" else Agreeing(same_tail=ranks == "same tails")
    with pytest.MonkeyPatch.context() as monkeypatch:
        served = serve(plan, coordinator=coordinator, monkeypatch=monkeypatch)
    everything = list(range(2 * BATCHES))
    if served["error"] is None:
        assert served["got"] == everything
    else:
        assert served["moves"][-1] == ("measuring", "keep") or served["moves"][-1][0] == "serving", served["moves"]
        assert served["got"] == everything[:len(served["got"])], "the batches before the failure, in order"
    assert all(run.stopped is not None for run in served["runs"])
    assert all(move in TRANSITIONS for move in served["moves"])
    assert [workers for workers, _ in plan.told] == [s.workers for s in script[:len(plan.told)]]
    assert all(s.fail_at is not None for s, (_, status) in zip(script, plan.told) if status == "failed")
