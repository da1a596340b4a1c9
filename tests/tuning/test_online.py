"""Online tuning (autoloader.tuning.online): the training loop's own epochs are the trials, and nothing about the loop
changes.

Every epoch must yield exactly the batches a plain DataLoader with the same arguments and seeds yields, whatever
candidates serve it; failures of a candidate lose nothing; the user's errors surface unchanged; decisions are kept in
``loader.decisions`` and the cache. The search's choices themselves are tested on tables in test_policy.py.
"""
from __future__ import annotations

import gc
import itertools
import time

import psutil
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, WeightedRandomSampler

from autoloader import PrefetchLoader, make_loader
from autoloader.cache.slot import Slot
from autoloader.cache.store import TuneCache
from autoloader.config import make_config
from autoloader.loader.native import users_init
from autoloader.probe import probe_machine
from autoloader.request import Request
from autoloader.results import TuneResult
from autoloader.tuning.online import OnlineLoader
from autoloader.tuning.online_search import OnlineSearch
from autoloader.loader.slices import BatchSlice
from fault_data import Stream
from online_data import Corrupt, Indexed, KilledFromWorkers, NeedsWorkerInit, RaisesAt, Regime, mark_initialised

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")


def _epochs(loader, epochs, *, take=None):
    """The index lists of each batch, per epoch (``take``: stop each epoch after that many batches)."""
    out = []
    for _ in range(epochs):
        batches = []
        for batch in itertools.islice(loader, take):
            batches.append(batch.view(-1).tolist())
        out.append(batches)
    return out


SETUPS = {
    "shuffle-generator": lambda: dict(shuffle=True, generator=torch.Generator().manual_seed(5)),
    "shuffle-global-seed": lambda: dict(shuffle=True),
    "drop-last-ragged": lambda: dict(shuffle=True, drop_last=True),
    "weighted-sampler": lambda: dict(sampler=WeightedRandomSampler(
        torch.rand(1203, generator=torch.Generator().manual_seed(0)).tolist(), 1203)),
    "batch-sampler": lambda: dict(batch_sampler=BatchSampler(RandomSampler(range(1203)), 10, drop_last=False)),
}


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_epoch_equals_a_plain_dataloaders_epoch(setup):
    data = Indexed(1203, latency_s=0.0005)
    batch_size = 1 if setup == "batch-sampler" else 10
    torch.manual_seed(11)
    loader = make_loader(data, batch_size, cache=False, tuning="online", max_workers=4, **SETUPS[setup]())
    assert len(loader) == len(DataLoader(data, batch_size, **SETUPS[setup]()))
    online = _epochs(loader, 3)
    assert loader.online_traces[0].epoch == 0, "candidates served the first epoch"
    after_online = torch.random.get_rng_state()
    torch.manual_seed(11)
    plain = _epochs(DataLoader(data, batch_size, **SETUPS[setup]()), 3)
    assert online == plain
    assert torch.equal(after_online, torch.random.get_rng_state()), "the RNG ends as a plain loader leaves it"
    del loader


def _epochs_stepping(loader, epochs, step_s):
    """``_epochs``, with a training step of ``step_s`` after each batch."""
    out = []
    for _ in range(epochs):
        batches = []
        for batch in loader:
            batches.append(batch.view(-1).tolist())
            time.sleep(step_s)
        out.append(batches)
    return out


def _until_decided(loader, decisions=1, max_epochs=10, step_s=0.0):
    """Epochs until the loader made ``decisions`` (a candidate needs a few waves of batches, more than an epoch of
    these small datasets may hold); returns the epochs' batches."""
    epochs = []
    while len(loader.decisions) < decisions:
        assert len(epochs) < max_epochs, f"no decision after {max_epochs} epochs"
        epochs += _epochs_stepping(loader, 1, step_s)
    return epochs


