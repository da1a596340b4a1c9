"""Every pointer resolves (issues 48 and 62: a name that no longer exists is a bug), in the docstrings and comments of
every ``.py`` file under ``autoloader/``, ``tests/`` and ``scripts/``, and in ``README.md`` (its code spans):

- a dotted name in double backticks (``module.name``, ``Class.attribute``, ``package.module.name``) names a module,
  class, function, attribute or instance attribute that exists; its first part must be known (one of ours, a
  library's, or one of the variable names in ``ALIASES`` and ``VARIABLES``), so a pointer into a deleted module is an
  error;
- a plain name in double backticks (``make_loader``, ``iter()``) is defined somewhere in the repository (a module,
  class, function, attribute, argument, variable, or a string the code uses as a key), or is Python's or a library's
  (``_external``);
- a ``.py`` path (``search/online_policy.py``, ``tests/loader/test_slices.py``) is a file of the repository;
- every ``NOTE [ Name ]`` referred to is written somewhere as a ``# NOTE [ Name ]`` block, in the file a reference
  names (``NOTE [ Trial timing ] in run.py``), with the paragraph it names (``NOTE [ Trial timing ], 2.``: a line
  ``# 2.`` in the block; ``NOTE [ Native thread pools ], At fork``: a line ``# At fork``);
- a module that says where it is tested (``tested on tables (tests/search/test_switching.py)``) is imported there.

Read from the source (the package is not imported); Python's and the libraries' names are read from the modules in
``INTROSPECTED``. The pointers known to be stale in files their owner is rewriting are listed, file and pointer, in
``KNOWN_STALE``: an entry that no longer matches anything fails too, so the list only shrinks."""
from __future__ import annotations

import ast
import bisect
import builtins
import importlib
import io
import keyword
import re
import sys
import tokenize
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "autoloader"
SCOPE = ("autoloader", "tests", "scripts")
README = REPO / "README.md"
NAME = re.compile(r"``([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?``")
PLAIN = re.compile(r"``([A-Za-z_]\w*)(?:\(\))?``")
README_SPAN = re.compile(r"(?<!`)`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`(?!`)")
"""In the README (markdown), a code span that is a name or a dotted name: ``make_loader``, ``loader.tuning``."""
PATH = re.compile(r"(?<![\w/.\-])((?:[\w\-]+/)*[\w\-]+\.py)(?![\w/])")
TITLE = r"([^\]]+?)"
NOTE_REF = re.compile(r"NOTE \[ " + TITLE + r" \]((?:(?:,| and) \[ [^\]]+? \])*)")
"""A NOTE reference, with the further titles one may chain: ``NOTE [ One base seed per epoch ], [ Native thread
pools ]``."""
NOTE_DEF = re.compile(r"^\s*#\s*NOTE \[ ([^\]]+?) \]\s*$", re.M)
NOTE_AT = re.compile(r"NOTE \[ ([^\]]+?) \](?:,? ?\d+\.(?:(?:,|,? and|,? or) \d+\.)*)?,? in (?:``)?([\w./]+\.py)\b")
"""A NOTE reference that names its file: ``NOTE [ Trial timing ], 2. in run.py``."""
NOTE_PARAGRAPHS = re.compile(r"NOTE \[ ([^\]]+?) \],? (\d+\.(?:(?:,|,? and|,? or) \d+\.)*)")
"""A NOTE reference that names numbered paragraphs: ``NOTE [ Online convergence ], 2. and 4.``."""
NOTE_LABEL = re.compile(r"NOTE \[ ([^\]]+?) \], ([A-Z][a-z]+(?: [a-z]+)*)\b(?! in\b)")
"""A NOTE reference that names a paragraph by the words it starts with: ``NOTE [ Native thread pools ], At fork``."""
TESTED_IN = re.compile(r"\btested\b[^.;]*?\(?((?:tests/)[\w/]+\.py)")
"""A module saying where it is tested: ``Pure functions, tested on tables (tests/search/test_switching.py)``."""
EXTERNAL = {"torch", "numpy", "np", "psutil", "multiprocessing", "threadpoolctl", "os", "sys", "time", "signal",
            "threading", "queue", "dataclasses", "typing", "json", "math", "gc", "resource", "ray", "datasets",
            "webdataset", "wds", "lightning", "accelerate", "hypothesis", "cv2", "numexpr", "matplotlib", "dist",
            "mp", "torchdata", "tf", "spdl", "faulthandler", "traceback", "logging", "random", "functools",
            "contextlib", "subprocess", "shutil", "tempfile", "pickle", "copy", "weakref", "socket", "pathlib",
            "collections", "itertools", "statistics", "errno", "mmap", "atexit", "argparse", "importlib", "inspect",
            "platform", "reduction", "h5py", "accelerator", "pa", "pyarrow", "pl", "trainer", "cpu", "memory"}
