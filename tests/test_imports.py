"""The package's structure: every module imports on its own, no two modules import each other (issue 12), and every
module imports only from its own layer or below (issue 62: layers, not sizes; they replaced a cap on the import chain's
depth, which split modules along no seam).

A module that imports only after another one has (a cycle hidden by import order, or a lazy import inside a function
that papers over one) breaks the first user who imports it directly. So each module is imported in a process where no
other autoloader module was imported yet, and the imports between modules, those for type checking included, must
form no cycle. ``LAYERS`` orders the package's parts (a subpackage, or a top-level module) from the facts up to the
command line: an import, wherever it is written (at the top, for type checking, inside a function), goes to the
importer's own layer or a lower one, so data flows one way. No function grows past ``MAX_LINES`` lines or
``MAX_PARAMS`` parameters, apart from the public signatures in ``PUBLIC``.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

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


LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("errors", "_fs", "_text", "config", "consumer", "_shards", "nodes", "sharding"),  # import nothing of ours
    ("probe", "coordination"),  # facts about the machine; the ranks' exchanges
    ("results",),  # the records: TrialResult, TuneResult, Decision
    ("distributed",),  # the ranks: one decision per node, states gathered
    ("loader",),  # what runs during training
    ("supervise", "_validate"),  # worker processes started, guarded and reaped; argument checks
    ("request",),  # make_loader's arguments, checked once
    ("measure",),  # measuring one candidate
    ("search",),  # deciding what to try and what to keep
    ("cache",),  # the decisions kept per dataset and machine (whether one still fits is search's rule)
    ("tuning", "ray", "report"),  # the two tuning modes; the Ray engine; the reports
    ("factory",),  # make_loader
    ("cli", "__init__"),  # the autotune command; the public API
)
"""The package's parts, bottom up: a module imports from its own part, its own layer, or a layer below. A part is a
subpackage (``loader``) or a top-level module (``config``); ``__init__`` is the package's own ``__init__.py``.
Derived from the imports at 00d8bbd (each part as low as what it imports allows), then fixed: a new import that goes
up fails."""
KNOWN_UPWARD: Dict[Tuple[str, str], str] = {}
"""Imports that go up a layer, (importer, imported) with the issue that removes each. Empty: a new one is a design
change, to be made in ``LAYERS`` (with its reason) or not at all."""
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


def _part(module: str) -> str:
    """The part of ``LAYERS`` a module belongs to: ``autoloader.loader.prefetch`` -> ``loader``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer_of() -> Dict[str, int]:
    return {part: level for level, parts in enumerate(LAYERS) for part in parts}


def _imports_anywhere(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The autoloader modules ``name`` imports anywhere: at its top, for type checking, inside a function."""
    found: Set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "autoloader")
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, is_package, node.level, node.module)
            if target is not None:
                found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names)
    return {m for m in found if m in known and m != name}


def _all_imports() -> Dict[str, Set[str]]:
    modules = _all_modules()
    return {name: _imports_anywhere(name, path, set(modules)) for name, path in modules.items()}


def _all_modules() -> Dict[str, Path]:
    """Every module, ``__main__``s included (``_modules`` leaves them out: they run, they are not imported)."""
    names = dict(_modules())
    for path in PACKAGE.rglob("__main__.py"):
        names[".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)] = path
    return names


def _upward(graph: Dict[str, Set[str]]) -> Iterator[str]:
    """Each import in ``graph`` that goes to a higher layer than its importer's, as ``importer (part, layer) imports
    imported (part, layer)``, and each module whose part ``LAYERS`` does not place."""
    layer = _layer_of()
    for module, imported in sorted(graph.items()):
        if _part(module) not in layer:
            yield f"{module}: its part {_part(module)!r} is in no layer of LAYERS"
            continue
        for other in sorted(imported):
            mine, theirs = layer[_part(module)], layer.get(_part(other), -1)
            if theirs > mine and (module, other) not in KNOWN_UPWARD:
                yield f"{module} ({_part(module)}, layer {mine}) imports {other} ({_part(other)}, layer {theirs})"


def test_every_module_imports_only_from_its_layer_or_below():
    upward = list(_upward(_all_imports()))
    assert upward == [], "imports that go up a layer (LAYERS):\n" + "\n".join(upward)


def test_every_part_of_the_layers_exists_once():
    parts = [part for level in LAYERS for part in level]
    assert len(parts) == len(set(parts)), "a part is in two layers"
    assert set(parts) == {_part(module) for module in _all_modules()}


def test_the_known_upward_imports_are_still_there():
    """An entry of ``KNOWN_UPWARD`` whose import is gone was fixed: remove it."""
    graph = _all_imports()
    assert [pair for pair in KNOWN_UPWARD if pair[1] not in graph.get(pair[0], set())] == []


def test_the_layer_check_finds_an_upward_import(tmp_path):
    """A lazy import inside a function counts as much as one at the top: the loader reaching for the tuning is
    refused, the tuning reaching for the loader is not."""
    fake = tmp_path / "prefetch.py"
    fake.write_text("import torch\n\n\ndef serve():\n    from ..tuning.online import OnlineLoader\n")
    known = {"autoloader.loader.prefetch", "autoloader.tuning.online", "autoloader.loader.epochs"}
    graph = {"autoloader.loader.prefetch": _imports_anywhere("autoloader.loader.prefetch", fake, known),
             "autoloader.tuning.online": {"autoloader.loader.epochs"}, "autoloader.loader.epochs": set()}
    assert graph["autoloader.loader.prefetch"] == {"autoloader.tuning.online"}
    assert list(_upward(graph)) == ["autoloader.loader.prefetch (loader, layer 4) imports autoloader.tuning.online "
                                    "(tuning, layer 10)"]
    graph["autoloader.newpart.thing"] = set()
    assert "autoloader.newpart.thing: its part 'newpart' is in no layer of LAYERS" in list(_upward(graph))


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
