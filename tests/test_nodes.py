"""Which ranks share a node (autoloader.nodes): the identity the launcher gives a rank, the layout every rank's
identity makes, a node's label, and the node's process group where no subgroup is needed."""
from __future__ import annotations

import pytest

from autoloader.nodes import NODE_VARIABLES, Node, local_world_size_from_env, node_from_env, node_group, node_layout


@pytest.fixture
def no_launcher(monkeypatch):
    for name in NODE_VARIABLES + ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_node_from_env_takes_torchrun_before_slurm_and_ignores_blanks(no_launcher):
    assert node_from_env() is None
    no_launcher.setenv("SLURM_NODEID", "5")
    assert node_from_env() == "SLURM_NODEID=5"
    no_launcher.setenv("GROUP_RANK", " 2 ")
    assert node_from_env() == "GROUP_RANK=2"
    no_launcher.setenv("GROUP_RANK", "  ")
    assert node_from_env() == "SLURM_NODEID=5"


@pytest.mark.parametrize("torchrun, slurm, expected", [
    (None, None, None), ("4", None, 4), (None, "3", 3), ("4", "3", 4), ("0", "3", 3), ("two", None, None),
    ("-2", None, None), (" 8 ", None, 8)])
def test_local_world_size_from_env_takes_a_positive_count(no_launcher, torchrun, slurm, expected):
    for name, value in (("LOCAL_WORLD_SIZE", torchrun), ("SLURM_NTASKS_PER_NODE", slurm)):
        if value is not None:
            no_launcher.setenv(name, value)
    assert local_world_size_from_env() == expected


def test_layout_follows_the_launcher_when_every_rank_names_its_node():
    same_host = [("GROUP_RANK=0", "h"), ("GROUP_RANK=0", "h"), ("GROUP_RANK=1", "h"), ("GROUP_RANK=1", "h")]
    assert node_layout(same_host) == [(0, 1), (2, 3)], "two launches on one host are two nodes"
    interleaved = [("GROUP_RANK=1", "b"), ("GROUP_RANK=0", "a"), ("GROUP_RANK=1", "b"), ("GROUP_RANK=0", "a")]
    assert node_layout(interleaved) == [(0, 2), (1, 3)], "nodes ordered by their lowest global rank"


def test_layout_falls_back_to_hostnames():
    assert node_layout([(None, "a"), (None, "b"), (None, "a")]) == [(0, 2), (1,)]
    mixed = [("GROUP_RANK=0", "a"), (None, "a"), ("GROUP_RANK=1", "b")]
    assert node_layout(mixed) == [(0, 1), (2,)], "a launcher variable on only some ranks is not trusted"
    assert node_layout([(None, "a")]) == [(0,)]


def test_node_label():
    node = Node(1, 2, (2, 3), "gpu-07")
    assert node.label == "node 1 of 2 (host gpu-07, ranks 2,3)"


def test_labelled_puts_the_node_first_once():
    node = Node(0, 2, (0, 1), "a")
    assert node.labelled("fewest workers") == "node 0 of 2 (host a, ranks 0,1): fewest workers"
    other = Node(1, 2, (2, 3), "b").labelled("fewest workers")
    assert node.labelled(other) == node.labelled("fewest workers"), "another node's label is replaced, not stacked"
    assert node.labelled("") == "node 0 of 2 (host a, ranks 0,1): "


def test_node_group_is_the_default_group_when_no_node_has_two_ranks():
    assert node_group([(0, 1, 2)], 0) is None, "a single node talks in the default group"
    assert node_group([(0,), (1,), (2,)], 1) is None, "nodes of one rank never talk"
