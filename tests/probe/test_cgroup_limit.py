"""A real cgroup v2 memory limit, when this machine lets the test create one: a child process placed in a new cgroup
with ``memory.max`` probes its memory and gets a budget from the cgroup's headroom, not from the machine's available
memory. Skipped, with the exact reason, where no cgroup can be created (no cgroup v2 memory controller, no rights,
no systemd)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from autoloader.probe import _cgroup
from helpers import TESTS

LIMIT = 256 << 20
PROBE = """
import json, sys
sys.path.insert(0, {tests!r})
{enter}
from autoloader.probe import probe_machine
from autoloader.search.memory import resolve_budget
memory = probe_machine(disk=False, gpus=False).memory
budget = resolve_budget(None, memory)
print(json.dumps(dict(limit=memory.limit_bytes, headroom=memory.headroom_bytes, available=memory.available_bytes,
                      budget=budget.bytes, source=budget.source)))
"""
ENTER = "import os; open({procs!r}, 'w').write(str(os.getpid()))"


def _v2_parent() -> Tuple[Optional[Path], str]:
    """A cgroup v2 directory of this process whose children get the memory controller, or (None, why not)."""
    mounts = [fields[1] for fields in (line.split() for line in Path("/proc/mounts").read_text().splitlines())
              if len(fields) > 2 and fields[2] == "cgroup2"]
    if not mounts:
        return None, "no cgroup v2 filesystem is mounted (/proc/mounts lists no cgroup2)"
    own = [path for controllers, path in _cgroup.parse_proc_cgroup(_cgroup.read_proc_cgroup()) if not controllers]
    why: List[str] = []
    for mount in mounts:
        directory = Path(mount) / (own[0].lstrip("/") if own else "")
        try:
            controllers = (directory / "cgroup.controllers").read_text().split()
            enabled = (directory / "cgroup.subtree_control").read_text().split()
        except OSError as err:
            why.append(f"{directory}: {err}")
            continue
        if "memory" not in controllers:
            why.append(f"{directory}/cgroup.controllers is {' '.join(controllers) or 'empty'}: no memory controller "
                       f"(a hybrid cgroup v1/v2 layout keeps it on v1)")
            continue
        if "memory" not in enabled:  # enabling it would change this machine's cgroup setup: not a test's business
            why.append(f"{directory}/cgroup.subtree_control does not give children the memory controller")
            continue
        if not os.access(directory, os.W_OK):
            why.append(f"{directory} is not writable by uid {os.getuid()}")
            continue
        return directory, ""
    return None, "; ".join(why)


def _run_in_new_cgroup() -> Tuple[Optional[dict], str]:
    parent, why = _v2_parent()
    if parent is not None:
        child = parent / f"autoloader-test-{uuid.uuid4().hex[:8]}"
        try:
            child.mkdir()
        except OSError as err:
            return None, f"cannot create a cgroup under {parent}: {err}"
        try:
            (child / "memory.max").write_text(str(LIMIT))
            enter = ENTER.format(procs=str(child / "cgroup.procs"))
            return _probe_json([sys.executable, "-c", PROBE.format(tests=str(TESTS), enter=enter)])
        except OSError as err:
            return None, f"cannot limit or enter the cgroup {child}: {err}"
        finally:
            try:
                child.rmdir()
            except OSError:
                pass
    systemd_run = shutil.which("systemd-run")
    if systemd_run is None:
        return None, f"{why}; and no systemd-run to create a scope"
    command = [systemd_run, "--user", "--scope", "--quiet", "-p", f"MemoryMax={LIMIT}", sys.executable, "-c",
               PROBE.format(tests=str(TESTS), enter="")]
    data, error = _probe_json(command)
    if data is None:
        return None, f"{why}; and `systemd-run --user --scope -p MemoryMax=...` failed: {error}"
    return data, ""


def _probe_json(command: List[str]) -> Tuple[Optional[dict], str]:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              cwd=str(TESTS.parent), env={**os.environ, "PYTHONPATH": str(TESTS.parent)})
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    if proc.returncode != 0:
        return None, (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def test_a_real_cgroup_v2_memory_limit_sets_the_budget():
    data, why = _run_in_new_cgroup()
    if data is None:
        pytest.skip(f"cannot create a cgroup with a memory limit here: {why}")
    assert data["limit"] == LIMIT, data
    assert data["headroom"] is not None and 0 < data["headroom"] <= LIMIT, data
    assert data["source"] == "cgroup", data
    assert 0 < data["budget"] <= LIMIT // 2, data
