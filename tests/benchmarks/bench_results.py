"""Each benchmark's results file, ``tests/benchmarks/results/<name>.md``: the README's measured figures come from these.

A benchmark module starts a ``Run`` when its first test starts (its module fixture) and writes it at the end:

    run = Run.start("tuner", "The tuner against an exhaustive sweep")
    ...
    run.write(markdown_tables, loads=[...])

The run becomes one section, ``## Run of <date>``, headed with what a reader needs to weigh its numbers: the date, the
command as it was run (with its ``AUTOLOADER_BENCH_*`` settings), the versions, the machine and the 1-min load average
during the run (it counts the benchmark's own workers). The new section goes above the earlier ones, and everything
else in the file is kept (the title and what the benchmark measures, above the first run; earlier runs and their
reading, below), so a run adds to the record and never replaces it. ``AUTOLOADER_BENCH_RESULTS`` names another
directory to write to; ``0`` writes no file (the tables are still printed, and written to ``AUTOLOADER_BENCH_TABLE``
when set: ``helpers.emit_table``).
"""
from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

RESULTS = Path(__file__).resolve().parent / "results"
"""Where the results files live (the README's summary table links them)."""

GIB = 2**30


def results_dir() -> Optional[Path]:
    """``AUTOLOADER_BENCH_RESULTS`` if set (``0``: none), else ``RESULTS``."""
    chosen = os.environ.get("AUTOLOADER_BENCH_RESULTS", "")
    if chosen == "0":
        return None
    return Path(chosen) if chosen else RESULTS


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions(packages: Sequence[str] = ()) -> str:
    """autoloader, torch, numpy, python, then ``packages`` (distribution names), as installed."""
    import autoloader
    import torch

    found = [f"autoloader {autoloader.__version__}", f"torch {torch.__version__}", f"numpy {_version('numpy')}",
             f"python {sys.version.split()[0]}"]
    return ", ".join(found + [f"{name} {_version(name)}" for name in packages])


def machine() -> str:
    """The CPUs (usable, logical, model), the memory, the GPUs; from ``probe_machine``, which guesses nothing."""
    from autoloader.probe import probe_machine

    profile = probe_machine(disk=False)
    cpu, memory = profile.cpu, profile.memory
    quota = "no cgroup quota" if cpu.quota is None else f"cgroup quota {cpu.quota:g} CPUs"
    total = "memory unknown" if memory.total_bytes is None else f"{memory.total_bytes / GIB:.1f} GiB"
    gpus = ("GPUs not probed" if profile.gpus is None
            else ", ".join(g.name for g in profile.gpus) if profile.gpus else "no GPU")
    return (f"{platform.system()} {platform.machine()}, {cpu.model or 'CPU model unknown'}: {cpu.usable} usable CPUs "
            f"({cpu.logical} logical, affinity {cpu.affinity}, {quota}), {total}, {gpus}")


def command() -> str:
    """How this pytest run was started, with the ``AUTOLOADER_BENCH_*`` settings in force."""
    where = ("AUTOLOADER_BENCH_RESULTS", "AUTOLOADER_BENCH_TABLE")
    settings = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
                if k.startswith("AUTOLOADER_BENCH_") and k not in where]
    return " ".join(settings + ["python -m pytest"] + [shlex.quote(a) for a in sys.argv[1:]])


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)


@dataclass
class Run:
    """One run of one benchmark module, from its first test to its table."""

    name: str
    title: str
    started: float = field(default_factory=time.time)
    loads: List[float] = field(default_factory=list)

    @classmethod
    def start(cls, name: str, title: str) -> "Run":
        return cls(name, title, loads=[os.getloadavg()[0]])

    def header(self, packages: Sequence[str] = (), loads: Iterable[float] = ()) -> str:
        seen = self.loads + list(loads) + [os.getloadavg()[0]]
        start, end = _utc(self.started), _utc(time.time())
        return "\n".join([
            f"- Date: {start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC",
            f"- Command: `{command()}`",
            f"- Versions: {versions(packages)}",
            f"- Machine: {machine()}",
            f"- Load: 1-min load average {min(seen):.1f}-{max(seen):.1f} during the run (it counts this benchmark's "
            f"own processes)",
        ])

    def write(self, body: str, *, packages: Sequence[str] = (), loads: Iterable[float] = ()) -> Optional[Path]:
        """Add this run, headed, above the earlier runs of ``results/<name>.md``; the path written, or None."""
        directory = results_dir()
        if directory is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.md"
        section = f"## Run of {_utc(self.started):%Y-%m-%d %H:%M} UTC\n\n{self.header(packages, loads)}\n\n{body}\n"
        old = path.read_text() if path.exists() else f"# {self.title}\n"
        path.write_text(insert_run(old, section))
        return path


def insert_run(text: str, section: str) -> str:
    """``text`` with ``section`` put above its first ``## `` heading (at the end when it has none)."""
    lines = text.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    head = "".join(lines[:at]).rstrip("\n") + "\n\n"
    rest = "".join(lines[at:])
    return head + section + ("\n" + rest if rest else "")