"""Modules, and the names the docs give a library's objects (``accelerator.prepare``, ``pl``, the cgroup files
``cpu.max`` and ``memory.stat``): their dotted names are the library's to check, not ours."""
FILE_SUFFIXES = {"py", "md", "json", "txt", "cfg", "toml", "pt", "png", "so", "d", "lock", "max", "stat"}
ALIASES = {"loader": "PrefetchLoader", "slicer": "EpochSlicer", "serving": "Serving", "record": "Record",
           "run": "Run", "source": "EpochSource", "part": "BatchSlice", "stage": "Stage", "window": "Window",
           "config": "LoaderConfig", "search": "Search", "spec": "Spec"}
"""What the docs' usual variable names stand for (``loader.tuning``: a ``PrefetchLoader``'s ``tuning``)."""
VARIABLES = {"self", "args", "data", "dataset", "feed", "bench", "check", "module", "limit", "ray_data", "result",
             "Class", "package"}
"""Variable names the docs use for objects of several kinds (``dataset.transform``, ``check.growth_bytes``): the first
part of a dotted name that is known, the rest not checked."""
INTROSPECTED = ("os", "signal", "resource", "multiprocessing", "multiprocessing.reduction", "collections", "time",
                "threading", "queue", "gc", "types.FrameType", "unittest.TestCase", "torch", "torch.utils.data",
                "torch.utils.data.dataloader", "torch.utils.data.dataloader._MultiProcessingDataLoaderIter",
                "torch._utils", "torch.utils.data._utils", "torch.distributed", "numpy", "numpy.random", "psutil",
                "psutil.Process")
"""Python's and the dependencies' modules (and classes) whose names a plain name may be: read with ``dir()``."""
EXTERNAL_NAMES = {
    # Linux: /proc files and fields, system calls, file systems, variables
    "Anonymous", "mincore", "pagemap", "schedstat", "PR_SET_CHILD_SUBREAPER", "PYTHONDONTWRITEBYTECODE",
    # libraries named by what they load as, or not installed in the default run
    "mkl", "libmkl_rt", "boto3", "h5py", "lmdb", "StatefulDataLoader", "SimpleShardList", "split_by_worker",
    "DataContext", "ObjectRef", "from_items", "map_batches", "streaming_split", "large_binary",
    "fit", "overfit_batches", "seed_everything", "save_state", "load_state", "end_training", "ram_budget",
}
"""Plain names of Linux and of the libraries the default run cannot read (Ray, Lightning, Accelerate, torchdata,
WebDataset, pyarrow, tf.data): named once here."""
EXTERNAL_FILES = {"train.py", "mydata.py", "dataloader.py", "worker.py", "sampler.py", "fetch.py", "queues.py",
                  "threading.py", "test/test_dataloader.py", "test/stateful_dataloader/test_state_dict.py"}
"""``.py`` files that are not the repository's: the user's script and dataset module in the README, torch's and
Python's own modules, PyTorch's and torchdata's test suites; any path under ``torch/`` is torch's."""
PLACEHOLDERS = {"...", "Name"}
"""NOTE titles the docs use to show the form (``NOTE [ Name ]``), not to point at one."""
KNOWN_STALE: Dict[Tuple[str, str], str] = {}
"""Stale pointers in files another engineer is rewriting (file, pointer as reported): what fixes each. An entry that
matches nothing fails ``test_the_known_stale_pointers_are_still_there``, so it is removed with the fix."""