def test_returns_at_once_and_decides_during_the_first_epochs(cache_dir):
    data = Indexed(3000, latency_s=0.002)
    loader = make_loader(data, 16, shuffle=True, tuning="online", max_workers=8)
    assert loader.tuning.source == "pending" and not loader.decisions, "nothing is looked up before iter()"
    _until_decided(loader)
    [decision] = loader.decisions
    assert loader.tuning.samples_per_s == decision.samples_per_s and decision.candidates >= 2
    assert decision.config.num_workers > 0, "2 ms of waiting per sample: workers pay"
    assert 0 < decision.switch_s <= decision.search_s
    assert "online" in str(loader.tuning) and str(decision.epoch) in repr(decision)
    again = make_loader(data, 16, shuffle=True, tuning="online", max_workers=8)
    next(iter(again))
    assert again.tuning.source == "cache" and again.tuning.config == loader.tuning.config
    assert not again.decisions, "the cached decision: nothing searched"
    again._iterator = None  # its persistent workers, shut down as Lightning does (a collection would take 5 s each)
    del loader, again


@pytest.mark.slow
def test_a_candidate_whose_workers_die_is_abandoned_and_no_sample_is_lost():
    data = KilledFromWorkers(1000, from_workers=2)
    torch.manual_seed(3)
    loader = make_loader(data, 8, shuffle=True, cache=False, tuning="online", max_workers=4)
    online = _until_decided(loader)
    torch.manual_seed(3)
    assert online == _epochs(DataLoader(Indexed(1000), 8, shuffle=True), len(online))
    failed = [t for t in loader.tuning.trials if t.status == "failed"]
    assert failed and all(t.config.num_workers >= 2 and "worker" in t.reason for t in failed)
    assert loader.tuning.num_workers < 2
    del loader


def test_the_users_own_error_surfaces_unchanged():
    loader = make_loader(RaisesAt(400, bad=150), 8, cache=False, tuning="online", max_workers=2)
    with pytest.raises(Corrupt, match="sample 150 is corrupt"):
        _epochs(loader, 1)
    del loader


def test_break_mid_epoch_then_a_new_epoch_behaves_as_a_plain_loader():
    data = Indexed(900, latency_s=0.0005)
    torch.manual_seed(2)
    loader = make_loader(data, 10, shuffle=True, cache=False, tuning="online", max_workers=4)
    partial = _epochs(loader, 1, take=5)
    rest = _epochs(loader, 2)
    torch.manual_seed(2)
    plain = DataLoader(data, 10, shuffle=True)
    assert partial == _epochs(plain, 1, take=5) and rest == _epochs(plain, 2)
    del loader


@pytest.mark.slow
def test_the_loader_retunes_when_the_regime_changes_and_retune_false_freezes():
    histories = {}
    for retune in (True, False):
        data = Regime(2400, latency_s=0.003)  # cold: every read waits
        loader = make_loader(data, 16, shuffle=True, cache=False, tuning="online", retune=retune, max_workers=8)
        _until_decided(loader)
        first = loader.tuning.config
        data.latency(0.0)  # warm: the page cache serves it (in every process: the decision's workers persist)
        _epochs(loader, 1)  # the epoch that shows the change
        if retune:
            _until_decided(loader, decisions=2)
        else:
            _epochs(loader, 3)
        histories[retune] = (first, loader.decisions)
        del loader
    first, decisions = histories[True]
    assert len(decisions) == 2 and "samples/s" in decisions[1].why
    assert decisions[1].samples_per_s > 1.5 * decisions[0].samples_per_s, "measured again, in the warm regime"
    assert decisions[1].config.num_workers <= first.num_workers, "in memory, no more workers are needed"
    assert len(histories[False][1]) == 1


def test_auto_mode_and_argument_errors():
    data = Indexed(200)
    def started(loader):
        next(iter(loader))  # the cache and any trials are made at the first iter()
        return loader.tuning.source

    assert started(make_loader(data, 8, cache=False)) == "online", "map-style, no step: online"
    assert started(make_loader(data, 8, cache=False, step=0.001, budget=2)) == "tuned", "a step: trials"
    assert started(make_loader(Stream(64), 8, cache=False, budget=2)) == "tuned", "a stream: trials"
    with pytest.raises(ValueError, match="IterableDataset"):
        make_loader(Stream(64), 8, cache=False, tuning="online")
    with pytest.raises(ValueError, match="num_workers=2 is fixed"):
        make_loader(data, 8, cache=False, tuning="online", num_workers=2)
    with pytest.raises(ValueError, match="tuning='sometimes'"):
        make_loader(data, 8, cache=False, tuning="sometimes")
    with pytest.raises(TypeError, match="retune"):
        make_loader(data, 8, cache=False, retune="yes")


