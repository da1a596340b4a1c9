"""The package's layout in numbers (issue 48), as a markdown table: lines per subpackage, modules over 300 lines,
``Any`` in annotations, modules with logic but no test module of their own, and stale pointers.

    python scripts/layout_report.py            # the table, then the lists behind it

The rules, stated here once:
- *lines*: every line of every ``.py`` file under ``autoloader/``; a top-level module counts as ``(top level)``.
- *over 300 lines*: a module (file) longer than ``LONG`` lines.
- *``Any`` in annotations*: each ``Any`` (a name, ``typing.Any``, or inside a string annotation) in a parameter's,
  a return's or an annotated assignment's annotation; ``Any`` elsewhere (a type alias, a ``cast``) is not counted.
- *module with logic*: a module (not ``__init__.py`` or ``__main__.py``) that defines a function or a method.
- *its own test module*: a file ``tests/**/test_<name>.py`` or ``tests/**/test_<name>_<more>.py`` (benchmarks, stress
  and integrations excluded), ``<name>`` the module's file name without a leading underscore. Where two subpackages
  hold a module of that name, only a test file in the folder mirroring the module's (``tests/<subpackage>/``, for
  ``ray/`` ``tests/ray_engine/``; ``tests/`` for a top-level module) counts.
- *stale pointers*: the dotted names and NOTE references ``tests/test_pointers.py`` finds that resolve to nothing.
"""
from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autoloader"
TESTS = ROOT / "tests"
LONG = 300
NOT_OWN_TESTS = {"benchmarks", "stress", "integrations"}
TEST_FOLDER = {"ray": "ray_engine"}


def modules() -> List[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def subpackage(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] + "/" if len(parts) > 1 else "(top level)"


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _any_in(annotation: ast.AST) -> int:
    found = 0
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any" or isinstance(node, ast.Attribute) and node.attr == "Any":
            found += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                found += _any_in(ast.parse(node.value, mode="eval"))
            except SyntaxError:
                continue
    return found


def _annotations(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
            yield from (a.annotation for a in every if a.annotation is not None)
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def any_count(path: Path) -> int:
    return sum(_any_in(a) for a in _annotations(ast.parse(path.read_text(encoding="utf-8"))))


def has_logic(path: Path) -> bool:
    if path.name in ("__init__.py", "__main__.py"):
        return False
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.walk(tree))


def _test_files() -> List[Path]:
    return [p for p in TESTS.rglob("test_*.py") if not NOT_OWN_TESTS & set(p.relative_to(TESTS).parts[:-1])]


def untested() -> List[str]:
    """The modules with logic that have no test module of their own (the rule: this file's docstring)."""
    stems = Counter(p.stem for p in modules())
    tests = _test_files()
    missing = []
    for path in modules():
        if not has_logic(path):
            continue
        name = path.stem.lstrip("_")
        mine = [t for t in tests if t.stem == f"test_{name}" or t.stem.startswith(f"test_{name}_")]
        if stems[path.stem] > 1:
            parts = path.relative_to(PACKAGE).parts
            folder = TESTS / TEST_FOLDER.get(parts[0], parts[0]) if len(parts) > 1 else TESTS
            mine = [t for t in mine if t.parent == folder]
        if not mine:
            missing.append(str(path.relative_to(ROOT)))
    return missing


def stale_pointers() -> List[str]:
    sys.path.insert(0, str(TESTS))
    from test_pointers import _stale  # tests/test_pointers.py: the one resolver

    names, notes = _stale()
    return names + notes


def report() -> str:
    paths = modules()
    lines: Dict[str, int] = Counter()
    files: Dict[str, int] = Counter()
    for path in paths:
        lines[subpackage(path)] += _line_count(path)
        files[subpackage(path)] += 1
    long = sorted(((_line_count(p), str(p.relative_to(ROOT))) for p in paths if _line_count(p) > LONG), reverse=True)
    missing = untested()
    stale = stale_pointers()
    logic = sum(has_logic(p) for p in paths)
    out = ["| metric | value |", "|---|---|"]
    out += [f"| lines in `{name}` ({files[name]} files) | {lines[name]} |" for name in sorted(lines)]
    out += [f"| lines in `autoloader/` ({len(paths)} files) | {sum(lines.values())} |",
            f"| modules over {LONG} lines | {len(long)} |",
            f"| `Any` in annotations | {sum(any_count(p) for p in paths)} |",
            f"| modules with logic without a test module of their own | {len(missing)} of {logic} |",
            f"| stale pointers | {len(stale)} |", ""]
    out += [f"Over {LONG} lines: " + ", ".join(f"`{name}` {n}" for n, name in long), ""]
    out += ["Without a test module: " + ", ".join(f"`{name}`" for name in missing)]
    out += ["", "Stale pointers: " + "; ".join(stale)] if stale else []
    return "\n".join(out)


if __name__ == "__main__":
    print(report())
