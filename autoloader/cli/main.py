"""The ``autotune`` command line: its arguments and its entry point (the subcommands are in ``commands``).

``--json`` puts machine-readable JSON alone on stdout; progress, warnings and errors go to stderr. Exit status: 0
success, 1 failure (one line on stderr saying why), 2 bad usage.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Callable, List, Optional

import torch

from ..search.candidates import DEFAULT_BUDGET_S
from .commands import PROG, cmd_clear, cmd_demo, cmd_doctor, cmd_probe, cmd_show, cmd_tune

DEMO_BUDGET_S = 20.0
DEMO_BATCH_SIZE = 32


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _seconds(text: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value < float("inf") or (value <= 0 if positive else value < 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds {'> 0' if positive else '>= 0'}, "
                                         f"got {text}")
    return value


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40}


def memory_budget_arg(text: str) -> "int | float":
    """``--memory-budget``: a fraction in (0, 1] of the available memory ("0.5"), or bytes with an optional binary
    unit ("8GiB", "512M", "1073741824"); what ``make_loader(memory_budget=...)`` takes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] such as 0.5, or bytes such as 8GiB or 512MiB, "
                                         f"got {text!r}")
    value = float(match.group(1))
    if not unit and "." in match.group(1) or not unit and value <= 1:
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"a fraction must be in (0, 1], got {text}")
        return value
    if value * _UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text}")
    return int(value * _UNITS[unit])


def _device(text: str) -> str:
    try:
        torch.device(text)
    except (RuntimeError, ValueError) as err:
        raise argparse.ArgumentTypeError(f"not a torch device such as 'cuda', 'cuda:1' or 'cpu' ({err})") from None
    return text


_DEMO = """\
Without a command: probe this machine (CPUs, memory, /dev/shm, disk, GPUs), save the profile as machine.json in
the cache directory, then tune a built-in demo dataset (synthetic 3x64x64 images, zlib-decoded and augmented per
sample, about 1-2 ms of one core each; nothing is downloaded) with trials, and compare the result with the two
usual guesses, num_workers=0 and one worker per usable CPU minus one. Progress (one line per trial) goes to
stderr, the report to stdout; a "*" marks the chosen row."""

_EPILOG = """\
Every command takes --json: JSON alone on stdout (progress and warnings on stderr); without a command it prints
{"profile", "profile_path", "demo", "result", "baselines", "plot"}. Exit status: 0 success, 1 failure (one line on
stderr saying why), 2 bad usage. The cache directory is $AUTOLOADER_CACHE_DIR, else $XDG_CACHE_HOME/autoloader,
else ~/.cache/autoloader. `autotune COMMAND --help` describes each command; in Python,
help(autoloader.make_loader) describes every argument of the loader."""

_PROBE = """\
Probe CPUs (affinity, cgroup quota), memory (cgroup-aware), /dev/shm, the disk's read speed with the page cache
bypassed (about 5 s) and the GPUs (without initialising CUDA), print the machine profile and save it as
machine.json in the cache directory, where make_loader reads the disk figures. --json prints the profile's fields
(MachineProfile.to_dict)."""

_TUNE = """\
Import MODULE (the current directory is importable), get the dataset from FACTORY (a function or class returning
one, or a dataset attribute), tune it with trials exactly as make_loader(dataset, batch_size, step=...,
budget=..., max_workers=..., device=..., shuffle=..., key=...) would and cache the result under the key that call
looks up, so your training script starts with no trials. Run again, the answer comes from the cache (--force
tunes again). --json prints {"spec", "dataset", "batch_size", "arguments", "key", "cache_dir", "result", "plot"}.
A MODULE that cannot be imported, a FACTORY it does not have, or a factory that returns no Dataset fails with
one line and exit status 1."""

_SHOW = """\
List the cached tunings (the dataset and arguments, the chosen configuration, its rate and bottleneck, when it
was tuned) and the saved machine profile; an entry that cannot be used is listed with the reason. --json prints
{"cache_dir", "entries": [{"key", "path", "created", "meta", "error", "result"}], "profile"}."""

_CLEAR = """\
Remove cached tunings: KEY removes one entry (a key `autotune show` lists, or a unique prefix of one); without KEY
every tuning is removed and machine.json kept; --all removes the machine profile too. Prints what it removed; an
unknown or ambiguous KEY is an error (exit status 1). --json prints {"cache_dir", "removed", "keys",
"profile_removed"}."""