def test_trials_mode_keeps_todays_static_loader():
    loader = make_loader(Indexed(400), 8, cache=False, tuning="trials", budget=2)
    assert loader.tuning.source == "tuned" and type(loader.loader) is DataLoader
    static = loader.loader
    assert static.num_workers == loader.tuning.num_workers
    for _ in range(2):
        assert sum(len(b) for b in loader) == 400 and loader.loader is static
    assert not loader.decisions and not loader.online_traces, "nothing searched online"
    del loader, static


# ---------------------------------------------------------------- OnlineLoader: a DataLoader-like source

def _online_loader(data, batch_size, *, shuffle=False, max_workers=2, **kwargs):
    """An ``OnlineLoader`` built by hand, with no cache, as ``make_loader(tuning="online")`` builds it."""
    request = Request.checked(data, batch_size, shuffle=shuffle, max_workers=max_workers, dataloader_kwargs=kwargs)
    profile = probe_machine(disk=False, gpus=False)
    search = OnlineSearch.create(request, profile, slot=Slot(request, profile, None, None), decision=None)
    return OnlineLoader(request, search, retune=False)


def test_online_loader_answers_what_a_dataloader_answers():
    data, generator = Indexed(300), torch.Generator().manual_seed(5)
    online = _online_loader(data, 10, shuffle=True, generator=generator, drop_last=True)
    plain = DataLoader(data, 10, shuffle=True, generator=generator, drop_last=True)
    assert len(online) == len(plain) == 30 and online.dataset is data and online.batch_size == 10
    assert online.drop_last and online.generator is generator
    assert type(online.sampler) is RandomSampler and online.sampler.generator is generator
    assert type(online.batch_sampler) is BatchSampler and online.batch_sampler.sampler is online.sampler
    assert online.batch_sampler.batch_size == 10 and online.batch_sampler.drop_last
    assert online.searching and online.tuning.source == "online" and online.decisions == () and not online.traces
    loader = PrefetchLoader(online)  # wrapped by hand, as a DataLoader would be
    assert len(loader) == 30 and loader.dataset is data and loader.batch_size == 10
    assert loader.sampler is online.sampler and loader.batch_sampler is online.batch_sampler
    assert loader.tuning is online.tuning and loader.loader is online.plain and loader.decisions == ()
    loader.worker_init_fn = mark_initialised
    assert online.worker_init_fn is mark_initialised and online.plain.worker_init_fn is mark_initialised
    del loader, online


def test_a_prefetch_loader_wraps_it_as_it_wraps_a_dataloader():
    """Wrapped by hand: each epoch is the plain DataLoader's, ``loader.loader`` is the candidate in force while the
    search runs and the decision's DataLoader after it (one for a whole epoch, the user's worker_init_fn kept); the
    plain DataLoader, rebuilt with the decision, is what frameworks read."""
    data = NeedsWorkerInit(1200, latency_s=0.0005)
    online = _online_loader(data, 10, shuffle=True, generator=torch.Generator().manual_seed(3))
    loader = PrefetchLoader(online)
    loader.worker_init_fn = mark_initialised  # as Lightning's seed_everything(workers=True) does
    epochs, in_force = [], []
    while not loader.decisions:
        assert len(epochs) < 10, "no decision after 10 epochs"
        loader.set_epoch(100 + len(epochs))
        batches, seen = [], []
        for batch in loader:
            batches.append(batch.view(-1).tolist())
            seen.append(loader.loader)
        epochs.append(batches)
        in_force.append(seen[:-1])  # at the last batch the prefetcher has asked past the epoch's end
    [decision] = loader.decisions
    assert decision.epoch == 100 + len(epochs) - 1 and [t.epoch for t in loader.online_traces] == [
        100 + e for e in range(len(epochs))], "set_epoch numbers the source's epochs"
    candidates = {id(dl): dl for seen in in_force for dl in seen}.values()
    assert len(candidates) >= 2 and all(isinstance(dl.batch_sampler, BatchSlice) for dl in in_force[0])
    assert all(dl is not online.plain and users_init(dl.worker_init_fn) is mark_initialised for dl in candidates)
    assert type(online.plain.batch_sampler) is BatchSampler, "frameworks read the plain DataLoader's samplers"
    assert online.plain.num_workers == decision.config.num_workers == loader.tuning.num_workers
    assert loader.worker_init_fn is mark_initialised and users_init(online.plain.worker_init_fn) is mark_initialised
    batches, served = [], set()
    for batch in loader:
        batches.append(batch.view(-1).tolist())
        served.add(loader.loader)
    epochs.append(batches)
    [decided] = served
    assert decided.num_workers == decision.config.num_workers and users_init(decided.worker_init_fn) is \
        mark_initialised, "the decision serves: one DataLoader for the whole epoch"
    assert decided.persistent_workers == decision.config.persistent_workers
    plain = DataLoader(Indexed(1200), 10, shuffle=True, generator=torch.Generator().manual_seed(3))
    assert epochs == _epochs(plain, len(epochs))
    del loader, online, candidates, in_force, served, decided


