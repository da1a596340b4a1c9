"""The reference is in the code: every public definition has a Google-style docstring (``Args:``, ``Returns:``,
``Raises:``, and ``Attributes:`` for records) that ``help()`` and ``python -m pydoc autoloader`` show.

The public definitions are ``autoloader.__all__`` (and the public methods and properties of its classes),
``autoloader.distributed.node_decisions`` and the plots of ``autoloader.cli.plot``. For each:
- a function or method: an ``Args:`` entry for every parameter of its signature but ``self``/``cls`` (``*args`` and
  ``**kwargs`` by those names, described as a whole) and none for a parameter it does not have; ``Returns:`` unless it
  returns None; a ``Raises:`` entry for every exception its own body raises;
- a class: a docstring; for a record (a dataclass) an ``Attributes:`` entry for every field; for a class with its own
  ``__init__``, its parameters under ``Args:`` and its public instance attributes under ``Attributes:`` (in the class
  docstring), and what ``__init__`` raises under ``Raises:``;
- a property: a docstring that says what it holds (Google style documents a property as an attribute, without
  ``Returns:``).
An exception a public callable raises through its helpers is checked by calling it (``BAD_CALLS``): the exception
it raises must be one its ``Raises:`` names.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import autoloader
from autoloader import distributed
from autoloader.cli import plot

SECTION = re.compile(r"^(Args|Arguments|Attributes|Returns|Yields|Raises|Example|Examples|Note|Notes|Warning):\s*$")
ENTRY = re.compile(r"^ {4}(\*{0,2}\w+)(?: \([^)]*\))?:(?: |$)")


def sections(doc: str) -> Dict[str, List[str]]:
    """The Google-style sections of a docstring: header -> its lines (indented by 4 below the header)."""
    found: Dict[str, List[str]] = {}
    current = None
    for line in inspect.cleandoc(doc).splitlines():
        match = SECTION.match(line)
        if match:
            current = found.setdefault(match.group(1), [])
        elif current is not None and (line.startswith(" ") or not line.strip()):
            current.append(line)
        else:
            current = None
    return found


def entries(doc: str, section: str) -> List[str]:
    """The names a section describes (``name:`` or ``name (type):`` at its first indentation)."""
    return [m.group(1) for m in map(ENTRY.match, sections(doc).get(section, [])) if m]


def _raised(function: Callable[..., Any]) -> List[str]:
    """The exception classes a function's own body raises by name (``raise ValueError(...)``; not a bare ``raise``)."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return []
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id[:1].isupper():
                names.append(target.id)
    return sorted(set(names))


def _returns_none(function: Callable[..., Any]) -> bool:
    annotation = inspect.signature(function).return_annotation
    return annotation in (None, "None")


def _parameters(function: Callable[..., Any]) -> List[str]:
    names = []
    for p in inspect.signature(function).parameters.values():
        if p.name in ("self", "cls"):
            continue
        prefix = "**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else ""
        names.append(prefix + p.name)
    return names


def function_problems(name: str, function: Callable[..., Any], doc: str = None) -> List[str]:
    """What ``function``'s docstring (or ``doc``) lacks: an Args entry per parameter, Returns, Raises entries."""
    doc = doc if doc is not None else inspect.getdoc(function) or ""
    if not doc.strip():
        return [f"{name}: no docstring"]
    problems = []
    params, described = _parameters(function), entries(doc, "Args")
    problems += [f"{name}: parameter {p!r} has no Args entry" for p in params if p not in described]
    problems += [f"{name}: Args entry {d!r} is no parameter" for d in described if d not in params]
    if inspect.signature(function).return_annotation is inspect.Signature.empty:
        problems.append(f"{name}: no return annotation")
    elif not _returns_none(function) and not any(line.strip() for line in sections(doc).get("Returns", [])):
        problems.append(f"{name}: returns a value but has no Returns section")
    raises = entries(doc, "Raises")
    problems += [f"{name}: raises {e} but its Raises section does not name it" for e in _raised(function)
                 if e not in raises]
    return problems


