"""Every pointer in autoloader's docstrings and comments resolves (issue 48: a name that no longer exists is a bug):
each dotted name in double backticks (``module.name``, ``Class.attribute``, ``package.module.name``) names a module,
class, function, attribute or instance attribute that exists, and every ``NOTE [ Name ]`` a reference points to is
written somewhere as a ``# NOTE [ Name ]`` block. Read from the source (no import), so a test module can run it fast."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent / "autoloader"
NAME = re.compile(r"``([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?``")
NOTE_REF = re.compile(r"NOTE \[ ([^\]]+?) \]")
NOTE_DEF = re.compile(r"^\s*#\s*NOTE \[ ([^\]]+?) \]\s*$", re.M)
NOTE_AT = re.compile(r"NOTE \[ ([^\]]+?) \](?:,? ?[\d.]+)?,? in (?:``)?([\w./]+\.py)\b")
"""A NOTE reference that names its file: ``NOTE [ Trial timing ], 2. in run.py``."""
EXTERNAL = {"torch", "numpy", "np", "psutil", "multiprocessing", "threadpoolctl", "os", "sys", "time", "signal",
            "threading", "queue", "dataclasses", "typing", "json", "math", "gc", "resource", "ray", "datasets",
            "webdataset", "wds", "lightning", "accelerate", "hypothesis", "cv2", "numexpr", "matplotlib", "dist",
            "mp", "torchdata", "tf", "spdl", "faulthandler", "traceback", "logging", "random", "functools",
            "contextlib", "subprocess", "shutil", "tempfile", "pickle", "copy", "weakref", "socket", "pathlib",
            "collections", "itertools", "statistics", "errno", "mmap", "atexit", "argparse", "importlib", "inspect"}
FILE_SUFFIXES = {"py", "md", "json", "txt", "cfg", "toml", "pt", "png", "so", "d", "lock"}
ALIASES = {"loader": "PrefetchLoader", "slicer": "EpochSlicer", "serving": "Serving", "record": "Record",
           "run": "Run", "source": "EpochSource", "part": "BatchSlice", "stage": "Stage", "window": "Window",
           "config": "LoaderConfig", "search": "Search"}
"""What the docs' usual variable names stand for (``loader.tuning``: a ``PrefetchLoader``'s ``tuning``)."""


class Index:
    """What autoloader defines, by short and dotted name: modules, classes (their attributes, instance ones
    included), functions and module-level names."""

    def __init__(self) -> None:
        self.modules: Dict[str, Set[str]] = {}  # full module name -> names defined at its top level
        self.classes: Dict[str, Set[str]] = {}  # class name -> attribute names (methods, fields, self.x)
        self.bases: Dict[str, Set[str]] = {}
        self.packages: Set[str] = set()
        for path in sorted(ROOT.rglob("*.py")):
            module = ".".join(("autoloader",) + path.relative_to(ROOT).with_suffix("").parts).replace(".__init__", "")
            if path.name == "__init__.py":
                self.packages.add(module)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            self.modules[module] = set(_top_level(tree))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, set()).update(_class_attributes(node))
                    self.bases.setdefault(node.name, set()).update(
                        b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                        if isinstance(b, (ast.Name, ast.Attribute)))

    def short_modules(self) -> Dict[str, List[str]]:
        found: Dict[str, List[str]] = {}
        for module in self.modules:
            parts = module.split(".")
            for k in range(1, len(parts) + 1):
                found.setdefault(".".join(parts[-k:]), []).append(module)
        return found

    def class_has(self, cls: str, attr: str, seen: Set[str] = frozenset()) -> bool:  # type: ignore[assignment]
        if attr in self.classes.get(cls, ()):
            return True
        return any(self.class_has(base, attr, seen | {cls}) for base in self.bases.get(cls, ()) if base not in seen)

    def resolves(self, ref: str) -> bool:
        """Whether ``ref`` names something autoloader defines; a name whose first part autoloader does not define (a
        library's class, a cgroup file, the user's variable) is not autoloader's to check."""
        parts = ref.split(".")
        short = self.short_modules()
        ours = parts[0] in short or parts[0] in self.classes or parts[0] in ALIASES
        if not ours or parts[0] in EXTERNAL or parts[-1] in FILE_SUFFIXES:
            return True
        for k in range(len(parts), 0, -1):  # the longest prefix that names a module
            for module in short.get(".".join(parts[:k]), []):
                if self._rest_resolves(module, parts[k:]):
                    return True
        if parts[0] in self.classes and self._in_class(parts[0], parts[1:]):
            return True
        alias = ALIASES.get(parts[0])
        return alias is not None and (len(parts) == 1 or self.class_has(alias, parts[1]))

    def _rest_resolves(self, module: str, rest: List[str]) -> bool:
        if not rest:
            return True
        if f"{module}.{rest[0]}" in self.modules:
            return self._rest_resolves(f"{module}.{rest[0]}", rest[1:])
        if rest[0] not in self.modules[module]:
            return False
        return len(rest) == 1 or (rest[0] in self.classes and self._in_class(rest[0], rest[1:]))

    def _in_class(self, cls: str, rest: List[str]) -> bool:
        return not rest or (self.class_has(cls, rest[0]) and (len(rest) == 1 or rest[0] in self.classes and
                                                               self._in_class(rest[0], rest[1:])))