def test_a_decision_reaches_the_cache_once_as_autotune_show_lists_it(cache_dir, monkeypatch):
    puts, put = [], TuneCache.put

    def counted(self, key, result, **kwargs):
        puts.append(key)
        return put(self, key, result, **kwargs)

    monkeypatch.setattr(TuneCache, "put", counted)
    loader = make_loader(Indexed(1200, latency_s=0.001), 16, shuffle=True, tuning="online", retune=False,
                         max_workers=2)
    assert not puts and not TuneCache(cache_dir).entries(), "nothing decided yet, nothing cached"
    _until_decided(loader)
    _epochs(loader, 2)
    assert puts == [loader.cache_key], "one decision, stored once"
    [entry] = TuneCache(cache_dir).entries()
    assert entry.key == loader.cache_key and entry.error is None and entry.meta["dataset"] == "Indexed"
    assert entry.result.source == "online" and entry.result.config == loader.tuning.config
    assert entry.result.samples_per_s == loader.decisions[0].samples_per_s
    del loader


def test_an_epoch_that_never_waits_for_data_tries_fewer_workers_once():
    """A decision taken cold (here: a cached 4 workers): an epoch whose loop never waited (told to the loader as
    ``OnlineSearch.after_epoch`` would be, so the test does not depend on this machine's load) makes the next epoch search down
    from 4, never up; the decision says why, and the loader does not search down again from it (search/retune.py)."""
    data = Indexed(1600, latency_s=0.0)
    request = Request.checked(data, 16, shuffle=True, max_workers=8, dataloader_kwargs={})
    profile = probe_machine(disk=False, gpus=False)
    cached = TuneResult(make_config(4, fixed={}, pin_memory=False), 2000.0, None, "cache", reason="cached cold")
    search = OnlineSearch.create(request, profile, slot=Slot(request, profile, None, None), decision=cached)
    source = OnlineLoader(request, search, retune=True)
    search.after_epoch(1, 2000.0, 0.04)  # a rate that did not move, an epoch that hardly waited
    assert source.searching and search.current.down
    loader = PrefetchLoader(source, device="cpu", tuning=None)
    epochs = 0
    while not loader.decisions:
        assert epochs < 8, "the search down did not decide in 8 epochs"
        for _ in loader:
            time.sleep(0.002)
        epochs += 1
    [decision] = loader.decisions
    assert "trying fewer" in decision.why, decision.why
    tried = {t.config.num_workers for t in loader.tuning.trials}
    assert 4 in tried and tried <= {0, 1, 2, 3, 4}, f"a search down never climbs: {sorted(tried)}"
    search.after_epoch(9, decision.samples_per_s, 0.0)
    assert not source.searching, "one search down per decision"
    search.after_epoch(10, decision.samples_per_s / 2, 0.0)
    assert not source.searching, "half as fast while the loop hardly waited: the step slowed, no search"
    search.after_epoch(11, decision.samples_per_s / 2, 0.3)
    assert source.searching and not search.current.down, "the loop waits for data now: a search either way"
    del loader, source


