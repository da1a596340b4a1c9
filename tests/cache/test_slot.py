"""A request's cache entry (autoloader.cache.slot): the key reads no sample, and the first batch served is checked
against the batches the entry was tuned on (NOTE [ What the cache key covers ])."""
from __future__ import annotations

import json
import logging

import pytest
import torch
from torch.utils.data import Dataset

from autoloader import make_loader

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")


class Images(Dataset):
    """Same class, length and root whatever ``side``: only the samples tell two of them apart."""

    def __init__(self, side: int) -> None:
        self.side = side

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(3, self.side, self.side)


def entry(path):
    (found,) = [p for p in path.glob("*.json") if p.name != "machine.json"]
    return json.loads(found.read_text())


def made(side: int, cache, **kwargs):
    loader = make_loader(Images(side), batch_size=4, cache=cache, tuning="trials", budget=0.5, max_workers=1, **kwargs)
    next(iter(loader))
    return loader


def test_the_entry_keeps_the_first_batch_and_a_hit_alike_uses_it(tmp_path):
    assert made(8, tmp_path).tuning.source == "tuned"
    signature = entry(tmp_path)["meta"]["batch"]
    assert signature["bytes"] == 4 * 3 * 8 * 8 * 4 and signature["structure"]["ndim"] == 4
    assert made(8, tmp_path).tuning.source == "cache"
    assert made(10, tmp_path).tuning.source == "cache", "1.6x the bytes: alike (padding, crops)"
    assert entry(tmp_path)["meta"]["batch"] == signature


def test_a_hit_whose_batches_look_otherwise_serves_this_run_and_is_tuned_again(tmp_path, caplog):
    made(8, tmp_path)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        assert made(32, tmp_path).tuning.source == "cache", "this run: the entry"
    assert any("made for batches unlike these" in r.getMessage() for r in caplog.records)
    assert not [p for p in tmp_path.glob("*.json") if p.name != "machine.json"], "removed"
    assert made(32, tmp_path).tuning.source == "tuned"
    assert entry(tmp_path)["meta"]["batch"]["bytes"] == 4 * 3 * 32 * 32 * 4


@pytest.mark.slow
def test_a_named_dataset_keeps_its_key_and_an_entry_without_a_signature_gets_one(tmp_path):
    made(8, tmp_path, key="images")
    data = entry(tmp_path)
    del data["meta"]["batch"]  # as an entry autotune tune, or an earlier autoloader, wrote it
    (path,) = [p for p in tmp_path.glob("*.json") if p.name != "machine.json"]
    path.write_text(json.dumps(data))
    assert made(8, tmp_path, key="images").tuning.source == "cache"
    assert entry(tmp_path)["meta"]["batch"]["bytes"] == 4 * 3 * 8 * 8 * 4
