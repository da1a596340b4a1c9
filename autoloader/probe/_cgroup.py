"""CPU and memory limits from Linux control groups (v1 and v2), read from files, never guessed.

Every function takes the text of ``/proc/self/cgroup`` and the cgroup mount root, so tests point them at fixture
trees. Missing files and garbage contents give ``None`` ("no limit found"), never an exception.
See NOTE [ Where a process's cgroup limits live ].
"""
from __future__ import annotations

import logging
import os
from pathlib import Path, PurePosixPath
from typing import Iterator, List, Optional, Tuple, Union

logger = logging.getLogger("autoloader.probe")

DEFAULT_ROOT = "/sys/fs/cgroup"
# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value (9223372036854771712); anything this
# large is no limit, whatever the page size.
UNLIMITED_AT = 1 << 60

PathLike = Union[str, "os.PathLike[str]"]

# NOTE [ Where a process's cgroup limits live ]
# /proc/self/cgroup has one line per hierarchy, "ID:CONTROLLERS:PATH":
#   v1: "4:memory:/docker/abc", "2:cpu,cpuacct:/docker/abc"  -> ROOT/memory/docker/abc, ROOT/cpu,cpuacct/docker/abc
#       (a controller may be mounted alone, ROOT/cpu, or co-mounted, ROOT/cpu,cpuacct; we accept any directory of
#       ROOT whose comma-separated name includes the controller)
#   v2: "0::/user.slice/job"                                 -> ROOT/user.slice/job (ROOT/unified/... when hybrid)
# A limit on any ancestor also binds this process, so we read the process's own directory and then every parent up
# to the hierarchy's root, and take the smallest limit. Walking up also covers containers that bind-mount their own
# cgroup at ROOT while /proc/self/cgroup still shows the host path (the own directory is then missing and the
# walk reaches ROOT, which is the container's cgroup). Paths containing ".." (a process outside the cgroup
# namespace) are not followed; only the hierarchy's root is read.