def test_a_search_again_from_the_decision_measures_it_on_the_workers_that_serve_it():
    """NOTE [ Online switching ], the decision's workers: a re-tune's first candidate is the configuration in force,
    measured on its persistent workers, not on a pool forked again (a 16-worker re-tune had made an epoch 10 %
    slower); a stage of another configuration then lets them go. Every epoch is still the plain DataLoader's."""
    data = Indexed(1600, latency_s=0.0005)
    request = Request.checked(data, 16, shuffle=True, max_workers=4, dataloader_kwargs={})
    profile = probe_machine(disk=False, gpus=False)
    cached = TuneResult(make_config(2, fixed={}, pin_memory=False, persistent_workers=True), 2000.0, None, "cache",
                        reason="cached")
    search = OnlineSearch.create(request, profile, slot=Slot(request, profile, None, None), decision=cached)
    source = OnlineLoader(request, search, retune=True)
    loader = PrefetchLoader(source, device="cpu", tuning=None)
    me = psutil.Process()
    first = [batch for batch in loader]
    serving = {p.pid for p in me.children()}
    assert len(serving) == 2, serving
    search.after_epoch(0, 2000.0, 0.04)  # an epoch that hardly waited: search fewer, from the 2 in force
    assert source.searching
    epoch = iter(loader)
    again = [next(epoch)]
    assert {p.pid for p in me.children()} == serving, "the configuration in force was forked again"
    again += list(epoch)
    assert len(again) == len(first) == 100 and sorted(int(i) for b in again for i in b) == list(range(1600))
    for _ in range(6):
        if not source.searching:
            break
        list(loader)
    assert not source.searching and [t.config.num_workers for t in source.tuning.trials][:1] == [2]
    measured = source.tuning.trials[0]
    assert measured.ok and measured.worker_cpu_util is not None and measured.worker_uss_bytes is not None, \
        "the workers that served on were measured as the candidate's own"
    del epoch, loader, source
    gc.collect()


def _until_dead(procs, timeout=5.0):
    """Wait until ``procs`` exited (a zombie counts: multiprocessing, not the test, reaps a worker)."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        while time.monotonic() < deadline:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)


def _recording_hand_overs(monkeypatch, *, kill_tail=False):
    """Record every switch the epoch scheduler makes once a candidate is measured (``EpochScheduler._decide``: the
    batches the measured candidate still held, its tail, the candidate started beside it); ``kill_tail``: SIGKILL the
    measured candidate's workers as its tail begins."""
    from autoloader.tuning.scheduler import EpochScheduler
    records = []
    real = EpochScheduler._decide

    def recording(self, stage, *, same_tail):
        in_flight = stage.batch_slice.pulled - stage.run.record.delivered
        event = real(self, stage, same_tail=same_tail)
        following = self.started
        if event in ("keep", "again", "defer"):  # no switch: the run serves on
            return event
        tail = stage.batch_slice.limit - stage.run.record.delivered if event == "switch" else None
        records.append((stage.config.num_workers, in_flight, tail,
                        following.config.num_workers if following else None))
        if kill_tail and tail and following is not None and stage.config.num_workers:
            workers = stage.run.serving.processes.current()
            for proc in workers:
                proc.kill()
            _until_dead(workers)
        return event

    monkeypatch.setattr(EpochScheduler, "_decide", recording)
    return records


@pytest.mark.slow
def test_the_next_candidate_starts_while_the_measured_one_serves_its_tail(monkeypatch):
    """NOTE [ Hidden switch ]: at each switch the measured candidate serves what it holds in flight (none lost or
    loaded twice: its slice gives nothing back) while the next candidate's workers start; the epochs stay exact."""
    records = _recording_hand_overs(monkeypatch)
    data = Indexed(960, latency_s=0.015)  # 120 ms batches: the prior (6 workers) starts early; a 30 ms step needs 5
    torch.manual_seed(4)
    loader = make_loader(data, 8, shuffle=True, cache=False, tuning="online", max_workers=6)
    online = _until_decided(loader, step_s=0.03)
    torch.manual_seed(4)
    assert online == _epochs(DataLoader(data, 8, shuffle=True), len(online))
    assert records, "no switch was hidden"
    for workers, in_flight, tail, following in records:
        assert tail is not None, "one process: every switch keeps a tail"
        assert tail == (in_flight if workers else in_flight + 2), (workers, in_flight, tail)
    started = [r for r in records if r[3] is not None]
    assert started and any(r[0] > 0 and r[1] > 0 for r in started), records
    del loader


