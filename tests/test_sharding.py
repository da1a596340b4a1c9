"""Sharding across ranks (autoloader.sharding): the facts every rank must share, and the sampler that refuses to be
sharded a second time by Accelerate (a stand-in ``accelerate.data_loader`` module, as ``sys.modules`` would hold it).
Sharding inside a process group is in test_distributed.py."""
from __future__ import annotations

import sys
import types

import pytest

from autoloader.sharding import ShardingSampler, check_same


def testcheck_same_names_the_argument_the_ranks_and_the_fix():
    facts = [{"batch_size": 8, "len(dataset)": 100}] * 2 + [{"batch_size": 16, "len(dataset)": 100}] * 2
    with pytest.raises(ValueError, match=r"disagree on batch_size: 8 on ranks \[0, 1\] \(nodes \[0\]\); 16 on ranks "
                                         r"\[2, 3\] \(nodes \[1\]\).*same batch_size"):
        check_same(facts, [(0, 1), (2, 3)])
    lengths = [{"batch_size": 8, "len(dataset)": 100}, {"batch_size": 8, "len(dataset)": 99}]
    with pytest.raises(ValueError, match=r"len\(dataset\)"):
        check_same(lengths, [(0,), (1,)])
    check_same([{"batch_size": 8, "len(dataset)": 100}] * 3, [(0, 1, 2)])
    shards = [{"sampler": "autoloader's DistributedSampler", "batch_size": 8}, {"sampler": "yours"}]
    with pytest.raises(ValueError, match=r"disagree on sampler"):
        check_same(shards, [(0,), (1,)])


class BatchSamplerShard:
    """Accelerate's shard sampler as far as the check reads it: ``num_processes`` on an object iterating the
    sampler."""

    def __init__(self, sampler, num_processes):
        self.sampler, self.num_processes = sampler, num_processes

    def __iter__(self):
        return iter(list(self.sampler))


@pytest.fixture
def accelerate(monkeypatch):
    module = types.ModuleType("accelerate.data_loader")
    module.BatchSamplerShard = BatchSamplerShard
    monkeypatch.setitem(sys.modules, "accelerate.data_loader", module)
    return module


def test_sharding_sampler_shards_like_a_distributed_sampler():
    ranks = [list(ShardingSampler(range(10), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    assert ranks == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_sharding_sampler_refuses_accelerate_sharding_it_again(accelerate):
    sampler = ShardingSampler(range(8), num_replicas=2, rank=0, shuffle=False)
    with pytest.raises(RuntimeError, match=r"over 2 processes.*across 2 processes.*1/4 of the data"):
        list(BatchSamplerShard(sampler, num_processes=2))


def test_sharding_sampler_lets_one_process_and_other_iterators_through(accelerate):
    sampler = ShardingSampler(range(8), num_replicas=2, rank=1, shuffle=False)
    assert list(BatchSamplerShard(sampler, num_processes=1)) == [1, 3, 5, 7]
    assert list(sampler) == [1, 3, 5, 7]


def test_sharding_sampler_without_accelerate_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "accelerate.data_loader", raising=False)
    sampler = ShardingSampler(range(4), num_replicas=2, rank=0, shuffle=False)
    assert list(BatchSamplerShard(sampler, num_processes=2)) == [0, 2]
