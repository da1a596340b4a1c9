"""The text autoloader prints for what is not a record (autoloader.report): a machine profile, the cache listing."""
from __future__ import annotations

from pathlib import Path

from autoloader.cache.entry import CacheEntry
from autoloader.probe import DiskInfo, MachineProfile, probe_machine
from autoloader.report import format_entries, format_profile
from helpers import full_profile, tuned_result


def test_format_profile_shows_facts_and_unknowns():
    text = format_profile(full_profile())
    for fragment in ("usable", "3", "cgroup quota 2.5", "Test CPU", "8.0 GiB", "640 MB/s", "12,000 IOPS",
                     "O_DIRECT", "cuda:1 Fake GPU", "OMP_NUM_THREADS=1", "spawn"):
        assert fragment in text, fragment
    assert "unknown" in text                                     # shm free_bytes is None
    bare = probe_machine(disk=False, gpus=False)
    bare_text = format_profile(MachineProfile(**{**bare.__dict__, "disk": DiskInfo("/dev/shm", None, None, 5e3,
                                                                                    None)}))
    assert "could not be bypassed" in bare_text and "GPUs" in bare_text


def test_format_entries_lists_usable_and_invalid_entries():
    good = CacheEntry("abc123", Path("/c/abc123.json"), 0.0, {"dataset": "Images", "len": 500, "batch_size": 32},
                      tuned_result(), None)
    bad = CacheEntry("dead01", Path("/c/dead01.json"), None, {}, None, "its result is malformed")
    text = format_entries([good, bad], "/c")
    assert text.splitlines()[0] == "Cached tunings in /c: 1 usable, 1 invalid"
    assert "dataset  Images (len 500); batch 32" in text and "dead01  INVALID: its result is malformed" in text
    assert "chosen   num_workers=" in text and "samples/s; bottleneck cpu" in text
    assert "(none yet" in format_entries([], "/c") and "0 usable" in format_entries([], "/c")
