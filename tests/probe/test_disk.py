"""The disk probe (autoloader.probe._disk): uncached reads measured for real, cleanup, the filesystem type."""
from __future__ import annotations

import math
import os
import time

import pytest

from autoloader.probe import DiskInfo, _disk
from helpers import probe_files

M = 1 << 20


def test_disk_probe_on_a_real_disk(tmp_path):
    if _disk.filesystem_type(str(tmp_path)) in _disk.MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} is on a memory filesystem")
    start = time.monotonic()
    info = _disk.measure_disk(tmp_path, seconds=1.0)
    assert time.monotonic() - start < 5.0
    assert info.bypass in ("o_direct", "fadvise")
    for figure in (info.seq_read_mb_s, info.rand_read_iops, info.cached_seq_read_mb_s):
        assert figure is not None and 0 < figure < math.inf
    assert os.listdir(tmp_path) == []


def test_disk_probe_fadvise_fallback(tmp_path, monkeypatch):
    if _disk.filesystem_type(str(tmp_path)) in _disk.MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} is on a memory filesystem")
    monkeypatch.setattr(_disk, "_open_direct", lambda name, buf: None)
    info = _disk.measure_disk(tmp_path, seconds=0.5, size_bytes=8 * M)
    assert info.bypass == "fadvise"
    assert info.seq_read_mb_s > 0 and info.rand_read_iops > 0
    assert os.listdir(tmp_path) == []


def test_disk_probe_on_tmpfs_does_not_report_ram_as_disk():
    if not os.path.isdir("/dev/shm") or _disk.filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs /dev/shm")
    before = probe_files("/dev/shm")
    info = _disk.measure_disk("/dev/shm", seconds=0.5, size_bytes=8 * M)
    assert (info.bypass, info.seq_read_mb_s, info.rand_read_iops) == (None, None, None)
    assert info.cached_seq_read_mb_s is not None and info.cached_seq_read_mb_s > 0
    assert probe_files("/dev/shm") == before


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError(5, "Input/output error")])
@pytest.mark.parametrize("victim", ["_cached_read", "_random_reads"])
def test_disk_probe_cleans_up_when_interrupted(tmp_path, monkeypatch, error, victim):
    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(_disk, victim, boom)
    fds_before = len(os.listdir("/proc/self/fd"))
    if error is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            _disk.measure_disk(tmp_path, seconds=0.5, size_bytes=4 * M)
    else:
        assert _disk.measure_disk(tmp_path, seconds=0.5, size_bytes=4 * M) == DiskInfo(str(tmp_path), None, None,
                                                                                      None, None)
    assert os.listdir(tmp_path) == []
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_disk_probe_on_missing_or_non_directory_path(tmp_path):
    missing = tmp_path / "absent"
    assert _disk.measure_disk(missing, seconds=0.1) == DiskInfo(str(missing), None, None, None, None)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert _disk.measure_disk(a_file, seconds=0.1).seq_read_mb_s is None


@pytest.mark.parametrize("kwargs, name", [({"seconds": 0}, "seconds"), ({"seconds": math.nan}, "seconds"),
                                          ({"block": 1000}, "block"), ({"size_bytes": 4096}, "size_bytes")])
def test_disk_probe_rejects_bad_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        _disk.measure_disk(tmp_path, **kwargs)


def test_filesystem_type_from_mounts_text():
    mounts = ("/dev/vda / ext4 rw 0 0\n"
              "tmpfs /dev/shm tmpfs rw 0 0\n"
              "/dev/sdb /mnt/my\\040data xfs rw 0 0\n"
              "/dev/sdc /mnt/over ext4 rw 0 0\n"
              "tmpfs /mnt/over tmpfs rw 0 0\n"
              "garbage\n")
    assert _disk.filesystem_type("/", mounts) == "ext4"
    assert _disk.filesystem_type("/dev/shm", mounts) == "tmpfs"
    assert _disk.filesystem_type("/dev/shmem", mounts) == "ext4"     # a prefix of the name is not a parent
    assert _disk.filesystem_type("/mnt/my data/train", mounts) == "xfs"
    assert _disk.filesystem_type("/mnt/over/x", mounts) == "tmpfs"  # the later mount shadows the earlier
    assert _disk.filesystem_type("/x", "") is None
