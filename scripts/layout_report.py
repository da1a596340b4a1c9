"""The package's layout in numbers (issues 48 and 62), as a markdown table: lines and code lines per subpackage,
``Any`` in annotations, modules with logic but no test module of their own, imports that go up a layer, and stale
pointers.

    python scripts/layout_report.py              # the table of the working tree, then the lists behind it
    python scripts/layout_report.py --at 6ca8deb # the lines and code lines of a commit, per subpackage

The rules, stated here once:
- *lines*: every line of every ``.py`` file under ``autoloader/``; a top-level module counts as ``(top level)``.
- *code lines*: the lines that hold code (``code_lines``): not blank, not a docstring's (a module's, class's,
  function's or attribute's string standing alone), not a comment alone on its line. A line of code with a comment
  after it counts once. *with comments* counts comment lines too (a NOTE block is comments).
- *``Any`` in annotations*: each ``Any`` (a name, ``typing.Any``, or inside a string annotation) in a parameter's,
  a return's or an annotated assignment's annotation; ``Any`` elsewhere (a type alias, a ``cast``) is not counted.
- *module with logic*: a module (not ``__init__.py`` or ``__main__.py``) that defines a function or a method.
- *its own test module*: a file ``tests/**/test_<name>.py`` or ``tests/**/test_<name>_<more>.py`` (benchmarks, stress
  and integrations excluded), ``<name>`` the module's file name without a leading underscore. Where two subpackages
  hold a module of that name, only a test file in the folder mirroring the module's (``tests/<subpackage>/``, for
  ``ray/`` ``tests/ray_engine/``; ``tests/`` for a top-level module) counts.
- *imports that go up a layer*: the imports ``tests/test_imports.py`` finds going above their importer's layer
  (``LAYERS`` there), those it knows of (``KNOWN_UPWARD``) included.
- *stale pointers*: the pointers ``tests/test_pointers.py`` finds that resolve to nothing, those it knows of
  (``KNOWN_STALE``) included.
"""
from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Mapping

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autoloader"
TESTS = ROOT / "tests"
NOT_OWN_TESTS = {"benchmarks", "stress", "integrations"}
TEST_FOLDER = {"ray": "ray_engine"}


def modules() -> List[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def subpackage(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] + "/" if len(parts) > 1 else "(top level)"


_NOT_CODE = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING}


def code_lines(source: str, *, comments: bool = False) -> int:
    """The lines of ``source`` that hold code: not blank, not inside a docstring (a string standing alone as a
    statement: a module's, class's, function's or attribute's), not a comment alone on its line (with ``comments``,
    those count too)."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docstrings.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE and (comments or token.type != tokenize.COMMENT):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def sources_at(revision: str) -> Dict[Path, str]:
    """The text of every ``.py`` file under ``autoloader/`` at ``revision`` (a commit), read with git."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", revision, "--", "autoloader"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    return {ROOT / name: subprocess.run(["git", "show", f"{revision}:{name}"], cwd=ROOT, check=True,
                                        capture_output=True, text=True).stdout
            for name in names if name.endswith(".py")}


def sources_here() -> Dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in modules()}


def line_table(sources: Mapping[Path, str]) -> List[str]:
    """Rows of lines, code lines and code lines with comments, per subpackage and in all."""
    rows: Dict[str, Counter] = {}
    for path, text in sources.items():
        for name in (subpackage(path), "autoloader/"):
            row = rows.setdefault(name, Counter())
            row["files"] += 1
            row["lines"] += len(text.splitlines())
            row["code"] += code_lines(text)
            row["commented"] += code_lines(text, comments=True)
    out = ["| part | files | lines | code lines | code lines with comments |", "|---|---|---|---|---|"]
    for name in sorted(rows, key=lambda n: (n == "autoloader/", n)):
        row = rows[name]
        out.append(f"| `{name}` | {row['files']} | {row['lines']} | {row['code']} | {row['commented']} |")
    return out


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
    from test_pointers import KNOWN_STALE, _stale  # tests/test_pointers.py: the one resolver

    return _stale() + [f"{path} {pointer} (known: {why})" for (path, pointer), why in KNOWN_STALE.items()]


def upward_imports() -> List[str]:
    sys.path.insert(0, str(TESTS))
    from test_imports import KNOWN_UPWARD, _all_imports, _upward  # tests/test_imports.py: the one layer rule

    return list(_upward(_all_imports())) + [f"{a} imports {b} (known: {why})" for (a, b), why in KNOWN_UPWARD.items()]


def report() -> str:
    paths = modules()
    missing = untested()
    stale = stale_pointers()
    upward = upward_imports()
    logic = sum(has_logic(p) for p in paths)
    out = line_table(sources_here()) + [""]
    out += ["| metric | value |", "|---|---|",
            f"| `Any` in annotations | {sum(any_count(p) for p in paths)} |",
            f"| modules with logic without a test module of their own | {len(missing)} of {logic} |",
            f"| imports that go up a layer | {len(upward)} |",
            f"| stale pointers | {len(stale)} |", ""]
    out += ["Without a test module: " + ", ".join(f"`{name}`" for name in missing)]
    out += ["", "Up a layer: " + "; ".join(upward)] if upward else []
    out += ["", "Stale pointers: " + "; ".join(stale)] if stale else []
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", metavar="COMMIT", help="only the lines and code lines of autoloader/ at COMMIT")
    options = parser.parse_args()
    print("\n".join(line_table(sources_at(options.at))) if options.at else report())
