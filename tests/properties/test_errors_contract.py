"""Contract (d), README "Use it": a batch whose loading raises is raised at the loop's ``next()``, with the type a plain
DataLoader raises, and the epoch goes on: whatever the configuration (workers, prefetch, persistent workers, threads,
reading ahead as on CUDA, a loader tuned by trials, in make_loader or at the first ``iter()``), the loop sees the
batches and errors a plain ``DataLoader`` (no workers) shows it, in the same order, and its own RNG draws match; and a
state saved anywhere, even right after an error, resumes on the batches that followed (NOTE [ A batch that raises ] in
autoloader/loader/source.py). Online tuning's part is the test at the end (its source yields ``BatchError``).
Every counterexample found is a plain test in test_counterexamples.py."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional, Tuple
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import autoloader.loader.prefetch as _prefetch
from autoloader import unwrap
from contract_data import BadSample, bad_index
from contracts import Data, Mode, Record, agree, build, closed, compare, datas, seed_all
from helpers import round_trip, wait_no_children

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning", "ignore::UserWarning")


def run_raising(loader: Any, epochs: int, *, record: Optional[Record] = None, stop: Optional[Tuple[int, int]] = None,
                set_epoch: bool = False) -> Tuple[Record, Optional[dict]]:
    """``epochs`` epochs of a loop that logs a ``BadSample`` and goes on: a failed batch is recorded as the sample it
    names, negated (``[-1 - i]``), then the loop draws as after a batch. ``stop=(e, k)``: return ``state_dict()`` after
    the ``k``-th item (batch or error) of epoch ``e``. ``set_epoch``: call it on the sampler first, as a loop over a
    plain DataLoader should (a PrefetchLoader advances a sampler's epoch itself when nobody did)."""
    record = record if record is not None else Record()
    for e in range(epochs):
        if stop == (e, 0):
            return record, loader.state_dict()
        if set_epoch and callable(getattr(loader.sampler, "set_epoch", None)):
            loader.sampler.set_epoch(e)
        record.epoch()
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except BadSample as error:
                record.indices[-1].append([-1 - bad_index(error)])
                record.values[-1].append([])
                record.add_draws()
            else:
                record.add(batch)
            if stop == (e, len(record.indices[-1])):
                return record, loader.state_dict()
    return record, None


def arm(loader: Any) -> None:
    """Make the dataset's bad samples raise from now on (a loader tuned by trials in make_loader was tuned before)."""
    unwrap(loader.dataset).armed = True


def make(data: Data, mode: Mode) -> Any:
    """``build`` for this contract: trials in make_loader see a clean dataset; every other mode a failing one."""
    loader = build(data, mode, armed=mode.tuning != "trials")
    arm(loader)
    return loader


def errors_agree(data: Data, mode: Mode, other: Mode, *, ahead: bool = False) -> dict:
    """``contracts.agree``, less what augmentation in the main process moves: the loop's draws when a batch's samples
    are fetched by threads there (the samples of a failed batch that were running when the first one raised finish,
    NOTE [ Threads inside workers ], and draw from the global RNGs, where a plain DataLoader stops at the failing
    sample); the draws and the augmentation's values when the prefetcher reads ahead (as with a CUDA side stream,
    batch i + 1 is loaded before the loop's draws after batch i: NOTE [ Stream synchronisation ]); and so the later
    epochs' order when it is drawn from the global RNG."""
    parts = agree(data, mode, other)
    main = [m for m in (mode, other) if m.main_draws != "never"]
    threaded = any(m.threads > 1 for m in main)
    moved = data.augment and bool(main) and (threaded or ahead)
    order_global = data.rng == "global" or data.sampler in ("global-rng", "python-random")
    return {"indices": parts["indices"] and not (moved and order_global), "draws": parts["draws"] and not moved,
            "values": parts["values"] and not (moved and ahead)}


@st.composite
def failing(draw: Any, *, streams: bool = True) -> Data:
    data = draw(datas(streams=streams, private=False), label="data")
    bad = draw(st.lists(st.integers(0, data.n - 1), min_size=1, max_size=3, unique=True), label="bad")
    return dataclasses.replace(data, bad=tuple(sorted(bad)))


@st.composite
def error_modes(draw: Any, *, data: Data) -> Mode:
    """Every mode but online: plain DataLoaders of any knobs, trials in make_loader, trials at the first ``iter()``."""
    tuning = draw(st.sampled_from(["plain"] * 5 + ([] if data.stream else ["trials", "lazy"])))
    if tuning == "lazy":
        return Mode("lazy", None, threads=draw(st.sampled_from([1, 2])))
    workers = 0 if data.stream else draw(st.integers(0, 3))
    if tuning == "trials" and draw(st.booleans()):
        workers = None
    persistent = bool(workers) and draw(st.booleans())
    prefetch = draw(st.sampled_from([None, 1, 3])) if workers else None
    threads = 1 if data.stream else draw(st.sampled_from([1, 1, 2]))
    return Mode(tuning, workers, persistent, prefetch, threads)


def check_errors(data: Data, mode: Mode, *, resumer: Optional[Mode] = None, epoch: int = 0, k: int = 0,
                 how: str = "json", ahead: bool = False) -> None:
    """``mode``'s epochs (``resumer``: saved after item ``k`` of ``epoch``, resumed by it) equal the plain DataLoader's,
    errors included."""
    seed_all(data.seed)
    reference = build(data, Mode("plain", 0)).loader  # the plain DataLoader itself, not wrapped
    want, _ = run_raising(reference, 2, set_epoch=True)
    closed(reference)
    parts = errors_agree(data, mode, Mode("plain", 0), ahead=ahead)
    seed_all(data.seed)
    loader = make(data, mode)
    try:
        if resumer is None:
            got, _ = run_raising(loader, 2)
            compare(got, want, parts, f"{data} as {mode}")
            return
        k = min(k, len(want.indices[epoch]))
        before, state = run_raising(loader, epoch + 1, stop=(epoch, k))
    finally:
        closed(loader)
    compare(before, want, parts, f"{data} saved by {mode}", prefix=True)
    if data.stream:
        return  # a stream that raised has ended (a generator does): nothing to resume but its end
    seed_all(data.seed + 7919)
    resumed = make(data, resumer)
    try:
        resumed.load_state_dict(round_trip(state, how))
        rest, _ = run_raising(resumed, 2 - epoch if k < len(want.indices[epoch]) else 1 - epoch)
    finally:
        closed(resumed)
    after = want.since(epoch, k) if k < len(want.indices[epoch]) else want.since(epoch + 1, 0)
    both = errors_agree(data, mode, resumer, ahead=ahead)  # the resumer continues the saver's run, the plain one's
    both = {name: both[name] and parts[name] for name in both}
    compare(rest, after, both, f"{data} saved by {mode} after item {k} of epoch {epoch}, resumed by {resumer}")


@given(st.data())
def test_a_batch_that_raises_is_raised_and_the_epoch_goes_on(draw):
    data = draw.draw(failing(), label="data")
    mode = draw.draw(error_modes(data=data), label="mode")
    ahead = draw.draw(st.booleans(), label="ahead")
    with mock.patch.object(_prefetch, "reads_ahead", lambda stream: True) if ahead else contextlib.nullcontext():
        if draw.draw(st.booleans(), label="resume"):
            check_errors(data, mode, resumer=draw.draw(error_modes(data=data), label="resumer"),
                         epoch=draw.draw(st.integers(0, 1), label="epoch"), k=draw.draw(st.integers(0, 12), label="k"),
                         how=draw.draw(st.sampled_from(["json", "torch"]), label="how"), ahead=ahead)
        else:
            check_errors(data, mode, ahead=ahead)
    assert wait_no_children() == []


@given(st.data())
def test_online_a_batch_that_raises_is_raised_and_the_epoch_goes_on(draw):
    """Online tuning's part of contract (d): mid-search, across a hidden switch, with the decision in force, and
    resumed (any saver, any resumer)."""
    data = draw.draw(failing(streams=False), label="data")
    online = Mode("online", None, threads=draw.draw(st.sampled_from([1, 1, 2]), label="threads"))
    if draw.draw(st.booleans(), label="resume"):
        check_errors(data, online, resumer=draw.draw(st.sampled_from([online, Mode("plain", 2)]), label="resumer"),
                     epoch=draw.draw(st.integers(0, 1), label="epoch"), k=draw.draw(st.integers(0, 12), label="k"))
        check_errors(data, Mode("plain", 0), resumer=online, epoch=0, k=draw.draw(st.integers(0, 12), label="k2"))
    else:
        check_errors(data, online)
    assert wait_no_children() == []
