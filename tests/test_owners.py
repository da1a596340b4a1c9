"""One owner per fact (the house's rule): a fact computed in a second place drifts from the first. The stall fraction
has one formula (``loader.epochs.stall_fraction``) and the worker footprint one (``search.memory.footprint``): every
place that writes a stall fraction into a result calls the formula, and only the formula builds a ``Footprint``."""
import ast
from pathlib import Path

import autoloader

PACKAGE = Path(autoloader.__file__).resolve().parent


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), filename=str(path))


def test_every_stall_fraction_written_into_a_result_is_the_one_formulas():
    written = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "stall_fraction":
                value = node.value
                through = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
                    value.func.id == "stall_fraction"
                written.append((name, node.value.lineno, through, ast.unparse(value)))
    assert written, "no stall fraction written: the scan is broken"
    assert [w for w in written if not w[2]] == [], "a stall fraction computed outside loader.epochs.stall_fraction"
    defined = [name for name, tree in _modules() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.name == "stall_fraction"
               and not any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)]
    assert defined == ["loader/epochs.py"]


def test_only_the_footprint_formula_builds_a_footprint():
    built = []
    for name, tree in _modules():
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef):
                for node in ast.walk(function):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Footprint":
                        built.append((name, function.name))
    assert built == [("search/memory.py", "footprint")]
