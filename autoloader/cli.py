"""The ``autotune`` command: parses arguments, calls the library, prints. One function per subcommand.

Subcommands import the library (and torch) when they run, so ``autotune --help`` answers at once.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

PROG = "autotune"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Probe this machine and tune PyTorch DataLoaders for it.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    probe = sub.add_parser("probe", help="probe CPUs, memory, /dev/shm, disk and GPUs; save the machine profile",
                           description="Probe CPUs, memory, /dev/shm, disk and GPUs, print the machine profile and "
                                       "save it as machine.json in the cache directory.")
    probe.add_argument("--data-dir", metavar="DIR",
                       help="measure disk reads here (where your data lives); default: the cache directory")
    probe.add_argument("--json", action="store_true", help="print the profile as JSON and nothing else")
    probe.add_argument("--no-disk", action="store_true", help="skip the disk measurement (about 5 s)")
    probe.set_defaults(func=cmd_probe)
    return parser


def _fail(command: str, reason: str, code: int = 1) -> int:
    print(f"{PROG} {command}: error: {reason}", file=sys.stderr)
    return code


def cmd_probe(args: argparse.Namespace) -> int:
    from ._fs import default_cache_dir
    from .probe import probe_machine, save_profile
    from .report import format_profile

    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        return _fail("probe", f"--data-dir {args.data_dir!r} is not a directory", code=2)
    data_dir = args.data_dir
    if not args.no_disk and data_dir is None:
        data_dir = default_cache_dir()
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return _fail("probe", f"cannot create the cache directory {data_dir}: {exc.strerror or exc}")
    if not args.no_disk and not args.json:
        print(f"measuring disk reads in {data_dir} (a few seconds)...", file=sys.stderr)
    profile = probe_machine(data_dir, disk=not args.no_disk, gpus=True)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2, sort_keys=True))
    else:
        print(format_profile(profile))
    try:
        path = save_profile(profile)
    except OSError as exc:
        return _fail("probe", f"cannot save the machine profile: {exc}")
    if not args.json:
        print(f"saved the machine profile to {path}", file=sys.stderr)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``autotune`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status (0 ok, 1 failure, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on bad usage (2) and on --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `autotune probe --json | head`: stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
