"""The ``autotune`` command: parses arguments, calls the library, prints. One function per subcommand.

Subcommands import the library (and torch) when they run, so ``autotune --help`` answers at once. ``--json`` puts
machine-readable JSON alone on stdout; progress, warnings and errors go to stderr. Exit status: 0 success, 1 failure
(one line on stderr saying why), 2 bad usage.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator, List, Optional

from ._spec import CliError, load_dataset

PROG = "autotune"
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


def _device(text: str) -> str:
    import torch

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


def _fail(command: str, reason: str, code: int = 1) -> int:
    print(f"{PROG} {command}: error: {reason}" if command else f"{PROG}: error: {reason}", file=sys.stderr)
    return code


def _emit_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


def _note(args: argparse.Namespace, text: str) -> None:
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator[None]:
    """Show the tuner's one line per finished trial on stderr while it runs."""
    if quiet:
        yield
        return
    logger = logging.getLogger("autoloader.tuner")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _check_plot_and_device(args: argparse.Namespace) -> None:
    from . import plot

    if args.plot and not plot.available():
        raise CliError(plot.MISSING)
    if args.device is not None and args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise CliError(f"--device {args.device}: no CUDA device is available here; use --device cpu")


def _write_plot(args: argparse.Namespace, result: Any, title: str) -> Optional[str]:
    from .plot import plot_tune_result

    if not args.plot:
        return None
    try:
        path = plot_tune_result(result, args.plot, title=title)
    except OSError as err:
        raise CliError(f"cannot write the plot {args.plot}: {err.strerror or err}") from None
    _note(args, f"wrote the plot to {path}")
    return str(path)


def _run(command: str, args: argparse.Namespace, body: Any) -> int:
    try:
        return body(args)
    except CliError as err:
        return _fail(command, str(err))


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


def cmd_demo(args: argparse.Namespace) -> int:
    return _run("", args, _demo)


def _demo(args: argparse.Namespace) -> int:
    from ._fs import default_cache_dir
    from .demo import DemoImages, baselines
    from .probe import probe_machine, save_profile
    from .report import format_comparison, format_profile, format_tune_result
    from .prefetch import resolve_device
    from .tuner import tune

    _check_plot_and_device(args)
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        return _fail("", f"--data-dir {args.data_dir!r} is not a directory", code=2)
    data_dir = None if args.no_disk else Path(args.data_dir) if args.data_dir else default_cache_dir()
    if data_dir is not None:
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"cannot create the cache directory {data_dir}: {exc.strerror or exc}") from None
        _note(args, f"probing the machine; measuring disk reads in {data_dir} (a few seconds)...")
    profile = probe_machine(data_dir, disk=data_dir is not None, gpus=True)
    try:
        profile_path = save_profile(profile)
    except OSError as exc:
        raise CliError(f"cannot save the machine profile: {exc}") from None
    _note(args, f"saved the machine profile to {profile_path}")
    dataset = DemoImages()
    device = resolve_device(args.device)
    _note(args, f"tuning the demo dataset ({len(dataset)} synthetic 3x64x64 images, batch {args.batch_size}, "
                f"on {device}; budget {args.budget:g} s)...")
    with _progress(args.quiet):
        result = tune(dataset, args.batch_size, step=args.step, device=device, budget=args.budget,
                      max_workers=args.max_workers, profile=profile)
        compared = baselines(dataset, args.batch_size, result, usable_cpus=profile.cpu.usable, step=args.step,
                             device=device, max_workers=args.max_workers)
    plotted = _write_plot(args, result, "autotune demo: synthetic images, decode + augment per sample")
    demo = {"dataset": "DemoImages", "len": len(dataset), "sample": "float32 3x64x64, ~1-2 ms decode+augment",
            "batch_size": args.batch_size, "step": args.step, "device": str(device)}
    if args.json:
        _emit_json({"profile": profile.to_dict(), "profile_path": str(profile_path), "demo": demo,
                    "result": result.to_dict(), "baselines": [b.to_dict() for b in compared], "plot": plotted})
        return 0
    step = "none (transfer only)" if args.step is None else f"a simulated {args.step:g} s step"
    print(format_profile(profile))
    print(f"\nDemo dataset: {len(dataset)} synthetic 3x64x64 images, zlib-decoded and augmented per sample "
          f"(~1-2 ms each); batch {args.batch_size}, device {device}, training step {step}")
    print(format_tune_result(result))
    print()
    print(format_comparison(result, compared, usable_cpus=profile.cpu.usable))
    print("\nYour own data: make_loader(dataset, batch_size, step=train_step) in Python, or "
          "`autotune tune MODULE:FACTORY --batch-size N` here.")
    return 0