def _public_members(cls: type) -> Iterator[Tuple[str, Any]]:
    """The public members ``cls`` defines or inherits from autoloader's own classes (``PrefetchLoader``'s from
    ``DataLoaderMirror``), nearest first; not those of a library's base class (torch's ``Dataset``)."""
    seen = set()
    for klass in cls.__mro__:
        if klass is not cls and not klass.__module__.startswith("autoloader"):
            continue
        for attr, value in vars(klass).items():
            if not attr.startswith("_") and attr not in seen:
                seen.add(attr)
                yield attr, value


def _self_attributes(init: Callable[..., Any]) -> List[str]:
    """The public attributes ``__init__`` sets on ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    return sorted({t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
                   if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                   and not t.attr.startswith("_")})


def class_problems(name: str, cls: type) -> List[str]:
    doc = cls.__doc__ or ""
    if not doc.strip():
        return [f"{name}: no docstring"]
    if issubclass(cls, BaseException):
        return []
    problems = []
    if dataclasses.is_dataclass(cls):
        fields = [f.name for f in dataclasses.fields(cls)]
        described = entries(doc, "Attributes")
        problems += [f"{name}: field {f!r} has no Attributes entry" for f in fields if f not in described]
        problems += [f"{name}: Attributes entry {d!r} is no field" for d in described if d not in fields]
    elif "__init__" in vars(cls):
        init = vars(cls)["__init__"]
        init_doc = doc + "\n" + (init.__doc__ or "")
        problems += function_problems(f"{name}.__init__", init, doc=init_doc)
        attributes = entries(doc, "Attributes")
        problems += [f"{name}: attribute {a!r} has no Attributes entry" for a in _self_attributes(init)
                     if a not in attributes]
    for attr, value in _public_members(cls):
        qualified = f"{name}.{attr}"
        if isinstance(value, property):
            if not (value.fget.__doc__ or "").strip():
                problems.append(f"{qualified}: property without a docstring")
        elif isinstance(value, (classmethod, staticmethod)):
            problems += function_problems(qualified, getattr(cls, attr))
        elif inspect.isfunction(value):
            problems += function_problems(qualified, value)
    return problems


PUBLIC: Dict[str, Any] = {**{name: getattr(autoloader, name) for name in autoloader.__all__},
                          "distributed.node_decisions": distributed.node_decisions,
                          "cli.plot.plot_online_epoch": plot.plot_online_epoch,
                          "cli.plot.plot_tune_result": plot.plot_tune_result}


def reference_problems(public: Dict[str, Any]) -> List[str]:
    problems = []
    for name, obj in public.items():
        problems += class_problems(name, obj) if inspect.isclass(obj) else function_problems(name, obj)
    return problems


def test_every_public_definition_is_documented():
    problems = reference_problems(PUBLIC)
    assert problems == [], "docstrings to complete:\n" + "\n".join(problems)


def test_the_public_classes_document_their_methods_and_properties():
    members = {f"{name}.{attr}" for name, obj in PUBLIC.items() if inspect.isclass(obj)
               for attr, _ in _public_members(obj)}
    expected = {"PrefetchLoader.state_dict", "PrefetchLoader.load_state_dict", "PrefetchLoader.set_epoch",
                "PrefetchLoader.tuning", "PrefetchLoader.decisions", "PrefetchLoader.stats",
                "EpochStats.stall_fraction", "LoaderConfig.loader_kwargs", "TuneResult.from_dict", "TrialResult.ok",
                "MachineProfile.to_dict"}
    assert expected <= members  # the walk reaches them, so test_every_public_definition_is_documented checks them


def entry_texts(doc: str, section: str) -> Dict[str, str]:
    """Each entry of a section with its whole text (continuation lines joined)."""
    texts: Dict[str, str] = {}
    current = None
    for line in sections(doc).get(section, []):
        match = ENTRY.match(line)
        if match:
            current = match.group(1)
            texts[current] = line[match.end():]
        elif current is not None:
            texts[current] += " " + line.strip()
    return texts


FILE_AS_DEFAULT = re.compile(r"[Dd]efault[^.;]*?[\w/]+\.py\b")


def default_problems(name: str, function: Callable[..., Any], doc: str = None) -> List[str]:
    """Each parameter with a default must say it in its Args entry ("default"), as a value, not as a file to read."""
    doc = doc if doc is not None else inspect.getdoc(function) or ""
    texts = entry_texts(doc, "Args")
    problems = []
    for p in inspect.signature(function).parameters.values():
        if p.default is inspect.Parameter.empty or p.name in ("self", "cls"):
            continue
        text = texts.get(p.name, "")
        if not re.search(r"default", text, re.IGNORECASE):
            problems.append(f"{name}: {p.name}={p.default!r}: its Args entry states no default")
        elif FILE_AS_DEFAULT.search(text):
            problems.append(f"{name}: {p.name}: its default is a file to read, not a value: {text.strip()[:80]}")
    return problems


def test_every_default_is_stated_as_a_value():
    """What ``python -m pydoc autoloader`` shows states every default: the value, or what None stands for."""
    problems = []
    for name, obj in PUBLIC.items():
        if not inspect.isclass(obj):
            problems += default_problems(name, obj)
            continue
        if "__init__" in vars(obj) and not dataclasses.is_dataclass(obj):
            init = vars(obj)["__init__"]
            problems += default_problems(name, init, doc=(obj.__doc__ or "") + "\n" + (init.__doc__ or ""))
        for attr, value in _public_members(obj):
            function = getattr(obj, attr) if isinstance(value, (classmethod, staticmethod)) else value
            if inspect.isfunction(function) or inspect.ismethod(function):
                problems += default_problems(f"{name}.{attr}", function)
    assert problems == [], "\n".join(problems)


def test_the_default_check_finds_a_missing_default_and_a_file():
    def f(a: int, b: int = 1, c: Any = None, d: int = 2) -> None:
        """F.

        Args:
            a: Required.
            b: Stated (default 1).
            c: Where it goes (default: ``autoloader/search/bounds.py``).
            d: Not stated.
        """
    assert default_problems("f", f) == ["f: c: its default is a file to read, not a value: Where it goes (default: "
                                        "``autoloader/search/bounds.py``).", "f: d=2: its Args entry states no default"]


# ---------------------------------------------------------------- the check finds what is missing

def _undocumented(a: int, b: int, *rest: int, **kwargs: Any) -> int:
    """A function whose docstring misses ``b`` and ``*rest``, describes ``c``, has no Returns and no Raises.

    Args:
        a: The first.
        c (int): Not a parameter.
        **kwargs: Anything else.
    """
    if a < 0:
        raise ValueError("a must be >= 0")
    return a + b


@dataclasses.dataclass
class _Record:
    """A record whose docstring misses a field.

    Attributes:
        kept: Described.
    """

    kept: int
    missed: int


def test_the_check_finds_each_missing_entry():
    assert function_problems("f", _undocumented) == [
        "f: parameter 'b' has no Args entry", "f: parameter '*rest' has no Args entry",
        "f: Args entry 'c' is no parameter", "f: returns a value but has no Returns section",
        "f: raises ValueError but its Raises section does not name it"]
    assert class_problems("R", _Record) == ["R: field 'missed' has no Attributes entry"]


def test_removing_an_entry_from_make_loader_fails_the_check(monkeypatch):
    doc = autoloader.make_loader.__doc__
    monkeypatch.setattr(autoloader.make_loader, "__doc__", re.sub(r"\n        memory_budget: .*?(?=\n        \w)", "",
                                                                     doc, flags=re.S))
    assert reference_problems({"make_loader": autoloader.make_loader}) == [
        "make_loader: parameter 'memory_budget' has no Args entry"]


# ---------------------------------------------------------------- exceptions raised through helpers

class _Squares(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i * i])


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


def _loader() -> autoloader.PrefetchLoader:
    return autoloader.PrefetchLoader(DataLoader(_Squares(), batch_size=2), device="cpu")


BAD_CALLS: List[Tuple[str, Callable[[], Any], Callable[[], Any]]] = [
    ("make_loader", lambda: autoloader.make_loader, lambda: autoloader.make_loader(_Squares(), batch_size=0)),
    ("make_loader", lambda: autoloader.make_loader, lambda: autoloader.make_loader(_Squares(), batch_size=8.0)),
    ("make_loader", lambda: autoloader.make_loader, lambda: autoloader.make_loader(_Squares(), num_worker=2)),
    ("make_loader", lambda: autoloader.make_loader, lambda: autoloader.make_loader(_Squares(), memory_budget=2.0)),
    ("make_loader", lambda: autoloader.make_loader, lambda: autoloader.make_loader(_Squares(), tuning="fast")),
    ("make_loader", lambda: autoloader.make_loader, lambda: autoloader.make_loader(_Stream(), threads=2)),
    ("tune", lambda: autoloader.tune, lambda: autoloader.tune(_Squares(), batch_size=0)),
    ("tune", lambda: autoloader.tune, lambda: autoloader.tune(_Squares(), step="fast")),
    ("PrefetchLoader", lambda: autoloader.PrefetchLoader, lambda: autoloader.PrefetchLoader(object())),
    ("PrefetchLoader", lambda: autoloader.PrefetchLoader, lambda: autoloader.PrefetchLoader([], device="tpu")),
    ("PrefetchLoader", lambda: autoloader.PrefetchLoader, lambda: autoloader.PrefetchLoader([], normalize=(1, 0))),
    ("PrefetchLoader.set_epoch", lambda: autoloader.PrefetchLoader.set_epoch, lambda: _loader().set_epoch("1")),
    ("PrefetchLoader.load_state_dict", lambda: autoloader.PrefetchLoader.load_state_dict,
     lambda: _loader().load_state_dict({"format": 0})),
    ("ThreadedDataset", lambda: autoloader.ThreadedDataset,
     lambda: autoloader.ThreadedDataset(_Squares(), threads=0)),
    ("ThreadedDataset", lambda: autoloader.ThreadedDataset, lambda: autoloader.ThreadedDataset(_Stream(), threads=2)),
    ("with_threads", lambda: autoloader.with_threads, lambda: autoloader.with_threads(_Squares(), "2")),
    ("LoaderConfig", lambda: autoloader.LoaderConfig, lambda: autoloader.LoaderConfig(num_workers=-1)),
    ("LoaderConfig", lambda: autoloader.LoaderConfig, lambda: autoloader.LoaderConfig(0, pin_memory="yes")),
    ("LoaderConfig.from_dict", lambda: autoloader.LoaderConfig.from_dict,
     lambda: autoloader.LoaderConfig.from_dict({"workers": 2})),
    ("TuneResult.from_dict", lambda: autoloader.TuneResult.from_dict,
     lambda: autoloader.TuneResult.from_dict({"nope": 1})),
    ("MachineProfile.from_dict", lambda: autoloader.MachineProfile.from_dict,
     lambda: autoloader.MachineProfile.from_dict({})),
    ("probe_machine", lambda: autoloader.probe_machine, lambda: autoloader.probe_machine(disk="yes")),
    ("probe_machine", lambda: autoloader.probe_machine, lambda: autoloader.probe_machine(disk_seconds=0)),
    ("distributed.node_decisions", lambda: distributed.node_decisions, lambda: distributed.node_decisions(None)),
]


@pytest.mark.parametrize("name, documented, call", BAD_CALLS, ids=[f"{n}-{i}" for i, (n, _, _) in
                                                                    enumerate(BAD_CALLS)])
def test_what_a_bad_call_raises_is_in_its_raises_section(name, documented, call, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(tmp_path))
    with pytest.raises(Exception) as caught:
        call()
    assert caught.type.__name__ in entries(inspect.getdoc(documented()) or "", "Raises"), \
        f"{name} raised {caught.type.__name__} ({caught.value}), which its Raises section does not name"
