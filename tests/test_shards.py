"""How many shards an IterableDataset reads (autoloader._shards): where the dataset says, never a guess."""
from __future__ import annotations

from autoloader._shards import shard_count


class _Stage:
    def __init__(self, urls) -> None:
        self.urls = urls


class ResampledShards(_Stage):
    """Named as WebDataset's endless resampled shard list."""


class _Pipeline:
    def __init__(self, *stages) -> None:
        self.pipeline = list(stages)


def split_by_node(src):  # named as WebDataset's node splitter
    return src


def test_a_hugging_face_count_is_read_and_a_bad_one_ignored():
    assert shard_count(type("D", (), {"num_shards": 7})()) == 7
    assert shard_count(type("D", (), {"n_shards": 3})()) == 3
    assert shard_count(type("D", (), {"num_shards": True})()) is None
    assert shard_count(type("D", (), {"num_shards": 0})()) is None


def test_a_webdataset_pipeline_counts_its_first_stage_urls_unless_resampled():
    assert shard_count(_Pipeline(_Stage(["a.tar", "b.tar", "c.tar"]))) == 3
    assert shard_count(_Pipeline(ResampledShards(["a.tar", "b.tar"]))) is None
    assert shard_count(_Pipeline(_Stage([]))) is None and shard_count(_Pipeline()) is None
    assert shard_count(_Pipeline(_Stage(["a.tar"] * 4), split_by_node)) == 4  # no process group: every shard here


def test_a_dataset_that_does_not_say_gives_none():
    assert shard_count(object()) is None and shard_count(type("D", (), {"pipeline": "not a list"})()) is None