# -- tune -----------------------------------------------------------------------------------------------------------
def _entry_key(cache: Any, result: Any) -> Optional[str]:
    """The key of the cache entry holding ``result`` (entries are matched by content: the factory does not return
    its key); None when none does."""
    if cache is None or result.source == "fallback":
        return None
    for entry in cache.entries():
        if entry.result is not None and entry.result.with_source(result.source) == result:
            return entry.key
    return None


def cmd_tune(args: argparse.Namespace) -> int:
    return _run("tune", args, _tune)


def _tune(args: argparse.Namespace) -> int:
    from .cache import resolve_cache
    from .factory import make_loader
    from .report import format_tune_result

    _check_plot_and_device(args)
    dataset = load_dataset(args.spec)
    cache = resolve_cache(True)
    kwargs = dict(step=args.step, budget=args.budget, max_workers=args.max_workers, device=args.device,
                  shuffle=args.shuffle, key=args.key)
    _note(args, f"tuning {args.spec} ({type(dataset).__name__}), batch {args.batch_size}...")
    try:
        with _progress(args.quiet):
            result = make_loader(dataset, args.batch_size, **kwargs).tuning
            if args.force and result.source == "cache":
                old = _entry_key(cache, result)
                if old is not None:
                    cache.remove(old)
                    result = make_loader(dataset, args.batch_size, **kwargs).tuning
    except Exception as err:  # bad arguments or the user's dataset failing in a trial: one line, unless asked
        if args.traceback:
            traceback.print_exc()
        hint = "" if args.traceback else " (--traceback shows where)"
        raise CliError(f"tuning {args.spec} failed: {type(err).__name__}: {err}{hint}") from None
    key = _entry_key(cache, result)
    plotted = _write_plot(args, result, f"autotune tune {args.spec}")
    call = (f"make_loader(dataset, {args.batch_size}" + "".join(
        f", {k}={v!r}" for k, v in kwargs.items() if v not in (None, False)) + ")")
    if args.json:
        _emit_json({"spec": args.spec, "dataset": type(dataset).__name__, "batch_size": args.batch_size,
                    "arguments": kwargs, "key": key, "cache_dir": str(cache.directory) if cache else None,
                    "result": result.to_dict(), "plot": plotted})
        return 0
    print(format_tune_result(result))
    if result.source == "cache":
        print(f"\nThis came from the cache (entry {key}); --force tunes again.")
    elif key is not None:
        print(f"\nCached as {key} in {cache.directory}:\n  {call} reuses it with no trials.")
    else:
        print("\nNot cached (the result is a fallback, or the cache directory is not writable).")
    return 0


# -- show, clear, doctor --------------------------------------------------------------------------------------------
def cmd_show(args: argparse.Namespace) -> int:
    from .cache import resolve_cache
    from .probe import load_profile
    from .report import format_entries, format_profile

    cache = resolve_cache(True)
    entries = cache.entries()
    profile = load_profile()
    if args.json:
        _emit_json({"cache_dir": str(cache.directory), "profile": None if profile is None else profile.to_dict(),
                    "entries": [{"key": e.key, "path": str(e.path), "created": e.created, "meta": e.meta,
                                 "error": e.error, "result": None if e.result is None else e.result.to_dict()}
                                for e in entries]})
        return 0
    print(format_entries(entries, cache.directory))
    print()
    if profile is None:
        print("No machine profile saved: run `autotune` or `autotune probe`.")
    else:
        print(format_profile(profile).replace("Machine profile", "Machine profile (saved)", 1))
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from .cache import resolve_cache

    cache = resolve_cache(True)
    if args.key is None:
        removed = cache.clear(include_profile=args.all)
        keys: List[str] = []
    else:
        keys = [e.key for e in cache.entries() if args.key and e.key.startswith(args.key.lower())]
        if len(keys) != 1:
            why = "no cache entry" if not keys else f"{len(keys)} cache entries"
            return _fail("clear", f"{why} matches {args.key!r} in {cache.directory} (`autotune show` lists them)")
        removed = int(cache.remove(keys[0]))
    if args.json:
        _emit_json({"cache_dir": str(cache.directory), "removed": removed, "keys": keys,
                    "profile_removed": bool(args.all)})
    else:
        what = f"entry {keys[0]}" if keys else f"{removed} file(s)" + (" including machine.json" if args.all else "")
        print(f"removed {what} from {cache.directory}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks
    from .report import format_findings

    findings = run_checks()
    if args.json:
        _emit_json({"findings": [f.to_dict() for f in findings]})
    else:
        print(format_findings(findings))
    return 1 if any(f.status == "fail" for f in findings) else 0


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


if __name__ == "__main__":
    sys.exit(main())
