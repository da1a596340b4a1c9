"""Many nodes (issue 27): the ranks of a node agree among themselves, unlike nodes decide for themselves, and each
node caches its own decision (NOTE [ One decision across ranks ] in autoloader/distributed.py).

The unit test checks the per-node cache facts in this process (the node layout is in test_nodes.py, the mismatch
error in test_sharding.py). The ``slow`` tests simulate two nodes on this host: two torchrun launches (``--nnodes=2``,
static rendezvous on localhost), two ranks each, node 1 made unlike node 0 by a per-sample wait (a slow network mount)
and ``taskset`` (one core). About 20-25 s per launch pair on 2 cores, 4 pairs: about 90 s in all, hence ``slow``
(deselect with ``-m "not slow"``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from autoloader.cache.slot import _node_facts

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "dist_nodes_script.py"
LAUNCH_TIMEOUT_S = 120
SAMPLES = 192
ONLINE_SAMPLES = 640
ONLINE_EPOCHS = 6


# ---------------------------------------------------------------- in this process

def test_cache_facts_tell_unlike_nodes_apart_and_identical_ones_not():
    def group(local, cpus):
        return SimpleNamespace(local_world_size=local, node_cpus=cpus)

    assert _node_facts(None) == {"world": None}
    assert _node_facts(group(1, 8)) == {"world": 1}, "one rank per node: the machine fingerprint has its CPUs"
    assert _node_facts(group(2, 2)) != _node_facts(group(2, 1)), "1 CPU per rank, out of 2 or out of 1"
    assert _node_facts(group(8, 64)) == _node_facts(group(8, 64)), "identical nodes share an entry"


# ---------------------------------------------------------------- two simulated nodes under torchrun

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(node: int, port: int, out_dir: Path, cache: Path, *extra: str) -> subprocess.Popen:
    """One node's torchrun; node 1 waits 20 ms per sample and runs on one core."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", NODE_SAMPLE_WAIT_S="0.02" if node == 1 else "0")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
               "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}", str(SCRIPT), str(out_dir),
               str(cache), *extra]
    if node == 1:
        command = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *command]
    return subprocess.Popen(command, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _launch(out_dir: Path, cache: Path, *extra: str) -> tuple:
    """Both nodes' launches, run together; their exit codes and outputs. A hang kills both and fails the test."""
    out_dir.mkdir()
    port = _free_port()
    procs = [_start(node, port, out_dir, cache, *extra) for node in (0, 1)]
    outputs, deadline = [], time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    if len(outputs) < 2:
        pytest.fail(f"the two nodes did not finish within {LAUNCH_TIMEOUT_S} s (a rank hung?):\n"
                    + "\n".join(o[-3000:] for o in outputs))
    return [p.returncode for p in procs], outputs


def _reports(out_dir: Path, codes: list, outputs: list) -> dict:
    """Each node's two rank reports, by node."""
    assert codes == [0, 0], f"a node failed ({codes}):\n" + "\n".join(o[-3000:] for o in outputs)
    reports = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(4)]
    nodes: dict = {}
    for report in reports:
        nodes.setdefault(report["node"], []).append(report)
    assert sorted(nodes) == [0, 1] and all(len(ranks) == 2 for ranks in nodes.values())
    return nodes


def _unlike_nodes_possible() -> None:
    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    if shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two unlike nodes need taskset and at least 2 cores")


