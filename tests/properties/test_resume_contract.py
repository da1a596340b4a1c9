"""Contract (a), README "Checkpoint and resume": a state saved at any point of any configuration, loaded into a new
loader of any other configuration or tuning mode (in another RNG state), yields exactly the batches the uninterrupted
run yields after the save, and the loop's RNG draws match; or a ValueError/TypeError is raised before the first batch,
only where the README says so. With or without reading ahead (a side stream's path, forced on the CPU), in every run. Hypothesis draws the whole configuration (tests/contracts.py); every counterexample it
found is an explicit test in test_counterexamples.py."""
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import autoloader.loader.prefetch as _prefetch

from contracts import Record, agree, build, closed, compare, datas, modes, run, seed_all
from helpers import round_trip, wait_no_children

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning", "ignore::UserWarning")


def refused(data, state) -> bool:
    """Where the README says a resume is refused with a ValueError: a sampler whose RNG autoloader cannot see."""
    return data.private


def check_resume(data, saver, resumer, *, epoch, k, how, chain, j=0):
    seed_all(data.seed)
    reference = build(data, saver)
    whole, _ = run(reference, epoch + 2)
    closed(reference)
    length = len(whole.indices[epoch])
    k = min(k, length)
    seed_all(data.seed)
    saving = build(data, saver)
    before, state = run(saving, epoch + 1, stop=(epoch, k))
    closed(saving)
    parts = agree(data, saver, resumer)
    compare(before, whole, agree(data, saver, saver), "the saver's own part", prefix=True)
    after_end = k == length and not data.stream
    want = whole.since(epoch + 1, 0) if after_end else whole.since(epoch, k)
    seed_all(data.seed + 7919)  # another process: another RNG state
    resumed = build(data, resumer)
    got, passes, merge = Record(), len(want.indices), True
    at_end = k == length  # the last state saved came after the pass's last batch
    try:
        resumed.load_state_dict(round_trip(state, how))
        if chain == "after-load":
            again = round_trip(resumed.state_dict(), how)
            assert again == round_trip(state, how), "state_dict() right after a load is the loaded state"
            closed(resumed)
            resumed = build(data, resumer)
            resumed.load_state_dict(again)
        if chain == "chained" and want.indices and want.indices[0]:
            j = min(j, len(want.indices[0]))
            got, mid = run(resumed, 1, stop=(0, j))
            closed(resumed)
            resumed = build(data, resumer)
            resumed.load_state_dict(round_trip(mid, how))
            at_end = j == len(want.indices[0])
            if at_end and not data.stream:  # after the pass's last batch: next comes the next epoch
                passes, merge = passes - 1, False
        rest, _ = run(resumed, passes)
    except (ValueError, TypeError) as err:
        assert refused(data, state), f"refused although the README says it resumes: {err!r}"
        assert not got.indices, "refused after a batch was yielded"
        assert "load_state_dict(state)" in str(err)
        return
    finally:
        closed(resumed)
    if not got.indices:
        got = rest
    else:
        for name in ("indices", "values", "draws"):
            mine, theirs = getattr(got, name), getattr(rest, name)
            if merge and theirs:
                mine[-1].extend(theirs[0])
                theirs = theirs[1:]
            mine.extend(theirs)
    if data.stream:  # the stream's own state says whether a pass after its end is empty or starts over
        if at_end:  # it may have started over: a new epoch, whose base seed the resumer cannot know to draw
            parts = {**parts, "draws": False, "values": False}
        want, got = want.flat(), got.flat()
        got = Record([got.indices[0][:len(want.indices[0])]], [got.values[0][:len(want.indices[0])]],
                     [got.draws[0][:len(want.indices[0])]])
    compare(got, want, parts, f"{data} saved by {saver} at epoch {epoch} batch {k}, resumed by {resumer} ({chain}, "
                              f"j={j})")


@given(st.data())
def test_resume_is_exact_or_refused_before_the_first_batch(draw):
    data = draw.draw(datas(), label="data")
    saver = draw.draw(modes(data=data), label="saver")
    resumer = draw.draw(modes(data=data), label="resumer")
    ahead = draw.draw(st.booleans(), label="ahead")
    with mock.patch.object(_prefetch, "reads_ahead", lambda stream: True) if ahead else contextlib.nullcontext():
        check_resume(data, saver, resumer, epoch=draw.draw(st.integers(0, 1), label="epoch"),
                     k=draw.draw(st.integers(0, 60), label="k"), how=draw.draw(st.sampled_from(["torch", "json"])),
                     chain=draw.draw(st.sampled_from(["once", "once", "after-load", "chained"]), label="chain"),
                     j=draw.draw(st.integers(0, 8), label="j"))
    assert wait_no_children() == []
