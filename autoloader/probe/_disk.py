"""Read throughput of the storage under a directory, measured past the page cache, bounded in time and size."""
from __future__ import annotations

import logging
import math
import mmap
import os
import random
import tempfile
import time
from dataclasses import dataclass
from typing import Literal, Optional, Tuple

logger = logging.getLogger("autoloader.probe")

MIB = 1 << 20
PAGE = 4096
MAX_RANDOM_READS = 20_000
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
# Shares of the time budget; a phase also stops at the overall deadline.
_SHARE = {"write": 0.35, "cached": 0.15, "seq": 0.3, "random": 0.2}

Bypass = Literal["o_direct", "fadvise"]


@dataclass(frozen=True)
class DiskInfo:
    """Read speed of the storage under ``path``; None = not measured or unknown.

    ``seq_read_mb_s`` (1 MB = 10**6 bytes, 1 MiB reads) and ``rand_read_iops`` (4 KiB reads) are measured with
    the page cache bypassed as ``bypass`` says; both are None when it could not be bypassed (``bypass`` None, e.g.
    a tmpfs, whose "disk" is RAM). ``cached_seq_read_mb_s`` is the same file read again through a warm page cache.
    """

    path: str
    seq_read_mb_s: Optional[float]
    rand_read_iops: Optional[float]
    cached_seq_read_mb_s: Optional[float]
    bypass: Optional[Bypass]


# NOTE [ Measuring disk reads past the page cache ]
# A file we just wrote sits in the page cache, so reading it back measures RAM, not the disk. We write a temporary
# file, fsync it (so its pages are clean), then read it:
#   1. O_DIRECT: reads go straight to the device. It needs the buffer, offset and length aligned to the logical
#      block size; an anonymous mmap is page aligned, offsets and lengths are multiples of 4 KiB. Some filesystems
#      refuse O_DIRECT with EINVAL (at open or at the first read).
#   2. Otherwise posix_fadvise(POSIX_FADV_DONTNEED) asks the kernel to drop the file's clean pages; it is repeated
#      before the random phase (the sequential pass reloaded them) together with POSIX_FADV_RANDOM (no readahead).
# Memory filesystems (tmpfs, ramfs) are the exception: their pages are the file, DONTNEED cannot evict them, and
# since Linux 6.6 tmpfs even accepts O_DIRECT, at RAM speed. We detect them from /proc/mounts and report no
# bypassed figures rather than RAM speed as disk speed. What the host does underneath (a VM's virtual disk cached
# by the hypervisor, a network filesystem's server cache) is invisible from here.


