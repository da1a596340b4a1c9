"""The ``autotune`` command line: its arguments and its entry point (the subcommands are in ``commands``).

``--json`` puts machine-readable JSON alone on stdout; progress, warnings and errors go to stderr. Exit status: 0
success, 1 failure (one line on stderr saying why), 2 bad usage.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, List, Optional

import torch

from .commands import PROG, cmd_clear, cmd_demo, cmd_doctor, cmd_probe, cmd_show, cmd_tune

DEMO_BUDGET_S = 20.0
DEMO_BATCH_SIZE = 32


def _int_at_least(minimum: int) -> Any:
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


def _tuning_options(parser: argparse.ArgumentParser, *, batch_default: Optional[int], budget_default: Optional[float],
                    budget_help: str) -> None:
    parser.add_argument("--batch-size", type=_int_at_least(1), default=batch_default, required=batch_default is None,
                        metavar="N", help="samples per batch" + (f" (default {batch_default})" if batch_default
                                                                else " (the one your training uses)"))
    parser.add_argument("--step", type=lambda t: _seconds(t, positive=False), metavar="SECONDS",
                        help="simulate a training step of SECONDS per batch (default: none, only the transfer)")
    parser.add_argument("--budget", type=lambda t: _seconds(t, positive=True), default=budget_default,
                        metavar="SECONDS", help=budget_help)
    parser.add_argument("--max-workers", type=_int_at_least(0), metavar="N", help="never try more than N workers")
    parser.add_argument("--memory-budget", type=memory_budget_arg, metavar="BYTES|FRACTION",
                        help="what the loader may take of memory: bytes (8GiB, 512MiB) or a fraction of the available "
                             "memory (default 0.5; cgroup-aware)")
    parser.add_argument("--device", type=_device, help="where batches go: cuda, cuda:N or cpu (default: cuda if "
                                                       "available)")
    parser.add_argument("--json", action="store_true", help="print JSON and nothing else on stdout")
    parser.add_argument("--plot", metavar="FILE.png", help="plot samples/s against num_workers (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Probe this machine and tune PyTorch DataLoaders for it. Without a command: probe the "
                               "machine, save the profile, tune a built-in demo dataset and print a report.")
    _tuning_options(parser, batch_default=DEMO_BATCH_SIZE, budget_default=DEMO_BUDGET_S,
                    budget_help=f"seconds of trials for the demo (default {DEMO_BUDGET_S:g})")
    parser.add_argument("--data-dir", metavar="DIR", help="measure disk reads here (default: the cache directory)")
    parser.add_argument("--no-disk", action="store_true", help="skip the disk measurement (about 5 s)")
    parser.set_defaults(func=cmd_demo)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    probe = sub.add_parser("probe", help="probe CPUs, memory, /dev/shm, disk and GPUs; save the machine profile",
                           description="Probe CPUs, memory, /dev/shm, disk and GPUs, print the machine profile and "
                                       "save it as machine.json in the cache directory.")
    probe.add_argument("--data-dir", metavar="DIR",
                       help="measure disk reads here (where your data lives); default: the cache directory")
    probe.add_argument("--json", action="store_true", help="print the profile as JSON and nothing else")
    probe.add_argument("--no-disk", action="store_true", help="skip the disk measurement (about 5 s)")
    probe.set_defaults(func=cmd_probe)

    tune = sub.add_parser("tune", help="tune your dataset and cache the result for make_loader",
                          description="Import MODULE (the current directory is importable), get the dataset from "
                                      "FACTORY (a function returning one, or a dataset attribute), tune it exactly as "
                                      "make_loader(dataset, batch_size, step=..., ...) would and cache the result, so "
                                      "that call in your training script starts at once.")
    tune.add_argument("spec", metavar="MODULE:FACTORY", help="e.g. mydata:make_train_set")
    _tuning_options(tune, batch_default=None, budget_default=None,
                    budget_help="seconds of trials (default: make_loader's default)")
    tune.add_argument("--shuffle", action="store_true", help="tune for shuffle=True (as make_loader(shuffle=True))")
    tune.add_argument("--key", help="the cache key name, as make_loader(key=...)")
    tune.add_argument("--force", action="store_true", help="tune again even when a cached result exists")
    tune.add_argument("--traceback", action="store_true", help="show the full traceback when your code fails")
    tune.set_defaults(func=cmd_tune)

    show = sub.add_parser("show", help="list cached tunings and the saved machine profile")
    show.add_argument("--json", action="store_true", help="print JSON and nothing else")
    show.set_defaults(func=cmd_show)

    clear = sub.add_parser("clear", help="remove cached tunings (machine.json is kept unless --all)")
    which = clear.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="also remove the saved machine profile")
    which.add_argument("key", nargs="?", metavar="KEY", help="remove only this entry (a key `show` lists, or a "
                                                             "unique prefix of one)")
    clear.add_argument("--json", action="store_true", help="print JSON and nothing else")
    clear.set_defaults(func=cmd_clear)

    doctor = sub.add_parser("doctor", help="check the settings that make DataLoader workers slow, crash or leak",
                            description="Check /dev/shm, open-file limits, CPU quota, start method, thread "
                                        "variables, GPUs and processes holding them. Exit 1 if a check fails.")
    doctor.add_argument("--json", action="store_true", help="print JSON and nothing else")
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