_DOCTOR = """\
Check what makes DataLoader workers slow, crash or leak, and say how to fix each: /dev/shm against what the cached
configurations need, the memory budget a loader gets here (and where it comes from: cgroup, available or user),
the open-files limit, a CPU quota or affinity smaller than os.cpu_count(), the start method, the thread variables,
the native thread pools, the GPUs and leftover processes holding /dev/nvidia*, whether the saved profile still
matches the machine, and unusable cache entries. Each finding is a line [ok], [warn], [fail] or [info], then its
fix: line. Exit status 1 when a check fails (a warning is not a failure). --json prints {"findings": [{"name",
"status", "detail", "fix"}]}, status one of ok, warn, fail, info."""


TROUBLESHOOTING = """\
The errors DataLoader users meet, what each means, and the fix (autoloader avoids or reports the first ones itself):

  Bus error / "unable to allocate shared memory(shm) ... No space left on device"
      Batches in flight overflow /dev/shm (Docker's default is 64 MB); autoloader skips candidates that would not
      fit. Fix: docker run --shm-size=8g (Kubernetes: an emptyDir with medium: Memory at /dev/shm), smaller batches.
  "DataLoader worker (pid(s) X) exited unexpectedly" / "... is killed by signal: Killed."
      The OOM killer. autoloader skips candidates over the memory budget (a forked worker's size is measured at its
      first batch) and a killed trial fails only that candidate. Fix: max_workers=, a smaller prefetch_factor, or
      less memory per worker (next entry).
  Workers' memory grows every epoch ("memory leak", PyTorch issue 13246)
      Each worker copies the Python objects it reads (reference counts: copy-on-read). autoloader counts the copied
      pages, warns, and keeps its choice within the memory budget as forecast for the epoch's end. Fix: numpy
      arrays or tensors instead of lists of Python objects; gc.freeze() before the loader starts.
  "Too many open files" / "received 0 items of ancdata" / OSError: [Errno 24]
      Each worker holds file descriptors; without max_workers autoloader tries at most `ulimit -n` // 32 workers.
      Fix: ulimit -n 65536 (Docker: --ulimit nofile=65536:65536), or
      torch.multiprocessing.set_sharing_strategy('file_system').
  "Cannot re-initialize CUDA in forked subprocess"
      The dataset, a transform or collate_fn touches CUDA in a worker. Fix: return CPU tensors and let the loader
      move them (device="cuda", normalize=); else multiprocessing_context="spawn".
  "Can't pickle local object '...<locals>.<lambda>'" / PicklingError
      spawn/forkserver workers get a pickled dataset; make_loader names the attribute before any worker starts (a
      ValueError). Fix: module-level functions (or functools.partial), files opened lazily in the worker.
  The loader hangs ("DataLoader timed out after N seconds", or no error)
      Trials have a wall-clock limit and stuck workers are terminated; online tuning has none. Fix: timeouts on the
      dataset's own I/O, connections opened lazily in each worker. A worker killed by a signal (SIGSEGV) is torch's
      RuntimeError, never a hang (NOTE [ Asynchronous exceptions ] in autoloader/supervise/signals.py).
  ConnectionResetError or a bare EOFError, then "DataLoader worker (pid X) is killed by signal" in your except
      A worker was killed (the OOM killer, usually) while it handed a batch over. autoloader's loaders raise torch's
      RuntimeError once, the connection error as its cause. Fix the cause (memory_budget=, fewer workers).
  An IterableDataset gives every sample N times with N workers
      autoloader warns. Fix: split the stream in __iter__ by torch.utils.data.get_worker_info().
  "autoloader: this loader was made before torch.distributed was initialised, so it is not sharded"
      Call make_loader after init_process_group (Lightning: in train_dataloader()), or pass distributed=False.
  "load_state_dict(state): the state was saved with ..."
      The resume changed what may not change (help(autoloader.PrefetchLoader.load_state_dict)).
  "terminate called without an active exception" at exit under torchrun
      gloo's teardown: end with dist.destroy_process_group() (Accelerate: accelerator.end_training()).
  TypeError / ValueError from make_loader
      The arguments are checked before any work; the message names the argument, its value and the fix, and starts
      with DataLoader's own words where DataLoader refuses it too (help(autoloader.make_loader), Raises).
  AutoloaderWarning "autoloader could not tune (...)"
      No candidate worked: the loader serves num_workers=0 and caches nothing; loader.tuning.trials says why each
      candidate failed."""

