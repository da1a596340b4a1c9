"""THE memory budget (NOTE [ Memory budget ] in search/memory.py): ``memory_budget=`` over
what the probe read of this process's memory, on a table. No process, no clock."""
import pytest

from autoloader.probe import MemoryInfo
from autoloader.search import memory

MIB, GIB = 2**20, 2**30


def memory_info(available, budget_bytes, headroom=None):
    return MemoryInfo(total_bytes=32 * GIB, available_bytes=available, limit_bytes=None if headroom is None else
                      8 * GIB, budget_bytes=budget_bytes, headroom_bytes=headroom)


@pytest.mark.parametrize("arg, mem, expected", [
    # the default: half of what may still be allocated, the machine's available memory ...
    (None, memory_info(10 * GIB, 10 * GIB), (5 * GIB, 0.5, "available")),
    # ... or the cgroup's headroom when it is tighter
    (None, memory_info(10 * GIB, 4 * GIB, headroom=4 * GIB), (2 * GIB, 0.5, "cgroup")),
    # a cgroup limit far above what is available: the machine decides
    (None, memory_info(3 * GIB, 3 * GIB, headroom=6 * GIB), (int(1.5 * GIB), 0.5, "available")),
    # divided among local ranks already (share_profile halves budget_bytes, not available/headroom)
    (None, memory_info(10 * GIB, 5 * GIB), (int(2.5 * GIB), 0.5, "available")),
    # a fraction of the user's
    (0.25, memory_info(8 * GIB, 8 * GIB), (2 * GIB, 0.25, "available")),
    (1.0, memory_info(8 * GIB, 2 * GIB, headroom=2 * GIB), (2 * GIB, 1.0, "cgroup")),
    # bytes, as given
    (3 * GIB, memory_info(8 * GIB, 8 * GIB), (3 * GIB, None, "user")),
    (123, memory_info(None, None), (123, None, "user")),
    # nothing known: no budget
    (None, memory_info(None, None), (None, 0.5, "unknown")),
])
def test_resolve_budget(arg, mem, expected):
    got = memory.resolve_budget(arg, mem)
    assert (got.bytes, got.fraction, got.source) == expected
    assert got.describe()


@pytest.mark.parametrize("arg, expected, why", [
    (3 * GIB, "3,072 MiB (memory_budget=3221225472, set by the user)", "bytes: the user's, as given"),
    (None, "2,048 MiB (0.5 of 4,096 MiB, the cgroup's headroom (limit - used); the default)",
     "the default share of the cgroup's headroom, the tighter"),
    (0.25, "1,024 MiB (0.25 of 4,096 MiB, the cgroup's headroom (limit - used); memory_budget=0.25)",
     "the user's fraction names the argument"),
])
def test_the_budget_says_where_it_came_from(arg, expected, why):
    cgroup = memory_info(10 * GIB, 4 * GIB, headroom=4 * GIB)
    assert memory.resolve_budget(arg, cgroup).describe() == expected, why
    assert "nothing is checked" in memory.resolve_budget(None, memory_info(None, None)).describe()
