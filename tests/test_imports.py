"""The package's structure: every module imports on its own, no two modules import each other (issue 12), and the
layout stays shallow and readable (issue 20).

A module that imports only after another one has (a cycle hidden by import order, or a lazy import inside a function
that papers over one) breaks the first user who imports it directly. So each module is imported in a process where no
other autoloader module was imported yet, and the imports between modules, those for type checking included, must
form no cycle. The longest chain of imports inside the package stays within ``MAX_DEPTH`` modules, and no function
grows past ``MAX_LINES`` lines or ``MAX_PARAMS`` parameters, apart from the public signatures in ``PUBLIC``.
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
sys.dont_write_bytecode, sys.pycache_prefix = False, sys.argv[2]  # each module compiled once, not in every child
names, failures, running = json.loads(sys.argv[1]), {}, {}
def reap():
    pid, status = os.wait()
    if os.waitstatus_to_exitcode(status) != 0:
        failures[running[pid]] = os.waitstatus_to_exitcode(status)
    del running[pid]
for name in names:
    if len(running) >= len(os.sched_getaffinity(0)):
        reap()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    running[pid] = name
while running:
    reap()
print(json.dumps(failures))
"""
"""Imports each module named in ``argv[1]`` in a child forked before any autoloader module was imported, as many at
once as there are usable CPUs; prints the modules whose import failed. Bytecode goes under ``argv[2]``, so an
environment with ``PYTHONDONTWRITEBYTECODE`` does not compile every module again in each child."""


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


MAX_DEPTH = 10
MAX_LINES = 60
MAX_PARAMS = 8
PUBLIC = {"autoloader.factory.make_loader", "autoloader.tuning.trials.tune", "autoloader.request.Request.checked"}
"""Signatures that mirror ``make_loader``'s keyword arguments (the user's API), exempt from ``MAX_PARAMS``."""


def _imports_at_module_level(name: str, path: Path, known: Set[str], *, type_checking: bool = False) -> Set[str]:
    """The autoloader modules ``name`` imports when it is imported (not inside functions; those for type checking
    only with ``type_checking``)."""
    tree = ast.parse(path.read_text(), str(path))
    found: Set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(body: List[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and (type_checking or not _under_type_checking(node)):
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


def _graph(*, type_checking: bool = False) -> Dict[str, Set[str]]:
    modules = _modules()
    graph = {name: _imports_at_module_level(name, path, set(modules), type_checking=type_checking)
             for name, path in modules.items()}
    # a package's submodule importing the package itself is importing its __init__, which imports the submodule
    return graph


def test_every_module_imports_on_its_own(tmp_path):
    names = sorted(_modules())
    proc = subprocess.run([sys.executable, "-c", _ISOLATED, json.dumps(names), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}, proc.stderr


def test_no_import_cycle_between_modules():
    cycle = _cycle(_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_no_import_cycle_even_for_type_checking():
    cycle = _cycle(_graph(type_checking=True))
    assert cycle is None, f"import cycle (type-checking imports included): {' -> '.join(cycle)}"


def _longest_chain(graph: Dict[str, Set[str]]) -> List[str]:
    """The longest path of imports (the graph has no cycle)."""
    best: Dict[str, List[str]] = {}

    def longest(node: str) -> List[str]:
        if node not in best:
            tails = [longest(nxt) for nxt in graph[node]]
            best[node] = [node] + max(tails, key=len, default=[])
        return best[node]

    return max((longest(node) for node in graph), key=len)


def _reexports() -> Set[str]:
    """The packages whose ``__init__`` only names what its modules define (a docstring, imports, ``__all__``)."""
    found = set()
    for name, path in _modules().items():
        if path.name == "__init__.py":
            body = ast.parse(path.read_text()).body
            if all(isinstance(node, (ast.Import, ast.ImportFrom)) or isinstance(node, ast.Expr) and
                   isinstance(node.value, ast.Constant) or isinstance(node, ast.Assign) and
                   [getattr(t, "id", None) for t in node.targets] == ["__all__"] for node in body):
                found.add(name)
    return found


def _through(graph: Dict[str, Set[str]], transparent: Set[str]) -> Dict[str, Set[str]]:
    """The graph with each ``transparent`` package replaced by what it imports: importing a name through a package
    that only re-exports it is importing the module that defines it, not one module more."""
    def targets(node: str, seen: Set[str]) -> Set[str]:
        if node not in transparent or node in seen:
            return {node}
        return set().union(*(targets(n, seen | {node}) for n in graph[node])) if graph[node] else set()

    return {node: set().union(*(targets(n, set()) for n in deps)) if deps else set()
            for node, deps in graph.items() if node not in transparent}


def test_longest_import_chain_is_short():
    chain = _longest_chain(_through(_graph(type_checking=True), _reexports()))
    assert len(chain) <= MAX_DEPTH, f"{len(chain)} modules deep: {' -> '.join(chain)}"


def test_the_chain_measure_counts_modules():
    assert _longest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == ["a", "b", "c"]
    assert _longest_chain(_through({"a": {"p"}, "p": {"b"}, "b": {"c"}, "c": set()}, {"p"})) == ["a", "b", "c"]
    assert "autoloader.results" in _reexports() and "autoloader" not in _reexports()


def _functions(tree: ast.AST, prefix: str):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}.{node.name}", node
            yield from _functions(node, f"{prefix}.{node.name}")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}.{node.name}")


def _too_big() -> List[str]:
    found = []
    for module, path in _modules().items():
        for name, node in _functions(ast.parse(path.read_text()), module):
            args = node.args
            params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
            lines = node.end_lineno - node.lineno + 1
            body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) and \
                isinstance(getattr(node.body[0], "value", None), ast.Constant) else node.body
            code_lines = (body[-1].end_lineno - body[0].lineno + 1) if body else 0
            if name not in PUBLIC and len(params) > MAX_PARAMS:
                found.append(f"{name}: {len(params)} parameters")
            if code_lines > MAX_LINES:
                found.append(f"{name}: {code_lines} lines of code ({lines} with its docstring)")
    return found


def test_no_function_too_long_or_with_too_many_parameters():
    assert _too_big() == []


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
