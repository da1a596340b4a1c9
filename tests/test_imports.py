"""The package's structure: every module imports on its own, and no two modules import each other (issue 12).

A module that imports only after another one has (a cycle hidden by import order, or a lazy import inside a function
that papers over one) breaks the first user who imports it directly. So each module is imported in a process where no
other autoloader module was imported yet, and the module-level imports between modules must form no cycle.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE = Path(__file__).resolve().parents[1] / "autoloader"

_ISOLATED = r"""
import importlib, json, os, sys, traceback
import numpy, psutil, torch, torch.utils.data  # third-party modules once, in the parent
failures = {}
for name in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        failures[name] = os.waitstatus_to_exitcode(status)
print(json.dumps(failures))
"""


def _modules() -> Dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(module: str, is_package: bool, level: int, target: Optional[str]) -> Optional[str]:
    if level == 0:
        return target if target and target.split(".")[0] == "autoloader" else None
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _imports_at_module_level(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The autoloader modules ``name`` imports when it is imported (not inside functions, not for type checking)."""
    tree = ast.parse(path.read_text(), str(path))
    found: Set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(body: List[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and not _under_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "autoloader")
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, is_package, node.level, node.module)
                if target is None:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in known else target)

    visit(tree.body)
    return {m for m in found if m in known and m != name}


def _cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    state: Dict[str, int] = {}
    stack: List[str] = []

    def walk(node: str) -> Optional[List[str]]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = walk(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = walk(node)
            if found:
                return found
    return None


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    graph = {name: _imports_at_module_level(name, path, set(modules)) for name, path in modules.items()}
    # a package's submodule importing the package itself is importing its __init__, which imports the submodule
    return graph


def test_every_module_imports_on_its_own():
    names = sorted(_modules())
    proc = subprocess.run([sys.executable, "-c", _ISOLATED, json.dumps(names)], capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}, proc.stderr


def test_no_import_cycle_between_modules():
    cycle = _cycle(_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_make_loader_imports_nothing_from_the_cli():
    graph = _graph()
    seen, todo = set(), ["autoloader.factory"]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    assert not {m for m in seen if m.startswith("autoloader.cli")}, sorted(seen)