def _parser(sub: Any, name: str, line: str, description: str) -> argparse.ArgumentParser:
    """A subcommand: ``line`` is its line in ``autotune --help``, ``description`` heads its own ``--help``."""
    return sub.add_parser(name, help=line, description=description,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _tuning_options(parser: argparse.ArgumentParser, *, batch_default: Optional[int], budget_default: Optional[float],
                    budget_help: str) -> None:
    parser.add_argument("--batch-size", type=_int_at_least(1), default=batch_default, required=batch_default is None,
                        metavar="N", help="samples per batch, >= 1" + (f" (default {batch_default})" if batch_default
                                                                       else " (required: the one your training uses)"))
    parser.add_argument("--step", type=lambda t: _seconds(t, positive=False), metavar="SECONDS",
                        help="simulate a training step of SECONDS per batch, >= 0 (default: none, only the copy to "
                             "the device)")
    parser.add_argument("--budget", type=lambda t: _seconds(t, positive=True), default=budget_default,
                        metavar="SECONDS", help=budget_help)
    parser.add_argument("--max-workers", type=_int_at_least(0), metavar="N",
                        help="never try more than N workers, >= 0 (default: as many as the usable CPUs and the "
                             "open-files limit allow)")
    parser.add_argument("--memory-budget", type=memory_budget_arg, metavar="BYTES|FRACTION",
                        help="what the loader may add to memory: bytes (8GiB, 512MiB, 1073741824) or a fraction in "
                             "(0, 1] of the memory available to this process (default 0.5; cgroup-aware)")
    parser.add_argument("--device", type=_device, help="where batches go: cuda, cuda:N or cpu (default: cuda if "
                                                       "available, else cpu)")
    parser.add_argument("--json", action="store_true", help="print JSON and nothing else on stdout (default: a "
                                                            "readable report)")
    parser.add_argument("--plot", metavar="FILE.png", help="also write a PNG of samples/s against num_workers (needs "
                                                           "matplotlib: pip install matplotlib; default: "
                                                           "no plot)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr (default: one per trial)")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON and nothing else on stdout (default: a "
                                                            "readable report)")


def _disk_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", metavar="DIR", help="measure disk reads here, where your data lives (default: "
                                                          "the cache directory)")
    parser.add_argument("--no-disk", action="store_true", help="skip the disk measurement (default: measure it, "
                                                               "about 5 s)")


def build_parser() -> argparse.ArgumentParser:
    """The ``autotune`` command line: the demo's options, and one subparser per command."""
    parser = argparse.ArgumentParser(prog=PROG, description="Probe this machine and tune PyTorch DataLoaders for "
                                     "it.\n\n" + _DEMO, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _tuning_options(parser, batch_default=DEMO_BATCH_SIZE, budget_default=DEMO_BUDGET_S,
                    budget_help=f"seconds of trials for the demo, > 0 (default {DEMO_BUDGET_S:g})")
    _disk_options(parser)
    parser.set_defaults(func=cmd_demo)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    probe = _parser(sub, "probe", "probe CPUs, memory, /dev/shm, disk and GPUs; save the machine profile", _PROBE)
    _disk_options(probe)
    _json_option(probe)
    probe.set_defaults(func=cmd_probe)

    tune = _parser(sub, "tune", "tune your dataset ahead of time and cache the result for make_loader", _TUNE)
    tune.add_argument("spec", metavar="MODULE:FACTORY",
                      help="where the dataset comes from (required), e.g. mydata:make_train_set")
    _tuning_options(tune, batch_default=None, budget_default=None,
                    budget_help=f"seconds of trials, > 0 (default: make_loader's, {DEFAULT_BUDGET_S:g})")
    tune.add_argument("--shuffle", action="store_true", help="tune for shuffle=True, as make_loader(shuffle=True) "
                                                             "(default: shuffle=False)")
    tune.add_argument("--key", help="name the dataset in the cache key, as make_loader(key=...) (default: its "
                                    "fingerprint)")
    tune.add_argument("--force", action="store_true", help="tune again even when a cached result exists (default: "
                                                           "use the cached one)")
    tune.add_argument("--traceback", action="store_true", help="show the full traceback when your code fails "
                                                               "(default: one line)")
    tune.set_defaults(func=cmd_tune)

    show = _parser(sub, "show", "list the cached tunings and the saved machine profile", _SHOW)
    _json_option(show)
    show.set_defaults(func=cmd_show)

    clear = _parser(sub, "clear", "remove cached tunings (machine.json is kept unless --all)", _CLEAR)
    which = clear.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="also remove the saved machine profile (default: keep it)")
    which.add_argument("key", nargs="?", metavar="KEY", help="remove only this entry: a key `autotune show` lists, or "
                                                             "a unique prefix of one (default: every tuning)")
    _json_option(clear)
    clear.set_defaults(func=cmd_clear)

    doctor = _parser(sub, "doctor", "check what makes DataLoader workers slow, crash or leak, and name the fix",
                     _DOCTOR)
    doctor.epilog = TROUBLESHOOTING
    _json_option(doctor)
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``autotune`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status (0 ok, 1 failure, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on bad usage (2) and on --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `autotune probe --json | head`: stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1

