"""torch.distributed awareness (autoloader.distributed): the group, sharding, per-rank budgets, one decision.

The unit tests use a 1-rank gloo group in this process; ``test_torchrun_*`` launches two real ranks with torchrun
(tests/dist_script.py) and checks that they agree, shard the data and share one cache entry.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from autoloader import make_loader
from autoloader.config import LoaderConfig
from autoloader.distributed import Group, Node, node_decisions
from autoloader.probe import probe_machine
from autoloader.results import TrialResult, TuneResult

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "dist_script.py"
LAUNCH_TIMEOUT_S = 120
GiB = 2**30


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def one_rank():
    """A 1-rank gloo default group for the duration of the test."""
    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


def _dataset(n: int = 40) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).reshape(n, 1))


# ---------------------------------------------------------------- Group.current without a process group

def test_current_false_is_none():
    assert Group.current(False) is None


def test_current_auto_is_none_when_not_initialised():
    assert not dist.is_initialized()
    assert Group.current(None) is None


def test_current_true_without_init_names_the_argument():
    with pytest.raises(ValueError, match="distributed"):
        Group.current(True)


def test_current_rejects_a_non_bool():
    with pytest.raises(TypeError, match="distributed"):
        Group.current("yes")


def test_make_loader_distributed_true_without_init_raises():
    with pytest.raises(ValueError, match="distributed=True"):
        make_loader(_dataset(), batch_size=4, distributed=True, cache=False)


# ---------------------------------------------------------------- a 1-rank group in this process

def test_current_with_a_group(one_rank, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    group = Group.current(None)
    assert group is not None and Group.current(True) is not None
    assert (group.rank, group.world_size, group.local_world_size, group.is_leader) == (0, 1, 1, True)
    assert "gloo" in group.backend
    assert Group.current(False) is None
    assert (group.node.index, group.node.count, group.node.ranks) == (0, 1, (0,))
    assert group.coordinator().size == 1, "a node of one rank agrees with itself, without a collective"


def test_node_from_the_launcher_else_the_host(one_rank, monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "3")
    assert Group.current(None).node.ranks == (0,)
    monkeypatch.delenv("GROUP_RANK")
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    assert Group.current(None).node.host == socket.gethostname()


def _profile(usable, logical, budget, shm):
    real = probe_machine(disk=False, gpus=False)
    return dataclasses.replace(
        real,
        cpu=dataclasses.replace(real.cpu, usable=usable, logical=logical),
        memory=dataclasses.replace(real.memory, budget_bytes=budget),
        shm=dataclasses.replace(real.shm, free_bytes=shm),
    )


@pytest.mark.parametrize("local, usable, budget, shm", [(2, 8, 8 * GiB, 4 * GiB), (4, 2, 8 * GiB, 4 * GiB),
                                                         (3, 8, 9 * GiB, 3 * GiB)])
def test_share_profile_divides_by_local_world_size(one_rank, monkeypatch, local, usable, budget, shm):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    group = Group.current(None)
    assert group.local_world_size == local
    shared = group.share_profile(_profile(usable, 16, budget, shm))
    assert shared.cpu.usable == max(1, usable // local)
    assert shared.memory.budget_bytes == budget // local
    assert shared.shm.free_bytes == shm // local
    assert shared.cpu.logical == 16, "facts other than the per-rank budgets are left alone"


def test_share_profile_unknowns(one_rank, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    shared = Group.current(None).share_profile(_profile(None, 6, None, None))
    assert shared.cpu.usable == 3, "unknown usable CPUs: the logical count (what the tuner would use) is divided"
    assert shared.memory.budget_bytes is None and shared.shm.free_bytes is None
    shared = Group.current(None).share_profile(_profile(None, None, None, None))
    assert shared.cpu.usable is None


def test_share_profile_one_rank_per_node_is_unchanged(one_rank, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    profile = _profile(8, 16, 8 * GiB, 4 * GiB)
    assert Group.current(None).share_profile(profile) == profile


def test_local_world_size_without_launcher_env_counts_ranks_on_this_host(one_rank, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert Group.current(None).local_world_size == 1
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    assert Group.current(None).local_world_size == 4


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_shard_uses_distributed_sampler(one_rank, shuffle, drop_last):
    dataset = _dataset()
    generator = torch.Generator().manual_seed(1234)
    kwargs, loader_shuffle = Group.current(None).shard(
        dataset, batch_size=4, shuffle=shuffle, drop_last=drop_last,
        loader_kwargs={"generator": generator, "drop_last": drop_last})
    sampler = kwargs["sampler"]
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.shuffle, sampler.drop_last, sampler.seed) == (shuffle, drop_last, 1234)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    assert loader_shuffle is False, "the sampler shuffles; the DataLoader must not"
    assert kwargs["generator"] is generator and kwargs["drop_last"] is drop_last


def test_shard_seed_defaults_to_zero(one_rank):
    kwargs, _ = Group.current(None).shard(_dataset(), batch_size=4, shuffle=True, drop_last=False, loader_kwargs={})
    assert kwargs["sampler"].seed == 0


@pytest.mark.parametrize("given", ["sampler", "batch_sampler", "iterable"])
def test_shard_leaves_the_users_choice_alone(one_rank, given):
    dataset = Stream() if given == "iterable" else _dataset()
    loader_kwargs = {"drop_last": False}
    if given == "sampler":
        loader_kwargs["sampler"] = SequentialSampler(dataset)
    elif given == "batch_sampler":
        loader_kwargs["batch_sampler"] = BatchSampler(RandomSampler(dataset), 4, False)
    kwargs, shuffle = Group.current(None).shard(dataset, batch_size=4, shuffle=False, drop_last=False,
                                                loader_kwargs=loader_kwargs)
    assert kwargs == loader_kwargs and shuffle is False
    assert all(kwargs[k] is v for k, v in loader_kwargs.items())


def test_broadcast_and_agreement_with_one_rank(one_rank):
    group = Group.current(None)
    result = TuneResult(LoaderConfig(2, 2, False, True), 1234.5, "cpu", "tuned",
                        trials=(TrialResult(LoaderConfig(0), samples_per_s=1000.0),
                                TrialResult(LoaderConfig(2, 2), samples_per_s=1234.5, worker_uss_bytes=5 * 2**20)),
                        consumer_samples_per_s=None, seconds=1.5, reason="test", created=1.0)
    assert group.broadcast(result) == result
    assert group.broadcast(None) is None
    assert group.coordinator().epoch(3.0, 0.25) == (3.0, 0.25), "a node of one rank agrees with itself"


def test_broadcast_says_which_node_decided(one_rank):
    group = Group.current(None)
    result = TuneResult(LoaderConfig(2, 2), 100.0, "cpu", "tuned", reason="fewest workers")
    assert group.broadcast(result).reason == "fewest workers", "a single node's reason is left alone"
    group.node = Node(1, 2, (0,), "gpu-07")
    labelled = group.broadcast(result)
    assert labelled.reason == "node 1 of 2 (host gpu-07, ranks 0): fewest workers"
    assert dataclasses.replace(labelled, reason=result.reason) == result
    group.node = Node(0, 2, (0,), "gpu-01")
    assert group.broadcast(labelled).reason == "node 0 of 2 (host gpu-01, ranks 0): fewest workers", \
        "a cached decision another node made is labelled with the node using it, once"


def test_node_decisions_with_one_rank(one_rank, caplog):
    loader = SimpleNamespace(tuning=TuneResult(LoaderConfig(3, 2), 50.0, "cpu", "online", reason="r"))
    with caplog.at_level("INFO", logger="autoloader.distributed"):
        found = node_decisions(loader)
    assert [(d["node"], d["ranks"], d["num_workers"], d["source"]) for d in found] == [(0, [0], 3, "online")]
    assert "workers=3" in caplog.text and "node 0" in caplog.text


def test_node_decisions_needs_a_group():
    with pytest.raises(ValueError, match="init_process_group"):
        node_decisions(SimpleNamespace(tuning=None))


def test_make_loader_in_a_group_shards_and_forwards_set_epoch(one_rank, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    dataset = _dataset()
    loader = make_loader(dataset, batch_size=4, shuffle=True, device="cpu", cache=False, budget=1, num_workers=0)
    sampler = loader.loader.sampler
    assert isinstance(sampler, DistributedSampler) and sampler.shuffle
    loader.set_epoch(3)
    assert sampler.epoch == 3
    assert sorted(int(x) for (batch,) in loader for x in batch.flatten()) == list(range(40))

    plain = make_loader(dataset, batch_size=4, shuffle=True, device="cpu", cache=False, budget=1, num_workers=0,
                        distributed=False)
    assert isinstance(plain.loader.sampler, RandomSampler)


# ---------------------------------------------------------------- two real ranks under torchrun

def _launch(out_dir: Path, cache: Path, *extra: str) -> list:
    """Run dist_script.py on 2 ranks; the ranks' reports, rank 0 first. A hang kills the launch and fails."""
    out_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
               str(out_dir), str(cache), *extra]
    proc = subprocess.Popen(command, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {LAUNCH_TIMEOUT_S} s (a rank hung?):\n{output[-4000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{output[-4000:]}"
    reports = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    return reports


def _cache_entries(cache: Path) -> list:
    return sorted(p for p in cache.iterdir() if p.name != "machine.json")


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")
def test_torchrun_two_ranks_agree_shard_and_share_the_cache(tmp_path, cache_dir):
    first = _launch(tmp_path / "first", cache_dir)
    rank0, rank1 = first
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["local_world_size"] == 2
    assert rank0["source"] == rank1["source"] == "tuned", json.loads(rank0["result"])["reason"]
    assert rank0["num_workers"] == rank1["num_workers"]
    assert rank0["result"] == rank1["result"], "every rank returns the same TuneResult"
    # The same search path on both ranks, with the same (agreed) figures: the tuner logs one line per trial.
    assert rank0["trials_run"], "trials must have run on every rank"
    assert rank0["trials_run"] == rank1["trials_run"]
    assert len(rank0["trials_run"]) == len(json.loads(rank0["result"])["trials"])

    for report in first:
        assert report["sampler"] == "ShardingSampler"  # a DistributedSampler
        assert report["sampler_epoch"] == 1, "set_epoch reaches the sampler"
        assert len(report["indices"]) == 100
    assert not set(rank0["indices"]) & set(rank1["indices"]), "the two ranks' samples overlap"
    assert sorted(rank0["indices"] + rank1["indices"]) == list(range(200))

    entries = _cache_entries(cache_dir)
    assert len(entries) == 1, f"exactly one cache entry expected, found {[p.name for p in entries]}"
    stored = json.loads(entries[0].read_text())["result"]
    assert stored["config"]["num_workers"] == rank0["num_workers"]
    assert dict(stored, source="tuned") == json.loads(rank0["result"])

    second = _launch(tmp_path / "second", cache_dir, "--explicit")
    for report in second:
        assert report["source"] == "cache"
        assert report["num_workers"] == rank0["num_workers"]
        assert report["trials_run"] == [], "a cache hit runs no trial on any rank"
        assert report["sampler"] == "ShardingSampler"
    assert second[0]["result"] == second[1]["result"]
    assert sorted(second[0]["indices"] + second[1]["indices"]) == list(range(200))
    assert _cache_entries(cache_dir) == entries


@pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")
def test_torchrun_two_ranks_tune_online_in_step(tmp_path, cache_dir):
    """Online tuning on 2 ranks: every rank holds the same configuration at every batch (they switch together), each
    epoch covers every sample exactly once across the ranks, and both reach the same decision."""
    rank0, rank1 = _launch(tmp_path / "online", cache_dir, "--online")
    assert rank0["decisions"] and rank0["decisions"] == rank1["decisions"]
    assert rank0["result"] == rank1["result"]
    assert len(rank0["epochs"]) == len(rank1["epochs"])
    for first, second in zip(rank0["epochs"], rank1["epochs"]):
        assert first["configs"] == second["configs"], "the ranks held different configurations at a batch"
        assert sorted(first["indices"] + second["indices"]) == list(range(400))
    served = {config for epoch in rank0["epochs"] for config in epoch["configs"]}
    assert len(served) > 1, f"candidates served the epochs: {[sorted(set(e['configs'])) for e in rank0['epochs']]}"
    assert rank0["epochs"][0]["indices"] != rank0["epochs"][1]["indices"], "a new order every epoch"
