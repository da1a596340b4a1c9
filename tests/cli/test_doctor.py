"""``autotune doctor``: one run on this machine, and each check fed with fakes."""
from __future__ import annotations

import json
from dataclasses import replace
import os
from pathlib import Path

import autoloader.cli.main as cli
from autoloader.cache import CacheEntry
from autoloader.cli.doctor import (ShmNeed, check_cache, check_cpus, check_open_files, check_saved_profile, check_shm,
                                   check_memory_budget, check_native_pools, check_start_method, check_thread_env,
                                   shm_needs)
from autoloader.cli.findings import format_findings
from autoloader.probe import CpuInfo, MemoryInfo, ShmInfo, probe_machine
from autoloader.probe._pools import NativePool
from helpers import MIB, run_cli, tuned_result


def test_doctor_runs_here(work):
    proc = run_cli(["doctor", "--json"], work)
    findings = json.loads(proc.stdout)["findings"]
    names = {f["name"] for f in findings}
    assert {"shared memory", "memory budget", "open files", "usable CPUs", "start method", "thread variables", "GPUs",
            "GPU device holders", "machine profile", "cache", "native thread pools"} <= names
    pools = next(f for f in findings if f["name"] == "native thread pools")
    assert pools["status"] == "ok" and "(blas)" in pools["detail"], pools   # threadpoolctl: a dependency
    budget = next(f for f in findings if f["name"] == "memory budget")
    assert budget["status"] in ("ok", "info") and "memory_budget=" in budget["detail"] + budget["fix"]
    assert all(f["status"] in ("ok", "warn", "fail", "info") and f["detail"] for f in findings)
    assert proc.returncode == (1 if any(f["status"] == "fail" for f in findings) else 0)
    holders = next(f for f in findings if f["name"] == "GPU device holders")
    if not any(p.startswith("nvidia") for p in os.listdir("/dev")):
        assert holders["status"] == "info" and "no NVIDIA device files" in holders["detail"]
    code = cli.main(["doctor"])
    assert code == proc.returncode


# ---------------------------------------------------------------- doctor checks, with fakes


def entry(result, key="c" * 32, meta=None):
    return CacheEntry(key, Path("/x"), 1.0, meta or {"dataset": "Fake"}, result, None if result else "corrupt")


def test_shm_check_against_cached_needs():
    needs = shm_needs([entry(tuned_result())])              # (2 workers x prefetch 2 + 2) x 1 MiB batches
    assert [n.need_bytes for n in needs] == [6 * MIB] and "Fake" in needs[0].label
    serial = tuned_result(num_workers=0, prefetch_factor=None, persistent_workers=False)
    assert shm_needs([entry(serial), entry(None)]) == []
    shm = ShmInfo("/dev/shm", 64 * MIB, 60 * MIB)
    assert check_shm(shm, [ShmNeed("big", 100 * MIB)]).status == "fail"
    warn = check_shm(shm, [ShmNeed("half", 40 * MIB)])
    assert warn.status == "warn" and "--shm-size" in warn.fix
    assert check_shm(shm, [ShmNeed("small", MIB)]).status == "ok"
    assert check_shm(shm, []).status == "warn"                              # Docker's 64 MiB default
    assert check_shm(ShmInfo("/dev/shm", 8 << 30, 8 << 30), []).status == "ok"
    assert check_shm(ShmInfo("/dev/shm", None, None), []).status == "info"


def test_open_files_check():
    low = check_open_files(1024, 1048576, sharing_strategy="file_descriptor", max_cached_workers=16)
    assert low.status == "warn" and "ulimit -n 65536" in low.fix and "set_sharing_strategy('file_system')" in low.fix
    assert "16 workers" in low.detail
    assert "ulimit -n 4096" in check_open_files(1024, 4096, sharing_strategy="file_descriptor").fix
    stuck = check_open_files(1024, 1024, sharing_strategy="file_descriptor", max_cached_workers=1)
    assert "raise the hard limit (1024)" in stuck.fix and "uses 1 workers" not in stuck.detail
    assert check_open_files(1024, 4096, sharing_strategy="file_system").status == "ok"
    assert check_open_files(65536, 65536, sharing_strategy="file_descriptor").status == "ok"
    unlimited = check_open_files(None, None, sharing_strategy="file_descriptor")
    assert unlimited.status == "ok" and "unlimited" in unlimited.detail