def _sources() -> List[Path]:
    """Every ``.py`` file the pointers are checked in."""
    return sorted(p for folder in SCOPE for p in (REPO / folder).rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).replace(".__init__", "")


class Index:
    """What the repository defines, by short and dotted name: modules, classes (their attributes, instance ones
    included), functions and module-level names; autoloader's classes first (a test's class of the same name does not
    lend it attributes)."""

    def __init__(self) -> None:
        self.modules: Dict[str, Set[str]] = {}  # full module name -> names defined at its top level
        self.classes: Dict[str, Set[str]] = {}  # class name -> attribute names (methods, fields, self.x)
        self.bases: Dict[str, Set[str]] = {}
        self.packages: Set[str] = set()
        self.defined: Set[str] = set()  # every name the repository defines, binds or uses as a key
        ours = set()
        for path in _sources():
            module = _module_name(path)
            if path.name == "__init__.py":
                self.packages.add(module)
            tree = _tree(path)
            self.modules[module] = set(_top_level(tree))
            self.defined.update(_bound(tree, keys=path != Path(__file__).resolve()))
            self.defined.add(path.stem)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and (path.is_relative_to(ROOT) or node.name not in ours):
                    if path.is_relative_to(ROOT):
                        ours.add(node.name)
                    self.classes.setdefault(node.name, set()).update(_class_attributes(node))
                    self.bases.setdefault(node.name, set()).update(
                        b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                        if isinstance(b, (ast.Name, ast.Attribute)))
        self.short = self.short_modules()

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

    def known_first(self, first: str) -> bool:
        """Whether a dotted name's first part is one of ours, a library's, or a variable the docs use."""
        return first in self.short or first in self.classes or first in ALIASES or first in EXTERNAL or \
            first in VARIABLES or _external(first)

    def resolves(self, ref: str) -> bool:
        """Whether ``ref`` names something that exists; a name whose first part is a library's (its class, a cgroup
        file) or a variable's is not ours to check further, one whose first part nothing knows (a deleted module) is
        stale."""
        parts = ref.split(".")
        if parts[-1] in FILE_SUFFIXES:
            return True
        ours = parts[0] in self.short or parts[0] in self.classes or parts[0] in ALIASES
        if not ours:
            return self.known_first(parts[0])
        if parts[0] in EXTERNAL:
            return True
        for k in range(len(parts), 0, -1):  # the longest prefix that names a module
            for module in self.short.get(".".join(parts[:k]), []):
                if self._rest_resolves(module, parts[k:]):
                    return True
        if parts[0] in self.classes and self._in_class(parts[0], parts[1:]):
            return True
        alias = ALIASES.get(parts[0])
        return alias is not None and (len(parts) == 1 or self.class_has(alias, parts[1]))

    def resolves_plain(self, name: str) -> bool:
        return name in self.defined or name in EXTERNAL or _external(name)

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


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _external_names() -> frozenset:
    names = set(dir(builtins)) | set(keyword.kwlist) | set(sys.stdlib_module_names) | EXTERNAL_NAMES
    for dotted in INTROSPECTED:
        module, _, attr = dotted.rpartition(".")
        try:
            obj = importlib.import_module(dotted)
        except ImportError:
            obj = getattr(importlib.import_module(module), attr)
        names.update(dir(obj))
    return frozenset(names)


def _external(name: str) -> bool:
    """Python's names (builtins, keywords, standard modules), those of the modules in ``INTROSPECTED``, and
    ``EXTERNAL_NAMES``."""
    return name in _external_names()


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


def _bound(tree: ast.Module, *, keys: bool = True) -> Iterator[str]:
    """Every name ``tree`` defines or binds (functions, classes, attributes, arguments, variables, imports) and, with
    ``keys``, every string it uses that is an identifier (a key, a mode, an environment variable): what a plain name
    may point to. This file's strings are not keys: its tests name names that must resolve to nothing."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr
        elif isinstance(node, ast.alias):
            yield (node.asname or node.name).split(".")[-1]
        elif keys and isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            yield node.value


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


def _docstrings(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every docstring of ``path``, attributes' included."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) and \
                isinstance(node.body[0].value.value, str):
            yield node.body[0].lineno, node.body[0].value.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value  # an attribute's docstring


def _comments(path: Path) -> List[Tuple[int, str]]:
    """(line, text) of every comment of ``path``."""
    source = path.read_text(encoding="utf-8")
    return [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT]


def _texts(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every docstring and comment of ``path``."""
    yield from _docstrings(path)
    yield from _comments(path)


