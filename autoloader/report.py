"""Readable text for what is not a record of its own: the machine profile and the cache listing (a tuning's text is
``TuneResult``'s: results/tune_result.py)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ._text import UNKNOWN, rate, when
from .cache.entry import CacheEntry
from .probe.machine import MachineProfile
from .results.tune_result import config_kwargs

_BYPASS_WORDS = {"o_direct": "page cache bypassed with O_DIRECT", "fadvise": "page cache dropped with fadvise"}


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return UNKNOWN
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _num(x: Optional[float], unit: str) -> str:
    return UNKNOWN if x is None else f"{x:,.0f} {unit}"


def _table(rows: List[Tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" if k else f"  {' ' * width}  {v}" for k, v in rows)


def format_profile(profile: MachineProfile) -> str:
    """The machine profile as a short aligned table, unknown figures spelled "unknown"."""
    cpu, mem, shm, disk = profile.cpu, profile.memory, profile.shm, profile.disk
    quota = "no cgroup quota" if cpu.quota is None else f"cgroup quota {cpu.quota:g} CPUs"
    rows = [
        ("CPUs usable", f"{cpu.usable if cpu.usable is not None else UNKNOWN} "
                        f"(affinity {cpu.affinity if cpu.affinity is not None else UNKNOWN}, {quota})"),
        ("CPUs", f"{cpu.logical if cpu.logical is not None else UNKNOWN} logical, "
                 f"{cpu.physical if cpu.physical is not None else UNKNOWN} physical; {cpu.model or 'model unknown'}"),
        ("memory", f"{_bytes(mem.total_bytes)} total, {_bytes(mem.available_bytes)} available, cgroup limit "
                   f"{'none' if mem.limit_bytes is None else _bytes(mem.limit_bytes)}"),
        ("memory budget", f"{_bytes(mem.budget_bytes)} may still be allocated (the smaller of the available memory "
                          f"and the cgroup's headroom); a loader's memory_budget is a share of it"),
        (shm.path, f"{_bytes(shm.total_bytes)} total, {_bytes(shm.free_bytes)} free"),
    ]
    if disk is None:
        rows.append(("disk", "not probed"))
    else:
        rows.append(("disk", disk.path))
        if disk.bypass is None:
            rows.append(("", "uncached reads unknown (page cache could not be bypassed, e.g. a memory filesystem)"))
        else:
            rows.append(("", f"{_num(disk.seq_read_mb_s, 'MB/s')} sequential, {_num(disk.rand_read_iops, 'IOPS')} "
                             f"random 4 KiB ({_BYPASS_WORDS.get(disk.bypass, disk.bypass)})"))
        rows.append(("", f"{_num(disk.cached_seq_read_mb_s, 'MB/s')} sequential from the page cache"))
    if profile.gpus is None:
        rows.append(("GPUs", "not probed or unknown"))
    elif not profile.gpus:
        rows.append(("GPUs", "none"))
    else:
        for i, gpu in enumerate(profile.gpus):
            rows.append(("GPUs" if i == 0 else "",
                         f"cuda:{gpu.index} {gpu.name}, {_bytes(gpu.total_bytes)}"))
    env = ", ".join(f"{k}={v}" for k, v in sorted(profile.thread_env.items())) or "none set"
    rows += [
        ("start method", profile.start_method or UNKNOWN),
        ("versions", f"python {profile.python_version}, torch {profile.torch_version}"),
        ("thread env", env),
    ]
    return "Machine profile\n" + _table(rows)


def _entry_lines(entry: CacheEntry) -> List[str]:
    if entry.result is None:
        return [f"  {entry.key}  INVALID: {entry.error}"]
    meta, result = entry.meta, entry.result
    dataset = str(meta.get("dataset", UNKNOWN))
    if meta.get("len") is not None:
        dataset += f" (len {meta['len']})"
    if meta.get("key"):
        dataset += f", key {meta['key']!r}"
    args = ", ".join(f"{name} {meta[field]}" for name, field in (
        ("batch", "batch_size"), ("step", "step"), ("device", "device"), ("shuffle", "shuffle")) if field in meta)
    return [f"  {entry.key}",
            f"    dataset  {dataset}" + (f"; {args}" if args else ""),
            f"    chosen   {config_kwargs(result)}",
            f"    rate     {rate(result.samples_per_s)} samples/s; bottleneck {result.bottleneck or UNKNOWN}",
            f"    tuned    {when(entry.created)} in {result.seconds:.1f} s ({len(result.trials)} trials)"]


def format_entries(entries: Sequence[CacheEntry], directory: object) -> str:
    """The cache listing ``autotune show`` prints; invalid entries with the reason they cannot be used."""
    bad = sum(1 for e in entries if e.result is None)
    head = f"Cached tunings in {directory}: {len(entries) - bad} usable" + (f", {bad} invalid" if bad else "")
    if not entries:
        return head + "\n  (none yet: `autotune tune MODULE:FACTORY` or make_loader() adds one)"
    lines = [head]
    for entry in entries:
        lines += _entry_lines(entry)
    return "\n".join(lines)