def _assigned(node: ast.stmt) -> Iterator[ast.AST]:
    """Every node inside the targets of an assignment (``a = ``, ``a: int = ``, ``self.a, b = ``)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    for target in targets:
        yield from ast.walk(target)


def _top_level(tree: ast.Module) -> Iterator[str]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            yield from (name.id for name in _assigned(node) if isinstance(name, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield (alias.asname or alias.name).split(".")[0]
        elif isinstance(node, ast.If):
            yield from _top_level(ast.Module(body=node.body + node.orelse, type_ignores=[]))


def _class_attributes(node: ast.ClassDef) -> Iterator[str]:
    for item in ast.walk(node):
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield item.name
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            for name in _assigned(item):
                if isinstance(name, ast.Name):
                    yield name.id
                elif isinstance(name, ast.Attribute) and isinstance(name.value, ast.Name) and name.value.id == "self":
                    yield name.attr


def _texts(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every docstring and comment of ``path``."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) and \
                isinstance(node.body[0].value.value, str):
            yield node.body[0].lineno, node.body[0].value.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value  # an attribute's docstring
    for number, line in enumerate(source.splitlines(), 1):
        if "#" in line:
            yield number, line[line.index("#"):]


def _joined(text: str) -> str:
    """Backticked names and NOTE titles broken across a comment's lines, joined again."""
    return re.sub(r"\s*\n\s*#?\s*", " ", text)


def _stale() -> Tuple[List[str], List[str]]:
    index = Index()
    homes: Dict[str, List[str]] = {}
    for path in ROOT.rglob("*.py"):
        for title in NOTE_DEF.findall(path.read_text(encoding="utf-8")):
            homes.setdefault(title, []).append(path.relative_to(ROOT.parent).as_posix())
    notes = set(homes)
    names, missing_notes = [], []
    for path in sorted(ROOT.rglob("*.py")):
        where = path.relative_to(ROOT.parent)
        for line, text in _texts(path):
            for ref in NAME.findall(text):
                if not index.resolves(ref):
                    names.append(f"{where}:{line} ``{ref}``")
            for title in NOTE_REF.findall(_joined(text)):
                title = " ".join(title.split())
                if title not in notes:
                    missing_notes.append(f"{where}:{line} NOTE [ {title} ]")
            for title, named in NOTE_AT.findall(_joined(text)):
                title = " ".join(title.split())
                if title in notes and not any(home == named or home.endswith("/" + named) for home in homes[title]):
                    missing_notes.append(f"{where}:{line} NOTE [ {title} ] in {named}: it is in "
                                         f"{', '.join(homes[title])}")
    return sorted(set(names)), sorted(set(missing_notes))


def test_every_dotted_name_in_a_docstring_or_comment_exists():
    names, _ = _stale()
    assert names == [], "pointers to names that do not exist:\n" + "\n".join(names)


def test_every_note_referred_to_is_written():
    _, notes = _stale()
    assert notes == [], "NOTE blocks referred to but nowhere written:\n" + "\n".join(notes)


@pytest.mark.parametrize("ref, ok", [
    ("online_policy.jump", True), ("search.online_policy.jump", True), ("autoloader.search.online_policy", True),
    ("Run.measure", True), ("Run.record", True), ("Run.settled", False), ("online.OnlineSearch", False),
    ("Window.skip", True), ("handover.hand_over", False), ("torch.utils.data.DataLoader", True),
    ("EpochSlicer.epoch", True), ("OnlineLoader.template", True), ("procs.retire", True), ("handover.nothing", False),
    ("slicer.epoch", True), ("slicer.loader", False), ("Event.set", True)])
def test_the_resolver_tells_a_living_name_from_a_dead_one(ref, ok):
    assert Index().resolves(ref) is ok


@pytest.mark.parametrize("text, found", [
    ("(NOTE [ Trial timing ], 5. in run.py)", [("Trial timing", "run.py")]),
    ("NOTE [ What frameworks read ] in ``autoloader/loader/mirror.py``", [("What frameworks read",
                                                                           "autoloader/loader/mirror.py")]),
    ("NOTE [ Online convergence ], 2., in search/online_policy.py", [("Online convergence",
                                                                      "search/online_policy.py")]),
    ("NOTE [ Hidden switch ]; the tail", [])])
def test_a_note_reference_that_names_its_file_is_read_with_the_file(text, found):
    """The reference's file is checked against where the NOTE is written (``_stale``)."""
    assert NOTE_AT.findall(text) == found