@pytest.mark.slow
def test_two_nodes_decide_and_cache_for_themselves(tmp_path, cache_dir):
    _unlike_nodes_possible()
    nodes = _reports(tmp_path / "first", *_launch(tmp_path / "first", cache_dir))
    fast, slow = nodes[0], nodes[1]
    assert fast[0]["cpus"] >= 2 and slow[0]["cpus"] == 1, "node 1 runs on one core"
    for index, ranks in nodes.items():
        assert ranks[0]["result"] == ranks[1]["result"], f"node {index}'s ranks returned different results"
        assert ranks[0]["source"] == "tuned"
        assert ranks[0]["reason"].startswith(f"node {index} of 2 (host "), "loader.tuning says which node decided"
    assert slow[0]["num_workers"] > fast[0]["num_workers"], \
        f"the node waiting on reads must use more workers: {slow[0]['reason']} vs {fast[0]['reason']}"
    # No cross-node wait: the node that tunes faster returns from make_loader before the slow node is done.
    assert max(r["returned"] for r in fast) < min(r["returned"] for r in slow), [
        (r["node"], round(r["returned"] - r["started"], 2)) for r in fast + slow]

    everything = [i for ranks in nodes.values() for r in ranks for i in r["indices"]]
    assert sorted(everything) == list(range(SAMPLES)), "every sample once per epoch across the 4 ranks"

    entries = sorted(p for p in cache_dir.iterdir() if p.name != "machine.json")
    assert len(entries) == 2, f"one cache entry per unlike node, found {[p.name for p in entries]}"
    assert fast[0]["cache_key"] != slow[0]["cache_key"] and {p.stem for p in entries} == {
        fast[0]["cache_key"], slow[0]["cache_key"]}
    stored = {p.stem: json.loads(p.read_text())["result"]["config"]["num_workers"] for p in entries}
    assert stored == {fast[0]["cache_key"]: fast[0]["num_workers"], slow[0]["cache_key"]: slow[0]["num_workers"]}

    decisions = nodes[0][0]["node_decisions"] if nodes[0][0]["rank"] == 0 else nodes[0][1]["node_decisions"]
    assert [(d["node"], d["ranks"], d["num_workers"]) for d in decisions] == [
        (0, [0, 1], fast[0]["num_workers"]), (1, [2, 3], slow[0]["num_workers"])]

    again = _reports(tmp_path / "again", *_launch(tmp_path / "again", cache_dir))
    for index, ranks in again.items():
        assert [r["source"] for r in ranks] == ["cache", "cache"], f"node {index} tuned again"
        assert ranks[0]["num_workers"] == nodes[index][0]["num_workers"], f"node {index} read another node's entry"
    assert sorted(p for p in cache_dir.iterdir() if p.name != "machine.json") == entries


@pytest.mark.slow
def test_two_nodes_tune_online_each_in_its_own_lockstep(tmp_path, cache_dir):
    """Online: the two ranks of a node hold the same configuration at every batch; the nodes search and decide
    independently (the slow node with more workers); every epoch covers every sample once across the 4 ranks."""
    _unlike_nodes_possible()
    out = tmp_path / "online"
    nodes = _reports(out, *_launch(out, cache_dir, "--online", str(ONLINE_EPOCHS)))
    for index, (first, second) in nodes.items():
        assert first["decisions"], f"node {index} did not decide within {ONLINE_EPOCHS} epochs: {first['epochs']}"
        assert first["decisions"] == second["decisions"] and first["result"] == second["result"]
        assert first["reason"].startswith(f"node {index} of 2 (host ")
        for epoch, (a, b) in enumerate(zip(first["epochs"], second["epochs"])):
            assert a["configs"] == b["configs"], f"node {index}'s ranks held different configurations in {epoch}"
    assert nodes[1][0]["num_workers"] > nodes[0][0]["num_workers"], (nodes[0][0]["reason"], nodes[1][0]["reason"])
    for epoch in range(ONLINE_EPOCHS):
        seen = [i for ranks in nodes.values() for r in ranks for i in r["epochs"][epoch]["indices"]]
        assert sorted(seen) == list(range(ONLINE_SAMPLES)), f"epoch {epoch}: not every sample exactly once"
    rank0 = next(r for ranks in nodes.values() for r in ranks if r["rank"] == 0)
    assert [(d["node"], d["source"], d["num_workers"]) for d in rank0["node_decisions"]] == [
        (0, "online", nodes[0][0]["num_workers"]), (1, "online", nodes[1][0]["num_workers"])]


@pytest.mark.slow
def test_nodes_disagreeing_on_batch_size_fail_clearly(tmp_path, cache_dir):
    _unlike_nodes_possible()
    codes, outputs = _launch(tmp_path / "out", cache_dir, "--batch-size-node1", "16")
    assert codes[0] != 0 and codes[1] != 0, "every rank must fail, not only the node that differs"
    for output in outputs:
        assert "the ranks disagree on batch_size: 8 on ranks [0, 1] (nodes [0]); 16 on ranks [2, 3] (nodes [1])" \
            in output, output[-3000:]
