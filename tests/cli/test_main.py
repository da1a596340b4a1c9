"""``autotune --help`` and each command's ``--help`` are complete: every option says what it takes and its default,
the top-level help lists every command with one line, and each command's help says what it does and prints."""
from __future__ import annotations

import argparse
import contextlib
import io
from typing import Dict, List

from autoloader.cli.main import build_parser, main

COMMANDS = ("probe", "tune", "show", "clear", "doctor")


def _subparsers(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _help_of(argv: List[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def test_every_command_is_listed_with_one_line():
    parser = build_parser()
    assert sorted(_subparsers(parser)) == sorted(COMMANDS)
    text = _help_of(["--help"])
    for command in COMMANDS:
        assert f"\n    {command} " in text, f"`autotune --help` does not list {command}"
    choices = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]._choices_actions
    assert all(choice.help for choice in choices)


def test_every_option_says_what_it_takes_and_its_default():
    parser = build_parser()
    missing = []
    for name, sub in [("autotune", parser)] + [(f"autotune {n}", p) for n, p in _subparsers(parser).items()]:
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            words = action.help or ""
            if not ("default" in words or "required" in words):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: {words!r}")
    assert missing == [], "options whose help does not give their default:\n" + "\n".join(missing)


def test_each_command_help_says_what_it_does_prints_and_exits_with():
    assert "Exit status" in _help_of(["--help"]) and "--json" in _help_of(["--help"])
    for command in COMMANDS:
        text = _help_of([command, "--help"])
        assert f"usage: autotune {command}" in text
        description = build_parser()._subparsers._group_actions[0].choices[command].description
        assert description and "--json prints" in description, f"autotune {command} --help: no description of its JSON"


def test_doctor_help_is_the_troubleshooting_list():
    """``autotune doctor --help`` ends with every error users meet, each a line then its meaning and fix; the README
    shows the five met most and points here (tests/test_readme.py checks they are among these)."""
    from autoloader.cli.main import TROUBLESHOOTING

    text = _help_of(["doctor", "--help"])
    assert TROUBLESHOOTING.splitlines()[0] in text
    entries = [line for line in TROUBLESHOOTING.splitlines() if line.startswith("  ") and not line.startswith("    ")]
    assert len(entries) >= 12
    for entry in entries:
        assert entry.strip() in text
    fixes = [line for line in TROUBLESHOOTING.splitlines() if line.startswith("      ")]
    assert len(fixes) >= len(entries) and all(len(line) <= 120 for line in TROUBLESHOOTING.splitlines())
