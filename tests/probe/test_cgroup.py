"""cgroup v1/v2 parsing (autoloader.probe._cgroup) on the fixture trees in tests/fixtures/cgroup."""
from __future__ import annotations

import pytest

from autoloader.probe import _cgroup
from helpers import TESTS

FIXTURES = TESTS / "fixtures" / "cgroup"
G = 1 << 30
M = 1 << 20


def _case(name):
    root = FIXTURES / name
    return (root / "proc_cgroup").read_text(), root


@pytest.mark.parametrize("name, quota, limit, headroom", [
    ("v1", 1.5, 2 * G, 2 * G - (G - 512 * M)),        # co-mounted cpu,cpuacct; usage minus total_inactive_file
    ("v1_unlimited", None, None, None),                # this machine's layout: quota -1, limit 2**63-4096
    ("v1_container", 0.5, G, G),                       # own path missing: the walk reaches the mount root
    ("v2", 2.5, 4 * G, 4 * G - (G - 256 * M)),         # memory.high "max" ignored; usage minus inactive_file
    ("v2_nested", 0.5, G, 256 * M),                    # the parent's tighter limits bind the child
    ("v2_unlimited", None, None, None),
    ("garbage", None, None, None),
    ("missing", None, None, None),
])
def test_cgroup_fixtures(name, quota, limit, headroom):
    text, root = _case(name)
    assert _cgroup.cpu_quota(text, root) == quota
    assert _cgroup.memory_limit(text, root) == limit
    assert _cgroup.memory_headroom(text, root) == headroom


def test_cgroup_limit_at_or_above_physical_memory_is_no_limit():
    text, root = _case("v2")
    assert _cgroup.memory_limit(text, root, total_bytes=8 * G) == 4 * G
    assert _cgroup.memory_limit(text, root, total_bytes=4 * G) is None
    assert _cgroup.memory_headroom(text, root, total_bytes=4 * G) is None


def test_cgroup_garbage_proc_text_and_missing_root(tmp_path):
    for text in ("", "hello\n::\n1:2\n", "0::relative/path\n", "0::/../../escape\n"):
        assert _cgroup.cpu_quota(text, FIXTURES / "v2") is None
        assert _cgroup.memory_limit(text, FIXTURES / "v2") is None
    assert _cgroup.cpu_quota("0::/a\n1:cpu:/a", tmp_path / "absent") is None
    assert _cgroup.memory_headroom("4:memory:/a", tmp_path / "absent") is None


def test_cgroup_parse_functions():
    assert _cgroup.parse_cpu_max("max 100000\n") is None
    assert _cgroup.parse_cpu_max("150000 100000") == 1.5
    assert _cgroup.parse_cpu_max("50000") == 0.5              # period defaults to 100 ms
    for bad in ("", "banana", "0 100000", "-1 100000", "100 0", "1e5 1e5"):
        assert _cgroup.parse_cpu_max(bad) is None, bad
    assert _cgroup.parse_cfs("-1\n", "100000\n") is None
    assert _cgroup.parse_cfs("200000", "100000") == 2.0
    assert _cgroup.parse_cfs("x", "100000") is None
    assert _cgroup.parse_memory_value("max\n") is None
    assert _cgroup.parse_memory_value("9223372036854771712") is None
    assert _cgroup.parse_memory_value("1073741824\n") == G
    assert _cgroup.parse_memory_value("1073741824", total_bytes=G) is None
    for bad in ("", "-5", "0", "lots", "1.5G"):
        assert _cgroup.parse_memory_value(bad) is None, bad
    assert _cgroup.parse_memory_stat("cache 1\ntotal_inactive_file 42\n", "total_inactive_file") == 42
    assert _cgroup.parse_memory_stat("inactive_file x\n", "inactive_file") is None
    assert _cgroup.parse_proc_cgroup("4:cpu,cpuacct:/a/b\n0::/\nbad\n") == [(("cpu", "cpuacct"), "/a/b"), ((), "/")]


def test_cgroup_on_this_machine_does_not_raise():
    quota = _cgroup.cpu_quota()
    limit = _cgroup.memory_limit()
    assert quota is None or quota > 0
    assert limit is None or limit > 0
