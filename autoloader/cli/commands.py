"""The ``autotune`` subcommands, one function each: parse nothing, call the library, print.

See ``main`` for the arguments; ``--json`` puts JSON alone on stdout, everything else goes to stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator, List, Optional

import torch

from .._fs import default_cache_dir
from ..cache import resolve_cache
from ..factory import make_loader
from ..loader.device import resolve_device
from ..probe import load_profile, probe_machine, save_profile
from ..report import format_entries, format_profile
from ..results.tune_result import format_tune_result
from ..request import Request
from ..tuning.trials import tune_with
from . import plot
from ._spec import CliError, load_dataset
from .demo import DemoImages, baselines, format_comparison
from .doctor import run_checks
from .findings import format_findings

PROG = "autotune"


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
    if args.plot and not plot.available():
        raise CliError(plot.MISSING)
    if args.device is not None and args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CliError(f"--device {args.device}: no CUDA device is available here; use --device cpu")


def _write_plot(args: argparse.Namespace, result: Any, title: str) -> Optional[str]:
    if not args.plot:
        return None
    try:
        path = plot.plot_tune_result(result, args.plot, title=title)
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
        request = Request.checked(dataset, args.batch_size, step=args.step, device=device, budget=args.budget,
                                  max_workers=args.max_workers, memory_budget=args.memory_budget)
        result = tune_with(request, profile)
        compared = baselines(request, result, usable_cpus=profile.cpu.usable)
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
    print(format_comparison(result, compared))
    print("\nYour own data: make_loader(dataset, batch_size, step=train_step) in Python, or "
          "`autotune tune MODULE:FACTORY --batch-size N` here.")
    return 0


# -- tune -----------------------------------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    return _run("tune", args, _tune)


def _tune(args: argparse.Namespace) -> int:
    _check_plot_and_device(args)
    dataset = load_dataset(args.spec)
    cache = resolve_cache(True)
    kwargs = dict(step=args.step, budget=args.budget, max_workers=args.max_workers, device=args.device,
                  shuffle=args.shuffle, key=args.key, memory_budget=args.memory_budget)
    _note(args, f"tuning {args.spec} ({type(dataset).__name__}), batch {args.batch_size}...")
    try:
        with _progress(args.quiet):
            loader = make_loader(dataset, args.batch_size, refresh=args.force, tuning="trials", **kwargs)
    except Exception as err:  # bad arguments or the user's dataset failing in a trial: one line, unless asked
        if args.traceback:
            traceback.print_exc()
        hint = "" if args.traceback else " (--traceback shows where)"
        raise CliError(f"tuning {args.spec} failed: {type(err).__name__}: {err}{hint}") from None
    result, key = loader.tuning, loader.cache_key
    assert result is not None  # make_loader's loaders are tuned
    del loader
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
    findings = run_checks()
    if args.json:
        _emit_json({"findings": [f.to_dict() for f in findings]})
    else:
        print(format_findings(findings))
    return 1 if any(f.status == "fail" for f in findings) else 0


