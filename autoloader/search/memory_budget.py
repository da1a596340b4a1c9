"""THE memory budget a loader stays under (NOTE [ Memory budget ] in budget.py): ``resolve_budget`` decides it from
``memory_budget=`` and what the probe read of this process's memory, and nothing else does. Pure."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from .._text import mib
from ..probe.machine import MemoryInfo

__all__ = ["DEFAULT_FRACTION", "BudgetArg", "MemoryBudget", "resolve_budget"]

DEFAULT_FRACTION = 0.5
"""The share of this process's available memory (cgroup-aware, per local rank) the loader may take by default."""
BudgetArg = Union[None, int, float]


@dataclass(frozen=True)
class MemoryBudget:
    """The loader's memory budget: ``bytes`` (None: unknown, nothing is checked), the ``fraction`` of ``basis_bytes``
    it is (None for bytes the user gave), and ``source``: "user" (bytes given), "cgroup" (a fraction of the cgroup's
    headroom, the tighter), "available" (a fraction of the machine's available memory) or "unknown"."""

    bytes: Optional[int]
    fraction: Optional[float]
    source: str
    basis_bytes: Optional[int] = None
    user_fraction: bool = False

    def describe(self) -> str:
        if self.bytes is None:
            return "unknown (the memory available could not be read): nothing is checked"
        if self.source == "user":
            return f"{mib(self.bytes)} (memory_budget={self.bytes}, set by the user)"
        basis = "the cgroup's headroom (limit - used)" if self.source == "cgroup" else "the available memory"
        given = f"memory_budget={self.fraction:g}" if self.user_fraction else "the default"
        return f"{mib(self.bytes)} ({self.fraction:g} of {mib(self.basis_bytes or 0)}, {basis}; {given})"


def resolve_budget(memory_budget: BudgetArg, memory: MemoryInfo) -> MemoryBudget:
    """THE memory budget: ``memory_budget`` as checked by ``_validate.check_memory_budget`` (None, bytes as an int,
    or a fraction in (0, 1]) over the profile's ``memory`` (a ``MemoryInfo``: ``budget_bytes`` is what may still be
    allocated, already divided among local ranks; ``headroom_bytes`` says whether the cgroup is the tighter)."""
    if isinstance(memory_budget, int) and not isinstance(memory_budget, bool):
        return MemoryBudget(int(memory_budget), None, "user")
    fraction = DEFAULT_FRACTION if memory_budget is None else float(memory_budget)
    basis = memory.budget_bytes
    if basis is None:
        return MemoryBudget(None, fraction, "unknown", None, memory_budget is not None)
    headroom, available = memory.headroom_bytes, memory.available_bytes
    cgroup = headroom is not None and (available is None or headroom < available)
    return MemoryBudget(int(fraction * basis), fraction, "cgroup" if cgroup else "available", basis,
                        memory_budget is not None)
