"""Online tuning (autoloader.online): the training loop's own epochs are the trials, and nothing about the loop changes.

Every epoch must yield exactly the batches a plain DataLoader with the same arguments and seeds yields, whatever
candidates serve it; failures of a candidate lose nothing; the user's errors surface unchanged; decisions are kept in
``loader.decisions`` and the cache. The search's choices themselves are tested on tables in test_policy.py.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, WeightedRandomSampler

from autoloader import make_loader
from online_data import Corrupt, Indexed, KilledFromWorkers, RaisesAt
from fault_data import Stream

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
    after_online = torch.random.get_rng_state()
    torch.manual_seed(11)
    plain = _epochs(DataLoader(data, batch_size, **SETUPS[setup]()), 3)
    assert online == plain
    assert torch.equal(after_online, torch.random.get_rng_state()), "the RNG ends as a plain loader leaves it"
    del loader


def _until_decided(loader, decisions=1, max_epochs=10):
    """Epochs until the loader made ``decisions`` (a candidate needs a few waves of batches, more than an epoch of
    these small datasets may hold); returns the epochs' batches."""
    epochs = []
    while len(loader.decisions) < decisions:
        assert len(epochs) < max_epochs, f"no decision after {max_epochs} epochs"
        epochs += _epochs(loader, 1)
    return epochs


def test_returns_at_once_and_decides_during_the_first_epochs(cache_dir):
    data = Indexed(3000, latency_s=0.002)
    loader = make_loader(data, 16, shuffle=True, tuning="online", max_workers=8)
    assert loader.tuning.source == "online" and loader.tuning.samples_per_s is None and not loader.decisions
    _until_decided(loader)
    [decision] = loader.decisions
    assert loader.tuning.samples_per_s == decision.samples_per_s and decision.candidates >= 2
    assert decision.config.num_workers > 0, "2 ms of waiting per sample: workers pay"
    assert 0 < decision.switch_s <= decision.search_s
    assert "online" in str(loader.tuning) and str(decision.epoch) in repr(decision)
    again = make_loader(data, 16, shuffle=True, tuning="online", max_workers=8)
    assert again.tuning.source == "cache" and again.tuning.config == loader.tuning.config
    assert not again.decisions, "the cached decision: nothing searched"
    del loader, again


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


def test_the_loader_retunes_when_the_regime_changes_and_retune_false_freezes():
    histories = {}
    for retune in (True, False):
        data = Indexed(2400, latency_s=0.003)  # cold: every read waits
        loader = make_loader(data, 16, shuffle=True, cache=False, tuning="online", retune=retune, max_workers=8)
        _until_decided(loader)
        first = loader.tuning.config
        data.latency_s = 0.0  # warm: the page cache serves it
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
    assert make_loader(data, 8, cache=False).tuning.source == "online", "map-style, no step: online"
    assert make_loader(data, 8, cache=False, step=0.001, budget=2).tuning.source == "tuned", "a step: trials"
    assert make_loader(Stream(64), 8, cache=False, budget=2).tuning.source == "tuned", "a stream: trials"
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
    assert loader.tuning.source == "tuned" and loader._online is None and not loader.decisions
    del loader