def _comment_runs(path: Path) -> Iterator[Tuple[int, str]]:
    """(first line, text) of each run of comments on consecutive lines: a NOTE reference broken across lines is read
    whole."""
    run: List[Tuple[int, str]] = []
    for line, text in _comments(path) + [(-1, "")]:
        if run and line != run[-1][0] + 1:
            yield run[0][0], "\n".join(t for _, t in run)
            run = []
        run.append((line, text))


def _joined(text: str) -> Tuple[str, Callable[[int], int]]:
    """``text`` with its lines joined by a space, each line's indent and comment mark dropped (so a backticked name or
    a NOTE title broken across a comment's lines reads whole), and the function from a position in it to the line
    (counted from 0) of ``text`` it comes from."""
    parts = [re.sub(r"^\s*#?\s*", "", line) for line in text.split("\n")]
    starts = [0]
    for part in parts[:-1]:
        starts.append(starts[-1] + len(part) + 1)
    return " ".join(parts), lambda at: bisect.bisect_right(starts, at) - 1


class Notes:
    """Where each NOTE block is written, and its text (the comment lines after its title)."""

    def __init__(self) -> None:
        self.homes: Dict[str, List[str]] = {}
        self.blocks: Dict[str, List[str]] = {}
        for path in sorted(ROOT.rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines):
                found = NOTE_DEF.match(line)
                if not found:
                    continue
                self.homes.setdefault(found.group(1), []).append(path.relative_to(REPO).as_posix())
                block = []
                for rest in lines[number + 1:]:
                    if not rest.lstrip().startswith("#"):
                        break
                    block.append(rest.strip())
                self.blocks.setdefault(found.group(1), []).extend(block)

    def has_paragraph(self, title: str, label: str) -> bool:
        """Whether NOTE ``title`` has a paragraph ``label`` (``3.``, ``At fork``) starting one of its lines."""
        mark = re.compile(r"#\s*" + re.escape(label) + (r"\s" if label[-1] == "." else r"\b"))
        return any(mark.match(line) for line in self.blocks.get(title, ()))


def _pieces(path: Path) -> Iterator[Tuple[int, str, bool, bool]]:
    """(line, text, names, notes) of what is read in ``path``: its docstrings for both, each comment for names and
    paths, each run of comments for NOTE references; the README's lines for both."""
    if path.suffix == ".md":
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            yield number, line, True, True
        return
    for line, text in _docstrings(path):
        yield line, text, True, True
    for line, text in _comments(path):
        yield line, text, True, False
    for line, text in _comment_runs(path):
        yield line, text, False, True


def _problems_in(path: Path, index: Index, notes: Notes) -> Iterator[Tuple[str, str]]:
    """(``file:line``, what is wrong) for each pointer in ``path`` that resolves to nothing."""
    markdown = path.suffix == ".md"
    name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    for start, text, names, note_refs in _pieces(path):
        for offset, line in enumerate(text.split("\n") if names else ()):
            for problem in _name_problems(line, index, markdown):
                yield f"{name}:{start + offset}", problem
        joined, lines = _joined(text)
        for at, problem in _note_problems(joined, notes) if note_refs else ():
            yield f"{name}:{start + lines(at)}", problem
        for at, problem in _tested_problems(joined, path) if names and path.is_relative_to(ROOT) else ():
            yield f"{name}:{start + lines(at)}", problem


def _name_problems(text: str, index: Index, markdown: bool) -> Iterator[str]:
    """What is wrong with the names and paths in one line."""
    for ref in README_SPAN.findall(text) if markdown else NAME.findall(text) + PLAIN.findall(text):
        if "." in ref and not index.resolves(ref):
            first = ref.split(".")[0]
            yield f"``{ref}``" + ("" if index.known_first(first) else
                                  f": nothing is named {first!r} (a deleted module?)")
        elif "." not in ref and not index.resolves_plain(ref):
            yield f"``{ref}``: defined nowhere"
    for ref in PATH.findall(text):
        if not _file_exists(ref):
            yield f"{ref}: no such file"