def filesystem_type(path: str, mounts_text: Optional[str] = None) -> Optional[str]:
    """The type (``ext4``, ``tmpfs``...) of the filesystem holding ``path``, from ``/proc/mounts``; None if unknown."""
    if mounts_text is None:
        try:
            with open("/proc/mounts", encoding="utf-8", errors="replace") as fh:
                mounts_text = fh.read()
        except OSError as exc:
            logger.debug("cannot read /proc/mounts: %s", exc)
            return None
    target = os.path.realpath(path)
    best, best_type = -1, None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # a later mount on the same point shadows an earlier one
            best, best_type = len(point), fields[2]
    return best_type


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash in paths as octal escapes (\\040...)."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def measure_disk(path: "str | os.PathLike[str]", *, seconds: float = 5.0, size_bytes: int = 64 * MIB,
                 block: int = MIB) -> DiskInfo:
    """Sequential read MB/s and random 4 KiB read IOPS of the storage under directory ``path``.

    Writes a temporary file of up to ``size_bytes`` there, reads it as NOTE [ Measuring disk reads past the page
    cache ] explains, and removes it, also on error or KeyboardInterrupt. Takes about ``seconds`` (phases stop
    early and report what they did). A missing or unwritable directory, or an I/O error, gives None figures.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0 or block % PAGE:
        raise ValueError(f"block must be a positive multiple of {PAGE} bytes, got {block!r}")
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < block:
        raise ValueError(f"size_bytes must be an int >= block ({block}), got {size_bytes!r}")
    path = os.fspath(path)
    unknown = DiskInfo(path, None, None, None, None)
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        logger.info("disk probe skipped: %s is not a writable directory", path)
        return unknown
    memory_fs = filesystem_type(path) in MEMORY_FILESYSTEMS
    start = time.monotonic()
    deadline = start + seconds
    name = None
    try:
        fd, name = tempfile.mkstemp(prefix=".autoloader-disk-probe-", dir=path)
        try:
            written = _write_file(fd, size_bytes, block, min(deadline, start + _SHARE["write"] * seconds))
            os.fsync(fd)
        finally:
            os.close(fd)
        if written == 0:
            logger.info("disk probe on %s wrote nothing within %.1f s", path, seconds)
            return unknown
        cached = _cached_read(name, written, block, _phase_end(deadline, "cached", seconds))
        if memory_fs:
            logger.info("disk probe: %s is a memory filesystem; its page cache cannot be bypassed", path)
            return DiskInfo(path, None, None, cached, None)
        bypass, seq, iops = _bypassed_reads(name, written, block, deadline, seconds)
        return DiskInfo(path, seq, iops, cached, bypass)
    except OSError as exc:
        logger.info("disk probe on %s failed: %s", path, exc)
        return unknown
    finally:
        if name is not None:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass


def _phase_end(deadline: float, phase: str, seconds: float) -> float:
    return min(deadline, time.monotonic() + _SHARE[phase] * seconds)


def _write_file(fd: int, size_bytes: int, block: int, until: float) -> int:
    """Write incompressible blocks until ``size_bytes`` or ``until``; returns the bytes written (whole blocks)."""
    data = os.urandom(block)
    written = 0
    while written + block <= size_bytes and (written == 0 or time.monotonic() < until):
        written += os.write(fd, data)
    return written - written % block


def _rate(amount: float, elapsed: float) -> Optional[float]:
    return amount / elapsed if amount > 0 and elapsed > 0 else None


def _read_pass(fd: int, buf: mmap.mmap, size: int, until: float) -> Tuple[int, float]:
    """Read ``fd`` from offset 0 in ``len(buf)`` chunks until ``size`` or ``until``; returns (bytes, seconds)."""
    done = 0
    t0 = time.monotonic()
    while done < size and time.monotonic() < until:
        n = os.preadv(fd, [buf], done)
        if n <= 0:
            break
        done += n
    return done, time.monotonic() - t0


def _random_reads(fd: int, size: int, until: float) -> Tuple[int, float]:
    """Aligned 4 KiB reads at distinct random offsets until ``until``; returns (reads, seconds)."""
    pages = random.sample(range(size // PAGE), min(size // PAGE, MAX_RANDOM_READS))
    buf = mmap.mmap(-1, PAGE)
    try:
        count = 0
        t0 = time.monotonic()
        for page in pages:
            if time.monotonic() >= until:
                break
            os.preadv(fd, [buf], page * PAGE)
            count += 1
        return count, time.monotonic() - t0
    finally:
        buf.close()


def _cached_read(name: str, size: int, block: int, until: float) -> Optional[float]:
    """MB/s of a sequential read through a warm page cache (one untimed pass warms it)."""
    buf = mmap.mmap(-1, block)
    fd = os.open(name, os.O_RDONLY)
    try:
        _read_pass(fd, buf, size, until)
        done, elapsed = _read_pass(fd, buf, size, until)
        rate = _rate(done, elapsed)
        return rate / 1e6 if rate is not None else None
    finally:
        os.close(fd)
        buf.close()


def _bypassed_reads(name: str, size: int, block: int, deadline: float,
                    seconds: float) -> Tuple[Optional[Bypass], Optional[float], Optional[float]]:
    """(bypass, seq MB/s, random IOPS) with the page cache bypassed; see NOTE [ Measuring disk reads past the page
    cache ]."""
    buf = mmap.mmap(-1, block)
    try:
        fd = _open_direct(name, buf)
        bypass: Bypass = "o_direct"
        if fd is None:
            if not hasattr(os, "posix_fadvise"):
                logger.info("disk probe: neither O_DIRECT nor posix_fadvise is available; figures unknown")
                return None, None, None
            fd = os.open(name, os.O_RDONLY)
            bypass = "fadvise"
        try:
            if bypass == "fadvise":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done, elapsed = _read_pass(fd, buf, size, _phase_end(deadline, "seq", seconds))
            seq = _rate(done, elapsed)
            if bypass == "fadvise":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            count, elapsed = _random_reads(fd, size, _phase_end(deadline, "random", seconds))
            return bypass, (seq / 1e6 if seq is not None else None), _rate(count, elapsed)
        finally:
            os.close(fd)
    finally:
        buf.close()


def _open_direct(name: str, buf: mmap.mmap) -> Optional[int]:
    """A descriptor reading ``name`` with O_DIRECT, or None where the platform or filesystem refuses it."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | flag)
    except OSError as exc:
        logger.debug("O_DIRECT open refused (%s); falling back to posix_fadvise", exc)
        return None
    try:
        os.preadv(fd, [buf], 0)
    except OSError as exc:
        os.close(fd)
        logger.debug("O_DIRECT read refused (%s); falling back to posix_fadvise", exc)
        return None
    return fd
