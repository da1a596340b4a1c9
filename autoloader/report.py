"""Readable text for autoloader's records: the machine profile, tuning results, cache entries, doctor findings.

The records are read by their attributes, never imported (``results`` formats itself with this module, and the
module imports no other of autoloader's): ``TuneResult``, ``TrialResult``, ``CacheEntry`` and ``MachineProfile``
below are protocols, what this module reads of the records of those names, so mypy checks every record passed in.
"""
from __future__ import annotations

import time
from typing import Any, List, Mapping, Optional, Protocol, Sequence, Tuple


class _Config(Protocol):
    """What this module reads of a ``config.LoaderConfig``."""

    @property
    def num_workers(self) -> int: ...
    @property
    def prefetch_factor(self) -> Optional[int]: ...
    @property
    def pin_memory(self) -> bool: ...
    @property
    def threads(self) -> int: ...
    @property
    def native_threads(self) -> Optional[int]: ...
    def loader_kwargs(self) -> dict: ...
    def same_candidate(self, other: Any) -> bool: ...


class _Pool(Protocol):
    """What this module reads of a ``probe._pools.NativePool``."""

    def label(self) -> str: ...


class TrialResult(Protocol):
    """What this module reads of a ``results.TrialResult``."""

    @property
    def config(self) -> _Config: ...
    @property
    def ok(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def reason(self) -> Optional[str]: ...
    @property
    def samples_per_s(self) -> Optional[float]: ...
    @property
    def steady(self) -> bool: ...
    @property
    def startup_s(self) -> Optional[float]: ...
    @property
    def stall_fraction(self) -> Optional[float]: ...
    @property
    def worker_cpu_util(self) -> Optional[float]: ...
    @property
    def worker_memory_bytes(self) -> Optional[int]: ...
    @property
    def footprint_bytes(self) -> Optional[int]: ...
    @property
    def native_limit_held(self) -> Optional[bool]: ...


class TuneResult(Protocol):
    """What this module reads of a ``results.TuneResult``."""

    @property
    def config(self) -> _Config: ...
    @property
    def trials(self) -> Sequence[TrialResult]: ...
    @property
    def samples_per_s(self) -> Optional[float]: ...
    @property
    def bottleneck(self) -> Optional[str]: ...
    @property
    def source(self) -> str: ...
    @property
    def consumer_samples_per_s(self) -> Optional[float]: ...
    @property
    def seconds(self) -> float: ...
    @property
    def reason(self) -> str: ...
    @property
    def created(self) -> Optional[float]: ...
    @property
    def disk_ceiling_samples_per_s(self) -> Optional[float]: ...
    @property
    def read_bytes_per_sample(self) -> Optional[float]: ...
    @property
    def memory_budget_bytes(self) -> Optional[int]: ...
    @property
    def memory_budget_from(self) -> Optional[str]: ...
    @property
    def native_pools(self) -> Optional[Sequence[_Pool]]: ...
    @property
    def native_limit_held(self) -> Optional[bool]: ...


class CacheEntry(Protocol):
    """What this module reads of a ``cache.store.CacheEntry``."""

    @property
    def key(self) -> str: ...
    @property
    def created(self) -> Optional[float]: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...
    @property
    def result(self) -> Optional[TuneResult]: ...
    @property
    def error(self) -> Optional[str]: ...


class _Cpu(Protocol):
    @property
    def usable(self) -> Optional[int]: ...
    @property
    def logical(self) -> Optional[int]: ...
    @property
    def physical(self) -> Optional[int]: ...
    @property
    def model(self) -> Optional[str]: ...
    @property
    def affinity(self) -> Optional[int]: ...
    @property
    def quota(self) -> Optional[float]: ...


class _Memory(Protocol):
    @property
    def total_bytes(self) -> Optional[int]: ...
    @property
    def available_bytes(self) -> Optional[int]: ...
    @property
    def limit_bytes(self) -> Optional[int]: ...
    @property
    def budget_bytes(self) -> Optional[int]: ...


class _Shm(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def total_bytes(self) -> Optional[int]: ...
    @property
    def free_bytes(self) -> Optional[int]: ...


class _Disk(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def seq_read_mb_s(self) -> Optional[float]: ...
    @property
    def rand_read_iops(self) -> Optional[float]: ...
    @property
    def cached_seq_read_mb_s(self) -> Optional[float]: ...
    @property
    def bypass(self) -> Optional[str]: ...


class _Gpu(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def total_bytes(self) -> int: ...


class MachineProfile(Protocol):
    """What this module reads of a ``probe.MachineProfile`` (and of its parts, the protocols above)."""

    @property
    def cpu(self) -> _Cpu: ...
    @property
    def memory(self) -> _Memory: ...
    @property
    def shm(self) -> _Shm: ...
    @property
    def disk(self) -> Optional[_Disk]: ...
    @property
    def gpus(self) -> Optional[Sequence[_Gpu]]: ...
    @property
    def start_method(self) -> Optional[str]: ...
    @property
    def torch_version(self) -> str: ...
    @property
    def python_version(self) -> str: ...
    @property
    def thread_env(self) -> Mapping[str, str]: ...


UNKNOWN = "unknown"
BOTTLENECK_WORDS = {
    "consumer": "the training step: loading keeps up, more workers would not help",
    "cpu": "CPU: the usable cores are busy decoding/augmenting samples",
    "io": "waiting: workers mostly sleep on storage or network reads",
    "ipc": "inter-process transfer: handing batches between processes costs more than loading them",
    "memory": "memory: more workers would not fit in RAM or /dev/shm",
    "oversubscription": "oversubscription: the workers' native thread pools (BLAS, OpenMP) together ran more threads "
                        "than there are CPUs, so workers lost to loading in the main process",
}
DISK_LIMITED = 0.8
"""A rate within this share of the disk's ceiling (or above it) is limited by the storage, not the configuration."""
_BYPASS_WORDS = {"o_direct": "page cache bypassed with O_DIRECT", "fadvise": "page cache dropped with fadvise"}


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return UNKNOWN
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def mib(n: float) -> str:
    """Bytes in MiB, with one decimal below 10 MiB: "1.5 MiB", "1,024 MiB"."""
    value = n / (1 << 20)
    return f"{value:.1f} MiB" if value < 10 else f"{value:,.0f} MiB"


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


def rate(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _when(created: Optional[float]) -> str:
    return UNKNOWN if created is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(created))


def grid(headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = ()) -> List[str]:
    """Rows under headers, columns right-aligned except those in ``left`` (the last column is never padded)."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [c if i == len(cells) - 1 else (c.ljust(widths[i]) if i in left else c.rjust(widths[i]))
                 for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    return [line(headers)] + [line(r) for r in rows]


def bottleneck_words(bottleneck: Optional[str]) -> str:
    """The bottleneck in plain words ("unknown" when not measured)."""
    if bottleneck is None:
        return "unknown (nothing was measured)"
    return BOTTLENECK_WORDS.get(bottleneck, bottleneck)


def config_kwargs(result: TuneResult) -> str:
    """The chosen knobs as the DataLoader keywords a user would type (those that apply to ``num_workers``), the
    threads per process (``make_loader``'s ``threads=``) when more than one, and the limit of each worker's native
    thread pools (``native_threads=``) when there is one."""
    config = result.config
    text = ", ".join(f"{k}={v}" for k, v in config.loader_kwargs().items())
    text += f"; threads={config.threads} per process" if config.threads > 1 else ""
    if not config.native_threads:
        return text
    return text + f"; native_threads={config.native_threads} per worker" + (
        " (not seen applied)" if result.native_limit_held is False else "")


def _source_words(result: TuneResult) -> str:
    tried = f"{len(result.trials)} trial{'s' if len(result.trials) != 1 else ''}"
    if result.source == "tuned":
        return f"tuned in {result.seconds:.1f} s ({tried})"
    if result.source == "cache":
        return f"from the cache: no trial ran now (tuned {_when(result.created)} in {result.seconds:.1f} s, {tried})"
    if result.source == "online":
        if result.samples_per_s is None and not result.trials:
            return f"online: {result.reason or 'not decided yet'}"
        candidates = f"{len(result.trials)} candidate{'s' if len(result.trials) != 1 else ''}"
        return f"tuned online, in the training loop ({candidates} over {result.seconds:.1f} s of its epochs)"
    if result.source == "pending":
        return f"pending: {result.reason}"
    return f"fallback, not tuned: {result.reason or 'no reason recorded'}"


def _is_chosen(trial: TrialResult, result: TuneResult) -> bool:
    return trial.ok and trial.config.same_candidate(result.config) and \
        (result.samples_per_s is None or trial.samples_per_s == result.samples_per_s)  # measured twice: the one chosen


def _trial_row(trial: TrialResult, best: Optional[float], chosen: bool, *, threads: bool, native: bool,
               memory: bool, footprint: bool) -> List[str]:
    c = trial.config
    if trial.ok:
        status = "ok" if trial.steady else "ok (short window, not steady)"
    else:
        status = f"{trial.status}: {trial.reason or 'no reason recorded'}"
    pct = (lambda x: "-" if x is None else f"{100 * x:.0f}")
    used = trial.worker_memory_bytes if trial.ok else None
    measured = trial.samples_per_s if trial.ok else None  # never None when ok
    return ["*" if chosen else "", str(c.num_workers), *([str(c.threads)] if threads else []),
            "-" if c.prefetch_factor is None else str(c.prefetch_factor),
            "yes" if c.pin_memory else "no", *([_native_cell(trial)] if native else []),
            rate(measured),
            f"{100 * measured / best:.0f}%" if measured is not None and best else "-",
            "-" if trial.startup_s is None else f"{trial.startup_s:.2f}",
            pct(trial.stall_fraction if trial.ok else None),
            pct(trial.worker_cpu_util if c.num_workers else None),
            *([("-" if used is None else f"{used / (1 << 20):,.0f}")] if memory else []),
            *([_mib_cell(trial.footprint_bytes)] if footprint else []), status]


def _native_cell(trial: TrialResult) -> str:
    """The native threads column: the limit (``N?`` when a measured candidate's workers were not seen held to it:
    ``TrialResult.native_limit_held``), ``off`` for workers without one, ``-`` without workers."""
    config = trial.config
    if config.num_workers == 0:
        return "-"
    if config.native_threads is None:
        return "off"
    return f"{config.native_threads}?" if trial.ok and trial.native_limit_held is False else str(config.native_threads)


def native_words(result: TuneResult) -> Optional[str]:
    """The native thread pools a worker of the chosen configuration found and the limit chosen, with the measurement
    without it when the search made one (NOTE [ Native thread pools ] in loader/native.py); None without workers."""
    config = result.config
    if config.num_workers == 0:
        return None
    pools = result.native_pools
    found = UNKNOWN + " (not measured, or threadpoolctl is not installed)" if pools is None else \
        (", ".join(p.label() for p in pools) or "none")
    text = f"native thread pools per worker: {found}; {_limit_words(result)}"
    sides = {}
    for trial in result.trials:
        if trial.ok and trial.config.num_workers == config.num_workers and trial.config.threads == config.threads \
                and trial.config.prefetch_factor == config.prefetch_factor and \
                trial.config.pin_memory == config.pin_memory:
            sides[trial.config.native_threads is None] = trial.samples_per_s
    if len(sides) == 2:
        text += f" (measured without a limit: {rate(sides[True])} samples/s, with it: {rate(sides[False])})"
    return text


def _limit_words(result: TuneResult) -> str:
    """The limit as far as it was seen applied: never "limited to N" unless every pool a worker reported kept <= N."""
    limit, pools = result.config.native_threads, result.native_pools
    if limit is None:
        return "not limited"
    if result.native_limit_held:
        return f"limited to {limit} thread(s) each"
    if pools is None:
        return (f"a limit of {limit} thread(s) each was asked for, not seen applied (without threadpoolctl the BLAS "
                f"and OpenMP pools keep their size; \"{limit}?\" in the table)")
    return (f"a limit of {limit} thread(s) each was asked for, not applied: a pool above kept more threads "
            f"(\"{limit}?\" in the table)")


def _mib_cell(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / (1 << 20):,.0f}"


def _budget_words(result: TuneResult) -> Optional[str]:
    """The memory budget the search kept to, and the chosen configuration's footprint in it."""
    if result.memory_budget_bytes is None:
        return None
    chosen = next((t for t in result.trials if _is_chosen(t, result)), None)
    used = chosen.footprint_bytes if chosen is not None else None
    return (f"memory budget {result.memory_budget_from or mib(result.memory_budget_bytes)}; the chosen configuration "
            f"takes {UNKNOWN if used is None else mib(used)} of it")


def _disk_words(result: TuneResult) -> Optional[str]:
    """The disk's ceiling next to the rate, for an I/O-bound result that has one."""
    ceiling, per_sample = result.disk_ceiling_samples_per_s, result.read_bytes_per_sample
    if ceiling is None or per_sample is None:
        return None
    text = f"the disk allows ~{rate(ceiling)} samples/s at the measured {per_sample / 1024:,.1f} KiB read per sample"
    reached = result.samples_per_s or 0.0
    if reached > 1.2 * ceiling:
        return text + ": faster than the disk, so the reads came from the page cache"
    if reached >= DISK_LIMITED * ceiling:
        return text + ": the storage, not the configuration, is the limit"
    return text + f" ({100 * reached / ceiling:.0f}% of it reached)"


def format_tune_result(result: TuneResult) -> str:
    """The chosen configuration, its rate, bottleneck and source, then one row per trial (the chosen one marked
    ``*``); a cached or fallback result without trials says so instead of a table."""
    lines = [f"Chosen: {config_kwargs(result)}",
             f"  {rate(result.samples_per_s)} samples/s; bottleneck: {bottleneck_words(result.bottleneck)}",
             f"  {_source_words(result)}"]
    if result.consumer_samples_per_s:
        lines.append(f"  the training step alone takes {rate(result.consumer_samples_per_s)} samples/s")
    disk = _disk_words(result)
    if disk is not None:
        lines.append(f"  {disk}")
    if result.reason and result.source not in ("fallback", "pending") and not (result.source == "online"
                                                                                 and not result.trials):
        lines.append(f"  why: {result.reason}")
    for words in (_budget_words(result), native_words(result)):
        if words is not None:
            lines.append(f"  {words}")
    if not result.trials:
        lines.append("  (no trials recorded)")
        return "\n".join(lines)
    rates = [t.samples_per_s for t in result.trials if t.ok and t.samples_per_s is not None]  # ok: measured
    best = max(rates) if rates else None
    marked = False
    rows = []
    threads = any(t.config.threads > 1 for t in result.trials)
    native = any(t.config.num_workers > 0 for t in result.trials)
    memory = any(t.ok and t.config.num_workers and t.worker_memory_bytes is not None for t in result.trials)
    footprint = any(t.footprint_bytes is not None for t in result.trials)
    for trial in result.trials:
        chosen = not marked and _is_chosen(trial, result)
        marked = marked or chosen
        rows.append(_trial_row(trial, best, chosen, threads=threads, native=native, memory=memory,
                               footprint=footprint))
    headers = ["", "workers", *(["threads"] if threads else []), "prefetch", "pin", *(["native"] if native else []),
               "samples/s", "vs best",
               "startup s", "stall %", "worker CPU %", *(["worker MiB"] if memory else []),
               *(["footprint MiB"] if footprint else []), "status"]
    lines.append("")
    lines += ["  " + line for line in grid(headers, rows, left=(0, len(headers) - 1))]
    return "\n".join(lines)


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
            f"    tuned    {_when(entry.created)} in {result.seconds:.1f} s ({len(result.trials)} trials)"]


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