@pytest.mark.slow
def test_a_worker_lost_in_the_tail_loses_no_batch_and_the_next_candidate_starts_again(monkeypatch, caplog):
    records = _recording_hand_overs(monkeypatch, kill_tail=True)
    data = Indexed(960, latency_s=0.015)  # as above: 6 workers start early, then 5 meet the step
    torch.manual_seed(6)
    loader = make_loader(data, 8, shuffle=True, cache=False, tuning="online", max_workers=6)
    with caplog.at_level("WARNING", logger="autoloader.online"):
        online = _until_decided(loader, step_s=0.03)
    torch.manual_seed(6)
    assert online == _epochs(DataLoader(data, 8, shuffle=True), len(online))
    killed = [r for r in records if r[0] > 0 and r[3] is not None]
    assert killed, records
    assert "failed after it was measured" in caplog.text
    assert loader.decisions, "the search went on"
    del loader


def test_a_search_that_outlived_its_epoch_tries_fewer_once_after_its_decision():
    """Candidates measured in different epochs (here: epochs of 5 batches, too short for one search) do not compare
    as one regime (search/retune.py): the decision says so (``spanned``), and an epoch served by it that moved nothing
    (told to the loader as ``OnlineSearch.after_epoch`` would be, so the test does not depend on this machine's load) makes the
    next epoch try fewer workers."""
    loader = make_loader(Indexed(40, latency_s=0.002), 8, shuffle=True, cache=False, tuning="online", max_workers=4)
    _until_decided(loader)
    source = loader._source
    [decision] = loader.decisions
    assert decision.epoch > 0 and source.search.spanned, "the search outlived its first epoch"
    del loader, source

    data = Indexed(1600, latency_s=0.0)
    request = Request.checked(data, 16, shuffle=True, max_workers=8, dataloader_kwargs={})
    profile = probe_machine(disk=False, gpus=False)
    cached = TuneResult(make_config(6, fixed={}, pin_memory=False), 2000.0, None, "cache", reason="cached")
    search = OnlineSearch.create(request, profile, slot=Slot(request, profile, None, None), decision=cached)
    source = OnlineLoader(request, search, retune=True)
    search.after_epoch(1, 2000.0, 0.08)  # the loop waited a little: no rule fires in one regime
    assert not source.searching
    search.spanned = True
    search.after_epoch(1, 2000.0, 0.08)
    assert source.searching and search.current.down
    del source


def test_costly_first_samples_start_the_prior_inside_the_first_batch():
    """NOTE [ Online convergence ], 1.: 10 ms samples make an 80 ms batch; four samples in, the prior's workers start
    (forking 4 twice costs ~160 ms, less than the probe's 3 batches of loading), and the main process serves only the
    batch it was loading. The epoch is still exactly the plain DataLoader's."""
    data = Indexed(480, latency_s=0.01)
    torch.manual_seed(11)
    loader = make_loader(data, 8, shuffle=True, cache=False, tuning="online", max_workers=4)
    online = _epochs(loader, 2)
    torch.manual_seed(11)
    assert online == _epochs(DataLoader(data, 8, shuffle=True), 2)
    probe = loader.tuning.trials[0] if loader.tuning.trials else None
    trace = loader.online_traces[0]
    serial_end = trace.spans[0][1]
    assert trace.spans[0][2] == "workers=0"
    assert sum(1 for t, _ in trace.batches if t <= serial_end) == 1, "the main process served its first batch only"
    assert trace.spans[1][2].startswith("workers=4"), trace.spans
    if probe is not None:
        assert probe.config.num_workers == 0 and not probe.steady and (probe.reason or "").startswith("probe")
    del loader


@pytest.mark.parametrize("batches", [1, 20])
def test_an_epoch_left_mid_search_leaves_no_cycle_holding_a_dataloader(batches):
    """The loop leaves the epoch (its iterator dropped: the generators closed) while a candidate serves: nothing of it
    waits for a garbage collection. The scheduler once kept the GeneratorExit in a local while re-raising it, a
    cycle through its frame, the stage and a DataLoader."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        loader = make_loader(Indexed(2_000, latency_s=0.002), batch_size=8, tuning="online", cache=False)
        it = iter(loader)
        for _ in range(batches):
            next(it)
        del it, loader
        gc.collect()
        held = [type(o).__name__ for o in gc.garbage if isinstance(o, (DataLoader, BaseException))]
        assert held == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