def _tested_problems(text: str, path: Path) -> Iterator[Tuple[int, str]]:
    """A test file ``path`` says it is tested in that does not import it."""
    for found in TESTED_IN.finditer(text):
        test_file = found.group(1)
        if _file_exists(test_file) and _module_name(path) not in _imported_modules(REPO / test_file):
            yield found.start(1), f"tested in {test_file}"


def _note_problems(text: str, notes: Notes) -> Iterator[Tuple[int, str]]:
    """(where in ``text``, what is wrong) for each NOTE reference in ``text`` that names a NOTE, a file or a paragraph
    that is not there."""
    for found in NOTE_REF.finditer(text):
        for title in [found.group(1)] + re.findall(r"\[ ([^\]]+?) \]", found.group(2)):
            title = " ".join(title.split())
            if title not in notes.homes and title not in PLACEHOLDERS:
                yield found.start(), f"NOTE [ {title} ]: written nowhere"
    for found in NOTE_AT.finditer(text):
        title, named = found.groups()
        if title in notes.homes and not any(home == named or home.endswith("/" + named) for home in notes.homes[title]):
            yield found.start(), f"NOTE [ {title} ] in {named}: it is in {', '.join(notes.homes[title])}"
    for found in NOTE_PARAGRAPHS.finditer(text):
        title, numbers = found.groups()
        for number in re.findall(r"\d+", numbers):
            if title in notes.homes and not notes.has_paragraph(title, f"{number}."):
                yield found.start(), f"NOTE [ {title} ], {number}.: it has no paragraph {number}."
    for found in NOTE_LABEL.finditer(text):
        title, label = found.groups()
        if title in notes.homes and not notes.has_paragraph(title, label):
            yield found.start(), f"NOTE [ {title} ], {label}: no paragraph starts so"


@lru_cache(maxsize=None)
def _repo_files() -> Tuple[str, ...]:
    return tuple(sorted(p.relative_to(REPO).as_posix() for folder in SCOPE + (".ci",) for p in
                        (REPO / folder).rglob("*.py")))


def _file_exists(ref: str) -> bool:
    """Whether the ``.py`` file ``ref`` (a path from the repository's root, from ``autoloader/`` or ``tests/``, or a
    file name) is the repository's, or one of ``EXTERNAL_FILES``."""
    return ref in EXTERNAL_FILES or ref.startswith("torch/") or \
        any(f == ref or f.endswith("/" + ref) for f in _repo_files())


def _imported_modules(path: Path) -> Set[str]:
    """The autoloader modules ``path`` imports, anywhere in it."""
    found: Set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


@lru_cache(maxsize=1)
def _index() -> Index:
    return Index()


@lru_cache(maxsize=1)
def _notes() -> Notes:
    return Notes()


@lru_cache(maxsize=1)
def _all_problems() -> Tuple[Tuple[str, str], ...]:
    """(``file:line``, what is wrong) for every pointer that resolves to nothing, ``KNOWN_STALE``'s included."""
    index, notes = _index(), _notes()
    return tuple(found for path in _sources() + [README] for found in _problems_in(path, index, notes))


def _stale() -> List[str]:
    """Every stale pointer, as ``file:line pointer: what is wrong``, less those in ``KNOWN_STALE``."""
    return sorted({f"{where} {problem}" for where, problem in _all_problems()
                   if (where.split(":")[0], problem) not in KNOWN_STALE})


def test_every_pointer_resolves():
    stale = _stale()
    assert stale == [], "pointers to nothing (fix the pointer, or the name it lost):\n" + "\n".join(stale)


def test_the_known_stale_pointers_are_still_there():
    """An entry of ``KNOWN_STALE`` that matches no pointer any more was fixed: remove it."""
    found = {(where.split(":")[0], problem) for where, problem in _all_problems()}
    assert set(KNOWN_STALE) - found == set()


