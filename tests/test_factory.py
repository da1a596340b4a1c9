"""make_loader: cache -> tune -> DataLoader -> PrefetchLoader, end to end."""
import json
import logging
import time

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset

from autoloader import AutoloaderWarning, PrefetchLoader, make_loader
from helpers import live_children, paired
from workloads import InMemory, LatencyBound


@pytest.fixture
def data():
    return TensorDataset(torch.arange(300, dtype=torch.float32).view(-1, 1), torch.arange(300))


def entries(path):
    return sorted(p for p in path.glob("*.json") if p.name != "machine.json")


def test_batches_equal_a_bare_dataloader(data, tmp_path):
    loader = make_loader(data, 32, tuning="trials", cache=tmp_path, budget=3)
    assert isinstance(loader, PrefetchLoader) and isinstance(loader.loader, DataLoader)
    ours = list(loader)
    bare = list(DataLoader(data, batch_size=32))
    assert len(ours) == len(bare) == len(loader)
    for (x, y), (bx, by) in paired(ours, bare):
        assert torch.equal(x, bx) and torch.equal(y, by)
    assert loader.dataset is data and loader.batch_size == 32


def test_shuffled_batches_equal_a_bare_dataloader_with_the_same_generator(data, tmp_path):
    loader = make_loader(data, 16, shuffle=True, tuning="trials", cache=tmp_path, budget=3,
                         generator=torch.Generator().manual_seed(3))
    bare = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3))
    for (x, _), (bx, _) in paired(loader, bare):
        assert torch.equal(x, bx)


def test_second_call_hits_the_cache_without_trials_or_workers(tmp_path):
    data = LatencyBound(n=2000, latency_s=0.002)
    started = time.perf_counter()
    first = make_loader(data, 16, tuning="trials", cache=tmp_path, budget=4)
    tuning = time.perf_counter() - started
    assert first.tuning.source == "tuned" and first.tuning.trials
    assert len(entries(tmp_path)) == 1
    started = time.perf_counter()
    second = make_loader(data, 16, tuning="trials", cache=tmp_path, budget=4)
    elapsed = time.perf_counter() - started
    assert second.tuning.source == "cache"
    assert second.tuning.num_workers == first.tuning.num_workers
    assert not live_children(), "a cache hit must not start workers"
    assert elapsed < tuning / 10, f"a hit took {elapsed:.3f} s, tuning {tuning:.1f} s (the benchmark has the figures)"


@pytest.mark.parametrize("change", [
    {"batch_size": 8}, {"step": 0.01}, {"key": "another-name"}, {"drop_last": True}, {"max_workers": 1},
])
def test_changed_inputs_miss(tmp_path, change):
    data = InMemory(n=256)
    base = dict(batch_size=16, cache=tmp_path, budget=2, max_workers=2, tuning="trials")
    make_loader(data, **base)
    again = make_loader(data, **{**base, **change})
    assert again.tuning.source == "tuned"
    assert len(entries(tmp_path)) == 2


def test_dataset_length_changes_the_key(tmp_path):
    make_loader(InMemory(n=256), 16, tuning="trials", cache=tmp_path, budget=2, max_workers=1)
    args = dict(tuning="trials", cache=tmp_path, budget=2, max_workers=1)
    assert make_loader(InMemory(n=257), 16, **args).tuning.source == "tuned"
    assert make_loader(InMemory(n=256), 16, **args).tuning.source == "cache"


def test_key_overrides_the_fingerprint(tmp_path):
    make_loader(InMemory(n=256), 16, tuning="trials", cache=tmp_path, budget=2, max_workers=1, key="train")
    again = make_loader(InMemory(n=999), 16, tuning="trials", cache=tmp_path, budget=2, max_workers=1, key="train")
    assert again.tuning.source == "cache"


def test_cache_false_neither_reads_nor_writes(tmp_path, cache_dir):
    make_loader(InMemory(n=256), 16, tuning="trials", cache=False, budget=2, max_workers=1)
    assert not cache_dir.exists() or not entries(cache_dir)


def test_default_cache_is_the_environment_directory(cache_dir):
    make_loader(InMemory(n=256), 16, tuning="trials", budget=2, max_workers=1)
    assert len(entries(cache_dir)) == 1
    entry = json.loads(entries(cache_dir)[0].read_text())
    assert entry["meta"]["batch_size"] == 16 and entry["meta"]["dataset"] == "InMemory"


def test_explicit_knobs_are_never_overridden(tmp_path):
    data = LatencyBound(n=2000, latency_s=0.002)
    loader = make_loader(data, 16, tuning="trials", cache=tmp_path, budget=3, num_workers=1, prefetch_factor=3,
                         persistent_workers=False, pin_memory=False)
    dl = loader.loader
    assert (dl.num_workers, dl.prefetch_factor, dl.persistent_workers, dl.pin_memory) == (1, 3, False, False)
    assert {t.config.num_workers for t in loader.tuning.trials} == {1}
    # a cached entry made without those knobs is not used for a call that fixes them, and vice versa
    free = make_loader(data, 16, tuning="trials", cache=tmp_path, budget=3, max_workers=2)
    assert free.tuning.source == "tuned"


def test_user_dataloader_arguments_pass_through(tmp_path):
    def collate(samples):
        return torch.stack(samples) * 2

    data = InMemory(n=100)
    loader = make_loader(data, 10, tuning="trials", cache=tmp_path, budget=2, max_workers=1, collate_fn=collate,
                         drop_last=True, sampler=SequentialSampler(data))
    assert loader.loader.collate_fn is collate and loader.loader.drop_last
    first = next(iter(loader))
    assert torch.equal(first, data.data[:10] * 2)


def test_unwritable_cache_still_returns_a_tuned_loader(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(AutoloaderWarning, match="cache"):
        loader = make_loader(InMemory(n=256), 16, tuning="trials", cache=blocker, budget=2, max_workers=1)
    assert loader.tuning.source == "tuned"
    assert len(list(loader)) == 16


def test_corrupt_entry_is_a_miss_then_replaced(tmp_path):
    data = InMemory(n=256)
    make_loader(data, 16, tuning="trials", cache=tmp_path, budget=2, max_workers=1)
    (entry,) = entries(tmp_path)
    entry.write_text("{ truncated")
    with pytest.warns(AutoloaderWarning):
        again = make_loader(data, 16, tuning="trials", cache=tmp_path, budget=2, max_workers=1)
    assert again.tuning.source == "tuned"
    assert make_loader(data, 16, tuning="trials", cache=tmp_path, budget=2, max_workers=1).tuning.source == "cache"


def test_logs_one_info_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="autoloader"):
        make_loader(InMemory(n=256), 16, tuning="trials", cache=tmp_path, budget=2, max_workers=1)
    lines = [r.getMessage() for r in caplog.records if r.name == "autoloader"]
    assert len(lines) == 1
    assert "workers=" in lines[0] and "samples/s" in lines[0] and "from tuned" in lines[0]


def test_set_epoch_and_several_epochs(tmp_path):
    data = InMemory(n=64)
    loader = make_loader(data, 16, shuffle=True, tuning="trials", cache=tmp_path, budget=2, max_workers=1)
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sum(len(b) for b in loader) == 64
