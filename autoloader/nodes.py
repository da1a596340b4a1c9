"""Which ranks share a node: each rank's node identity (the launcher's, else the host), the layout they make, this
rank's ``Node`` and the node's own process group (NOTE [ One decision across ranks ] in distributed.py).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist
from torch.distributed import ProcessGroup

NODE_VARIABLES = ("GROUP_RANK", "SLURM_NODEID")
"""What names a rank's node, in this order (torchrun's node rank, Slurm's node index); the hostname when a rank has
none of them."""

_SUBGROUPS: Dict[Tuple[int, Tuple[Tuple[int, ...], ...]], Tuple[Optional[ProcessGroup], List[ProcessGroup]]] = {}
"""The per-node process groups made for a layout, kept with the default group they belong to (reused while it
lives: ``make_loader`` may be called many times)."""


def local_world_size_from_env() -> Optional[int]:
    """Ranks on this node as the launcher says (torchrun's ``LOCAL_WORLD_SIZE``, Slurm's tasks per node)."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def node_from_env() -> Optional[str]:
    """This rank's node as the launcher names it (``"GROUP_RANK=1"``: the first of ``NODE_VARIABLES`` set), or None."""
    for name in NODE_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return f"{name}={value}"
    return None


def node_layout(identities: Sequence[Tuple[Optional[str], str]]) -> List[Tuple[int, ...]]:
    """The global ranks of each node, nodes ordered by their lowest rank, from every rank's (launcher's node, host):
    the launcher's when every rank has one, else the hostname (see NOTE [ One decision across ranks ])."""
    by_env = all(env is not None for env, _ in identities)
    nodes: Dict[str, List[int]] = {}
    for rank, (env, host) in enumerate(identities):
        nodes.setdefault(str(env) if by_env else host, []).append(rank)
    return [tuple(ranks) for ranks in nodes.values()]


@dataclasses.dataclass(frozen=True)
class Node:
    """This rank's node: ``index`` of ``count`` (ordered by lowest global rank), its global ``ranks`` (the first is
    the node leader) and the leader's ``host``."""

    index: int
    count: int
    ranks: Tuple[int, ...]
    host: str

    @property
    def label(self) -> str:
        return f"node {self.index} of {self.count} (host {self.host}, ranks {','.join(map(str, self.ranks))})"

    def labelled(self, reason: str) -> str:
        """``reason`` after this node's ``label`` (a node's label it starts with already is replaced)."""
        return f"{self.label}: {_LABEL.sub('', reason)}"


_LABEL = re.compile(r"^node \d+ of \d+ \(host [^)]*\): ")


def node_group(nodes: Sequence[Tuple[int, ...]], index: int) -> Optional[ProcessGroup]:
    """This node's process group: None (the default group) for a single node, and for nodes of one rank (which
    never talk); else a subgroup, made by every rank for every node in the same order, once per default group."""
    if len(nodes) == 1 or all(len(ranks) == 1 for ranks in nodes):
        return None
    world = dist.group.WORLD
    key = (id(world), tuple(nodes))
    held = _SUBGROUPS.get(key)
    if held is None or held[0] is not world:
        _SUBGROUPS.clear()  # another default group: its subgroups went with it
        held = (world, dist.new_subgroups_by_enumeration([list(ranks) for ranks in nodes])[1])
        _SUBGROUPS[key] = held
    return held[1][index]