@pytest.mark.parametrize("ref, ok", [
    ("online_policy.jump", True), ("search.online_policy.jump", True), ("autoloader.search.online_policy", True),
    ("Run.measure", True), ("Run.record", True), ("Run.settled", False), ("online.OnlineSearch", False),
    ("Window.skip", True), ("handover.hand_over", False), ("torch.utils.data.DataLoader", True),
    ("EpochSlicer.epoch", True), ("OnlineLoader.template", True), ("procs.retire", True), ("handover.nothing", False),
    ("slicer.epoch", True), ("slicer.loader", False), ("Event.set", True), ("helpers.wait_no_children", True),
    ("helpers.nothing", False), ("memory_checks.resolve_budget", False), ("dataset.transform", True)])
def test_the_resolver_tells_a_living_name_from_a_dead_one(ref, ok):
    """A pointer into a module that does not exist (a deleted one, as memory_checks here) is stale."""
    assert _index().resolves(ref) is ok


@pytest.mark.parametrize("name, ok", [("make_loader", True), ("OnlineLoader", True), ("num_workers", True),
                                      ("perf_counter", True), ("DataLoader", True), ("SIGALRM", True),
                                      ("OnlineLoaderr", False), ("retire_all_workers", False)])
def test_a_plain_name_resolves_if_anything_defines_it(name, ok):
    assert _index().resolves_plain(name) is ok


@pytest.mark.parametrize("ref, ok", [("search/online_policy.py", True), ("online_policy.py", True),
                                     ("tests/loader/test_slices.py", True), ("autoloader/tuning/slices.py", False),
                                     ("tests/test_dropin.py", False), ("torch/utils/data/sampler.py", True),
                                     ("scripts/layout_report.py", True)])
def test_a_path_resolves_to_a_file_of_the_repository(ref, ok):
    assert _file_exists(ref) is ok


@pytest.mark.parametrize("text, problems", [
    ("NOTE [ Online convergence ], 3. and 4., in search/online_policy.py", []),
    ("NOTE [ Online convergence ], 9.", ["NOTE [ Online convergence ], 9.: it has no paragraph 9."]),
    ("NOTE [ Process cleanup ], 2. and 7.", ["NOTE [ Process cleanup ], 7.: it has no paragraph 7."]),
    ("NOTE [ Native thread pools ], At fork", []),
    ("NOTE [ Native thread pools ], At dawn", ["NOTE [ Native thread pools ], At dawn: no paragraph starts so"]),
    ("NOTE [ Trial timing ] in run.py", []),
    ("NOTE [ Trial timing ], 2. in window.py",
     ["NOTE [ Trial timing ] in window.py: it is in autoloader/measure/run.py"]),
    ("NOTE [ One base seed per epoch ], [ Native thread pools ]", []),
    ("NOTE [ One base seed per epoch ], [ Native pools ]", ["NOTE [ Native pools ]: written nowhere"]),
    ("NOTE [ Hidden switch ]; the tail", []), ("NOTE [ Name ]", [])])
def test_a_note_reference_is_checked_for_its_name_file_and_paragraph(text, problems):
    assert [problem for _, problem in _note_problems(text, _notes())] == problems


def test_a_pointer_in_a_comment_broken_across_lines_is_read_whole(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("x = 1  # see NOTE [ Online\n# convergence ], 8.\n# and ``online_policy.nothing_here``\n")
    found = [problem for _, problem in _problems_in(module, _index(), _notes())]
    assert found == ["``online_policy.nothing_here``", "NOTE [ Online convergence ], 8.: it has no paragraph 8."]


def test_a_module_that_names_its_tests_is_imported_there():
    """``switching.py`` said it was tested in tests/search/test_online_policy.py, which does not import it."""
    switching = ROOT / "search" / "switching.py"
    said = "Pure functions, tested in tests/search/test_online_policy.py."
    assert [problem for _, problem in _tested_problems(said, switching)] == [
        "tested in tests/search/test_online_policy.py"]
    assert [p for p in _problems_in(switching, _index(), _notes()) if p[1].startswith("tested in")] == []
    assert [p for p in _problems_in(ROOT / "search" / "online_policy.py", _index(), _notes())
            if p[1].startswith("tested in")] == []