def test_cpu_quota_check():
    quota = check_cpus(CpuInfo(usable=4, logical=64, physical=32, model="x", affinity=64, quota=4.0))
    assert quota.status == "warn" and "os.cpu_count() says 64 but this process may use 4" in quota.detail
    assert "cgroup CPU quota 4" in quota.detail
    assert check_cpus(CpuInfo(usable=8, logical=8, physical=4, model="x", affinity=8, quota=None)).status == "ok"
    assert check_cpus(CpuInfo(None, None, None, None, None, None)).status == "info"


def test_start_method_and_thread_checks():
    spawn = check_start_method("spawn")
    assert spawn.status == "info" and '__name__ == "__main__"' in spawn.fix and "pickl" in spawn.detail
    assert check_start_method("fork").status == "ok"
    assert check_thread_env({}, usable_cpus=16).status == "warn"
    assert check_thread_env({}, usable_cpus=2).status == "info"
    assert check_thread_env({"OMP_NUM_THREADS": "1"}, usable_cpus=16).status == "ok"
    assert check_thread_env({"OMP_NUM_THREADS": "64"}, usable_cpus=8).status == "warn"


def test_native_pools_check_shows_the_pools_and_each_cached_choice():
    pools = [NativePool("libscipy_openblas", "blas", "openblas", 16), NativePool("libgomp", "openmp", "openmp", 16)]
    worker = (NativePool("libscipy_openblas", "blas", "openblas", 16, 7),)
    measured = tuned_result().trials[1]
    measured = replace(measured, native_pools=worker, config=replace(measured.config, native_threads=7))
    limited = tuned_result(native_threads=7, trials=(measured,))
    finding = check_native_pools(pools, usable_cpus=16, cached=[entry(limited), entry(None)])
    assert finding.status == "ok" and "libscipy_openblas (blas) 16, libgomp (openmp) 16" in finding.detail
    assert "max(1, (16 usable CPUs - 1) // workers)" in finding.detail and "native_threads=" in finding.detail
    assert "cached Fake workers=2 prefetch=2 native=7: libscipy_openblas (blas) 16 -> 7" in finding.detail
    missing = check_native_pools(None, usable_cpus=16)
    assert missing.status == "warn" and "threadpoolctl is not installed" in missing.detail
    assert "OpenCV" in missing.detail and "pip install threadpoolctl" in missing.fix
    assert check_native_pools(None, usable_cpus=1).status == "info"
    assert "fix" not in format_findings([check_native_pools([], usable_cpus=2)]) and \
        "none loaded" in check_native_pools([], usable_cpus=2).detail


def test_profile_and_cache_checks():
    current = probe_machine(disk=False, gpus=False)
    assert check_saved_profile(None, current).status == "info"
    assert check_saved_profile(current, current).status == "ok"
    from dataclasses import replace

    old = check_saved_profile(replace(current, torch_version="1.0"), current)
    assert old.status == "warn" and "torch 1.0 ->" in old.detail
    bad = check_cache([entry(None), entry(tuned_result(), key="d" * 32)])
    assert bad.status == "warn" and "1 of 2" in bad.detail and "autotune clear" in bad.fix
    text = format_findings([bad, old])
    assert "[warn] cache:" in text and "fix: `autotune clear" in text


# ---------------------------------------------------------------- GPU device holders, on fake /proc trees

def test_memory_budget_check_shows_bytes_fraction_and_source():
    G = 2**30
    free = MemoryInfo(total_bytes=16 * G, available_bytes=10 * G, limit_bytes=None, budget_bytes=10 * G)
    found = check_memory_budget(free)
    assert found.status == "ok" and found.name == "memory budget"
    for words in ("5,120 MiB", "5,368,709,120 bytes", "0.5 of the 10,240 MiB", "source: available", "memory_budget="):
        assert words in found.detail, found.detail
    boxed = MemoryInfo(total_bytes=16 * G, available_bytes=10 * G, limit_bytes=4 * G, budget_bytes=3 * G,
                       headroom_bytes=3 * G)
    found = check_memory_budget(boxed, memory_budget=0.25)
    assert "768 MiB" in found.detail and "0.25 of the 3,072 MiB" in found.detail and "source: cgroup" in found.detail
    found = check_memory_budget(boxed, memory_budget=2 * G)
    assert "2,048 MiB" in found.detail and "source: user" in found.detail
    unknown = check_memory_budget(MemoryInfo(None, None, None, None))
    assert unknown.status == "info" and "memory_budget=" in unknown.fix
    assert "memory budget" in format_findings([found])