def read_proc_cgroup(path: PathLike = "/proc/self/cgroup") -> str:
    """The text of ``/proc/self/cgroup``, or "" where it cannot be read (not Linux, no procfs)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc)
        return ""


def parse_proc_cgroup(text: str) -> List[Tuple[Tuple[str, ...], str]]:
    """``[(controllers, path), ...]`` from ``/proc/self/cgroup`` text; the v2 line has ``controllers == ()``."""
    entries = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        controllers = tuple(c for c in parts[1].split(",") if c)
        entries.append((controllers, parts[2]))
    return entries


def parse_int(text: str) -> Optional[int]:
    """One integer from a cgroup file's text, or None for anything else."""
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_cpu_max(text: str) -> Optional[float]:
    """v2 ``cpu.max`` ("QUOTA PERIOD" in microseconds) as CPUs; "max ..." (unlimited) and garbage give None."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota = parse_int(parts[0])
    period = parse_int(parts[1]) if len(parts) > 1 else 100_000
    return _cpus(quota, period)


def parse_cfs(quota_text: str, period_text: str) -> Optional[float]:
    """v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` as CPUs; a quota of -1 (unlimited) and garbage give None."""
    return _cpus(parse_int(quota_text), parse_int(period_text))


def _cpus(quota: Optional[int], period: Optional[int]) -> Optional[float]:
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_memory_value(text: str, *, total_bytes: Optional[int] = None) -> Optional[int]:
    """A memory limit in bytes; "max", values >= 2**60 or >= ``total_bytes`` (no real limit) and garbage give None."""
    if text.strip() == "max":
        return None
    value = parse_int(text)
    if value is None or value <= 0 or value >= UNLIMITED_AT:
        return None
    if total_bytes is not None and value >= total_bytes:
        return None
    return value


def parse_memory_stat(text: str, key: str) -> Optional[int]:
    """The value of ``key`` in a cgroup's ``<cgroup>/memory.stat`` file ("key value" lines), or None."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return parse_int(parts[1])
    return None


def cgroup_dirs(proc_cgroup_text: str, root: PathLike, controller: str) -> Iterator[Tuple[int, Path]]:
    """``(version, directory)`` for each existing cgroup directory that can limit ``controller`` for this process.

    Own directory first, then each parent up to the hierarchy's root; v1 and v2 hierarchies both.
    """
    root = Path(root)
    for controllers, path in parse_proc_cgroup(proc_cgroup_text):
        if controllers == ():
            version, bases = 2, [root, root / "unified"]
        elif controller in controllers:
            version, bases = 1, _v1_bases(root, controller)
        else:
            continue
        parts = PurePosixPath(path).parts[1:]
        if ".." in parts:
            parts = ()
        for base in bases:
            for depth in range(len(parts), -1, -1):
                directory = base.joinpath(*parts[:depth])
                if directory.is_dir():
                    yield version, directory


def _v1_bases(root: Path, controller: str) -> List[Path]:
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [root / name for name in names if controller in name.split(",")]


def _read(directory: Path, name: str) -> Optional[str]:
    try:
        return (directory / name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpu_quota(proc_cgroup_text: Optional[str] = None, root: PathLike = DEFAULT_ROOT) -> Optional[float]:
    """The tightest cgroup CPU quota on this process, in CPUs (1.5 = one and a half cores); None = no quota found."""
    if proc_cgroup_text is None:
        proc_cgroup_text = read_proc_cgroup()
    quotas = []
    for version, directory in cgroup_dirs(proc_cgroup_text, root, "cpu"):
        if version == 2:
            text = _read(directory, "cpu.max")
            quota = parse_cpu_max(text) if text is not None else None
        else:
            quota_text, period_text = _read(directory, "cpu.cfs_quota_us"), _read(directory, "cpu.cfs_period_us")
            quota = parse_cfs(quota_text, period_text) if quota_text and period_text else None
        if quota is not None:
            quotas.append(quota)
    return min(quotas) if quotas else None


def _memory_levels(proc_cgroup_text: Optional[str], root: PathLike,
                   total_bytes: Optional[int]) -> Iterator[Tuple[int, int, Path]]:
    """``(version, limit, directory)`` for each cgroup level that sets a real memory limit."""
    if proc_cgroup_text is None:
        proc_cgroup_text = read_proc_cgroup()
    for version, directory in cgroup_dirs(proc_cgroup_text, root, "memory"):
        names = ("memory.max", "memory.high") if version == 2 else ("memory.limit_in_bytes",)
        limits = []
        for name in names:
            text = _read(directory, name)
            value = parse_memory_value(text, total_bytes=total_bytes) if text is not None else None
            if value is not None:
                limits.append(value)
        if limits:
            yield version, min(limits), directory


def memory_limit(proc_cgroup_text: Optional[str] = None, root: PathLike = DEFAULT_ROOT, *,
                 total_bytes: Optional[int] = None) -> Optional[int]:
    """The tightest cgroup memory limit on this process in bytes; None = no limit found.

    v2: the smaller of the files ``<cgroup>/memory.max`` and ``<cgroup>/memory.high`` (the kernel throttles and
    reclaims hard above ``high``); v1: ``<cgroup>/memory.limit_in_bytes``. A limit at or above ``total_bytes``
    (physical memory) is no limit.
    """
    limits = [limit for _, limit, _ in _memory_levels(proc_cgroup_text, root, total_bytes)]
    return min(limits) if limits else None


def memory_headroom(proc_cgroup_text: Optional[str] = None, root: PathLike = DEFAULT_ROOT, *,
                    total_bytes: Optional[int] = None) -> Optional[int]:
    """Bytes the cgroup can still grow before its tightest limit; None = no limit found.

    Per limited level: limit minus the working set (usage minus inactive file cache, which the kernel reclaims
    before it would kill anything, as ``docker stats`` computes it); the limit itself where usage is unreadable.
    """
    headrooms = []
    for version, limit, directory in _memory_levels(proc_cgroup_text, root, total_bytes):
        usage_file, stat_key = ("memory.current", "inactive_file") if version == 2 else (
            "memory.usage_in_bytes", "total_inactive_file")
        usage_text = _read(directory, usage_file)
        usage = parse_int(usage_text) if usage_text is not None else None
        if usage is None or usage < 0:
            headrooms.append(limit)
            continue
        stat_text = _read(directory, "memory.stat")
        inactive = parse_memory_stat(stat_text, stat_key) if stat_text is not None else None
        if inactive is not None and 0 <= inactive <= usage:
            usage -= inactive
        headrooms.append(max(0, limit - usage))
    return min(headrooms) if headrooms else None
