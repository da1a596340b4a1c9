"""Every code block of the README is run by a test, so the README cannot drift from the code.

- ``bash`` blocks: the install command and the test command are the ones ``.ci/run`` runs (CI runs them in a fresh
  venv); the ``$ autotune ...`` block's four commands are run.
- ``python`` blocks: executed, as written, over small stand-ins for the names they assume (``train_set``,
  ``train_step``, ``epochs``...); the distributed one in a process group of its own. Those that need Lightning,
  Accelerate, ``datasets``, WebDataset or Ray run in ``tests/integrations/test_readme_blocks.py`` with the real
  libraries.
- the output block (what ``print(loader.tuning)`` printed): the README's block is run on a dataset like the one the
  README names, and every line of the README's output must have a line of the same shape in the real output (the same
  words, any numbers: ``same_shape``); a line of ``...`` stands for lines left out.
- the module map (``autoloader/__init__.py``'s docstring, what ``python -m pydoc autoloader`` shows) lists every
  module, in dependency order; the README's table of ``NOTE [ ... ]`` blocks lists every block, each in the file that
  defines it, and no other.
- the "Measured results" table: one ratio direction (speed, higher is better) stated in its header and no time ratio
  in a row; every number in a row is in the results file the row links (``tests/benchmarks/results/``, which the
  benchmarks write); the pitch's figures are in the file it links; the five errors are among ``autotune doctor
  --help``'s; the Install table lists setup.cfg's extras as they are; no internal work-item number ("issue 22",
  "#22") in the README or a results file; the reference is in the code (``tests/test_reference.py``), and the top level
  holds only what the project's layout allows (no ``docs/``).
Each block is claimed by exactly one check below (``test_every_block_is_checked``), so a new block needs one. The
checks that run ``autotune``, a tuning of thousands of samples or torchrun are marked ``slow``: CI runs them
(``.ci/run``), the default run not.
"""
from __future__ import annotations

import configparser
import contextlib
import gc
import importlib.metadata
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Set

import pytest
import torch
from torch.utils.data import Dataset

from helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "tests" / "benchmarks" / "results"


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks(path: Path = README) -> List[Block]:
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start, i = lines[i][3:].strip(), i + 1, i + 1
            while not lines[i].startswith("```"):
                i += 1
            found.append(Block(lang, "\n".join(lines[start:i]), start))
        i += 1
    return found


def by_first_line(prefix: str) -> List[Block]:
    chosen = [b for b in blocks() if b.first.startswith(prefix)]
    assert chosen, f"no README block starts with {prefix!r}: update tests/test_readme.py with the README"
    return chosen


def _normal(line: str) -> str:
    line = re.sub(r"/\S+", "PATH", line)
    line = re.sub(r"\d[\d,.]*", "N", line)
    return " ".join(line.split())


def same_shape(readme: str, actual: str, *, words: int = 2) -> List[str]:
    """README lines with no line of the same shape in ``actual``: the first ``words`` words after numbers and paths
    are normalised (``...`` lines, table rows and blank lines are skipped: their content is measured)."""
    have = {" ".join(_normal(a).split()[:words]) for a in actual.splitlines() if a.strip()}
    missing = []
    for line in readme.splitlines():
        text = line.strip()
        if not text or text == "..." or text.startswith("$ ") or re.match(r"^[*\d]", text):
            continue
        if " ".join(_normal(text).split()[:words]) not in have:
            missing.append(line)
    return missing


def test_same_shape_ignores_numbers_but_not_words():
    assert same_shape("  tuned in 8.4 s (6 trials)", "  tuned in 12 s (3 trials)") == []
    assert same_shape("  tuned in 8.4 s", "  chosen in 8.4 s") == ["  tuned in 8.4 s"]


# ---------------------------------------------------------------- bash: the two commands

def _commands_of(prefix: str) -> List[str]:
    block = by_first_line(prefix)[0]
    assert block.lang == "bash"
    return [line for line in block.text.splitlines() if line and not line.startswith("#")]


def test_the_install_and_test_commands_are_what_ci_runs():
    install, = _commands_of("# install, then probe")
    run_tests, = _commands_of("# run the tests")
    install_and_test = [c.strip() for c in run_tests.split("&&")]
    assert install_and_test[0] == "python3 -m venv .venv" and install_and_test[1] == ". .venv/bin/activate"
    ci = (ROOT / ".ci" / "run").read_text()
    for command in install_and_test[2:]:
        assert command in ci, f"README's {command!r} is not what .ci/run runs"
    first = [c.strip() for c in install.split("&&")]
    assert first[:3] == install_and_test[:3] and first[3] == "pip install ." and first[4] == "autotune"
    assert "autotune = autoloader.cli.main:main" in (ROOT / "setup.cfg").read_text()


def test_the_readme_is_read_in_ten_minutes():
    """At most ~300 lines: what a practitioner reads first; the reference is in the docstrings."""
    assert len(README.read_text().splitlines()) <= 310


# ---------------------------------------------------------------- python blocks

class Images(Dataset):
    """uint8 3 x ``side`` x ``side`` images and labels: what ``train_set`` stands for."""

    def __init__(self, side: int = 8) -> None:
        self.side = side

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        return torch.full((3, self.side, self.side), i % 256, dtype=torch.uint8), i % 10


def _namespace(tmp_path: Path) -> Dict[str, object]:
    import time

    from autoloader import make_loader
    return {"make_loader": make_loader, "torch": torch, "Dataset": Dataset, "time": time, "os": os,
            "train_set": Images(), "remote_set": Images(), "epochs": 1, "train_step": lambda *batch: None}


def _run(block: Block, namespace: Dict[str, object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.text, f"README.md:{block.line}", "exec"), namespace)
    return out.getvalue()


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_use_it(own_cache):
    uses = by_first_line("from autoloader import make_loader")
    assert len(uses) == 1  # "Use it"
    namespace = _namespace(own_cache)
    printed = _run(uses[0], namespace)
    loader = namespace["loader"]
    assert loader.tuning.source == "online" and loader.history and "Chosen:" in printed


class Waiting(Dataset):
    """The README's sample dataset: 16,384 uint8 3x32x32 images that each wait 1 ms to load."""

    def __len__(self) -> int:
        return 16384

    def __getitem__(self, i: int):
        import time

        time.sleep(0.001)
        return torch.full((3, 32, 32), i % 256, dtype=torch.uint8), i % 10


def _five_ms_step(images, labels) -> None:
    import time

    time.sleep(0.005)


@pytest.mark.slow
def test_the_tuning_sample_has_the_shape_of_a_real_run(own_cache):
    """The README's ``print(loader.tuning)`` sample against a real run of the README's block on the dataset and step
    it names: the same lines, any numbers (a decision taken online, its table of candidates). The block runs its two
    epochs; a search that outlived them (a busy machine) is given up to four more before its decision is printed."""
    sample = by_first_line("Chosen: num_workers=")[0]
    namespace = {**_namespace(own_cache), "train_set": Waiting(), "epochs": 2, "train_step": _five_ms_step}
    try:
        _run(by_first_line("from autoloader import make_loader")[0], namespace)
        loader = namespace["loader"]
        for epoch in range(2, 6):
            if loader.decisions:
                break
            loader.set_epoch(epoch)
            for images, labels in loader:
                _five_ms_step(images, labels)
        printed = str(loader.tuning)
        assert loader.decisions, printed  # decided online, as the sample shows
        assert same_shape(sample.text, printed) == [], printed
        assert "stall %" in printed and "tuned online, in the training loop" in printed
    finally:
        namespace.clear()  # the loader and its persistent workers
        gc.collect()


def test_checkpoint_and_resume(own_cache, monkeypatch):
    block = by_first_line("torch.save({\"model\"")[0]
    monkeypatch.chdir(own_cache)
    namespace = _namespace(own_cache)
    torch.manual_seed(0)
    loader = namespace["make_loader"](namespace["train_set"], batch_size=64, shuffle=True)
    it = iter(loader)
    next(it)  # one batch of the epoch's four trained before the checkpoint
    namespace.update(loader=loader, model=torch.nn.Linear(2, 2), saved_epoch=0)
    _run(block, namespace)
    del it
    assert namespace["loader"] is not loader and namespace["loader"].stats.batches == 3  # the rest of the epoch


@pytest.mark.slow
def test_the_torchrun_example_runs_in_a_process_group(tmp_path):
    block = by_first_line("# train.py: torchrun")[0]
    # the CPU reading of the block, as its own comments say: gloo, and no CUDA device to pick
    text = block.text.replace('dist.init_process_group("nccl")', 'dist.init_process_group("gloo")')
    text = text.replace('torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))', "pass")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import os, sys, torch, torch.distributed as dist
        sys.path[:0] = [{root!r}, {tests!r}]
        from autoloader import make_loader
        from test_readme import Images
        train_set, epochs, train_step = Images(), 2, lambda *batch: None
    ''').format(root=str(ROOT), tests=str(ROOT / "tests")) + text + "\nprint('done', loader.tuning.source)\n")
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "AUTOLOADER_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", str(script)], capture_output=True,
                          text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("done") == 2


INTEGRATION_BLOCKS = ("class Model(L.LightningModule):", "accelerator = Accelerator()", "ds = datasets.load_from_disk",
                      "ds = (wds.WebDataset(", "loader = make_loader(train_set, batch_size=64, shuffle=True, drop_last=True, "
                      "step=0.02,")
"""Run with the real libraries in tests/integrations/test_readme_blocks.py."""


def test_the_integration_blocks_are_the_ones_the_integration_test_runs():
    source = (ROOT / "tests" / "integrations" / "test_readme_blocks.py").read_text()
    for index, prefix in enumerate(INTEGRATION_BLOCKS):
        assert by_first_line(prefix)
        assert f"INTEGRATION_BLOCKS[{index}]" in source, f"no integration test runs the README block {prefix!r}"


# ---------------------------------------------------------------- output blocks: `$ autotune ...`

USER_DATA = '''
import time
import torch
from torch.utils.data import Dataset

class Tiles(Dataset):
    def __len__(self):
        return 10000
    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.zeros(3, 32, 32), i % 10

def make_train_set():
    return Tiles()
'''


def _commands(block: Block) -> List[List[str]]:
    return [shlex.split(line[2:].split("  #")[0]) for line in block.text.splitlines() if line.startswith("$ ")]


def _autotune(args: List[str], cwd: Path):
    assert args[0] == "autotune", args
    return run_cli(args[1:], cwd, timeout=240)


SHORTER = {"autotune": ["--no-disk", "--budget", "8"], "tune": ["--budget", "6", "--step", "0.05"]}
"""What the test adds to the README's commands: shorter trials, no disk probe (the commands are the README's)."""


@pytest.mark.slow
def test_the_four_autotune_commands_run(tmp_path):
    """The README's ``$ autotune`` block, each command as written (with ``SHORTER``'s options), in a directory with the
    ``mydata.py`` it names: each ends with exit status 0 (``doctor``: 0, or 1 when a check of this machine fails) and
    prints what the README says it does."""
    (tmp_path / "mydata.py").write_text(USER_DATA)
    commands = _commands(by_first_line("$ autotune ")[0])
    assert [c[:2] for c in commands] == [["autotune"], ["autotune", "tune"], ["autotune", "show"],
                                         ["autotune", "doctor"]]
    said = {}
    for command in commands:
        name = command[1] if len(command) > 1 else "autotune"
        proc = _autotune(command + SHORTER.get(name, []), tmp_path)
        assert proc.returncode in ((0, 1) if name == "doctor" else (0,)), proc.stderr[-3000:]
        said[name] = proc.stdout + proc.stderr
    assert "saved the machine profile" in said["autotune"] and "Against the usual guesses" in said["autotune"]
    assert "Cached as" in said["tune"] and "make_loader(dataset, 64" in said["tune"]
    assert "Tiles" in said["show"] and "autotune doctor:" in said["doctor"]


# ---------------------------------------------------------------- the module map (autoloader/__init__.py)

def module_map_lines() -> List[str]:
    """The module map of ``autoloader/__init__.py``'s docstring (what ``python -m pydoc autoloader`` shows): the lines
    after its ``autoloader/`` line, dedented."""
    import autoloader

    lines = textwrap.dedent(autoloader.__doc__ or "").splitlines()
    heads = [i for i, line in enumerate(lines) if line.strip() == "autoloader/"]
    assert len(heads) == 1, "autoloader/__init__.py's docstring has no module map (a line 'autoloader/')"
    indent = len(lines[heads[0]]) - len(lines[heads[0]].lstrip())
    return [line[indent:] for line in lines[heads[0] + 1:]]


def development_map() -> List[str]:
    """The modules and packages the module map lists, in its order, as paths under ``autoloader/`` (``loader/``,
    ``loader/prefetch.py``)."""
    listed: List[str] = []
    folders: List[str] = []  # the packages enclosing the current line
    for line in module_map_lines():
        name = line.split()[0] if line.strip() else ""
        depth = (len(line) - len(line.lstrip())) // 2
        if not name.endswith((".py", "/")) or depth > len(folders) + 1:  # a description's continuation
            continue
        folders = folders[:depth - 1]
        listed.append("".join(folders) + name)
        if name.endswith("/"):
            folders.append(name)
    return listed


def test_the_development_map_lists_every_module_and_nothing_else():
    package = ROOT / "autoloader"
    listed = set(development_map())
    spelled_out = {name for name in listed if name.endswith("/") and any(n.startswith(name) and n != name
                                                                          for n in listed)}
    actual = {p.relative_to(package).as_posix() for p in package.glob("*.py")}
    actual |= {p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()}
    for folder in spelled_out:  # a package whose modules the map lists lists all of them, and its subpackages
        actual |= {p.relative_to(package).as_posix() for p in (package / folder).glob("*.py") if p.name != "__init__.py"}
        actual |= {p.relative_to(package).as_posix() + "/" for p in (package / folder).iterdir()
                   if (p / "__init__.py").exists()}
    assert listed == actual
    assert spelled_out >= {"loader/", "loader/resume/", "measure/", "supervise/", "search/", "tuning/", "results/"}


def _entry_of(module: str, entries: List[str]) -> str:
    """The map's entry for an autoloader module: its own line, else its nearest package's (``ray/``)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    for k in range(len(parts), 0, -1):
        for entry in ("/".join(parts[:k]) + ".py", "/".join(parts[:k]) + "/"):
            if entry in entries and (k == len(parts) or entry.endswith("/")):
                return entry
    raise AssertionError(f"{module} is not in the module map")


def upward_imports(entries: List[str], graph: Dict[str, Set[str]]) -> List[str]:
    """The imports that go up the map: a module importing one listed above it (or one listed as its own package's
    entry, below which it sits)."""
    where = {entry: i for i, entry in enumerate(entries)}
    found = []
    for module, imported in graph.items():
        for other in imported:
            a, b = _entry_of(module, entries), _entry_of(other, entries)
            if a != b and where[b] < where[a]:
                found.append(f"{module} ({a}) imports {other} ({b}), listed above it")
    return sorted(found)


def test_the_development_map_is_in_dependency_order():
    from test_imports import _graph  # the import graph, type-checking imports included

    assert upward_imports(development_map(), _graph(type_checking=True)) == []


def test_the_order_check_finds_an_upward_import():
    entries = ["factory.py", "loader/", "loader/prefetch.py", "loader/epochs.py", "ray/", "config.py"]
    graph = {"autoloader.factory": {"autoloader.loader.prefetch"}, "autoloader.loader.prefetch":
             {"autoloader.loader.epochs", "autoloader.config"}, "autoloader.ray.make": {"autoloader.ray.plan"},
             "autoloader.ray.plan": set(), "autoloader.loader.epochs": set(), "autoloader.config": set()}
    assert upward_imports(entries, graph) == []
    graph["autoloader.config"] = {"autoloader.ray.plan"}
    graph["autoloader.loader.epochs"] = {"autoloader.loader.prefetch"}
    assert upward_imports(entries, graph) == [
        "autoloader.config (config.py) imports autoloader.ray.plan (ray/), listed above it",
        "autoloader.loader.epochs (loader/epochs.py) imports autoloader.loader.prefetch (loader/prefetch.py), "
        "listed above it"]


NOTE_DEFINITION = re.compile(r"^\s*# NOTE \[ (.+?) \]\s*$", re.MULTILINE)


def note_table() -> Dict[str, List[str]]:
    """The README's table of NOTE blocks ("How it works"; cells "`file`: Name; Name"): file (under autoloader/) ->
    the blocks it lists there."""
    section = README.read_text().split("\n## How it works\n", 1)[1].split("\n## ", 1)[0]
    listed: Dict[str, List[str]] = {}
    for row in section.splitlines():
        for cell in row.strip().strip("|").split("|") if row.startswith("| `") else ():
            found = re.fullmatch(r"\s*`([^`]+)`: (.+?)\s*", cell)
            if found:
                listed[found.group(1)] = [name.strip() for name in found.group(2).split(";")]
    assert listed, "the README's How it works section has no table of NOTE blocks"
    return listed


def test_every_listed_note_is_in_the_file_it_names_and_every_note_is_listed():
    defined = {path.relative_to(ROOT / "autoloader").as_posix(): NOTE_DEFINITION.findall(path.read_text())
               for path in (ROOT / "autoloader").rglob("*.py")}
    for path, names in note_table().items():
        assert path in defined, f"README lists NOTE blocks in autoloader/{path}, which does not exist"
        missing = [name for name in names if name not in defined[path]]
        assert missing == [], f"autoloader/{path} defines no NOTE {missing} (it has {defined[path]})"
    unlisted = sorted(f"{path}: {name}" for path, names in defined.items() for name in names
                      if name not in note_table().get(path, []))
    assert unlisted == [], f"NOTE blocks the README's table does not list: {unlisted}"


def test_the_top_level_holds_only_the_projects_layout():
    allowed = {"setup.cfg", "setup.py", "autoloader", "tests", "scripts", "README.md", ".ci"}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    top = {line.split("/", 1)[0] for line in tracked.stdout.splitlines()}
    assert {name for name in top if not name.startswith(".")} <= allowed, sorted(top)


# ---------------------------------------------------------------- every block is claimed

CLAIMED = ("# install, then probe", "# run the tests", "from autoloader import make_loader", "Chosen: num_workers=",
           "torch.save({\"model\"", "# train.py: torchrun", "$ autotune ", *INTEGRATION_BLOCKS)


def test_every_claimed_block_is_run_by_a_test_here():
    """A prefix in ``CLAIMED`` is looked up by a test of this module (``by_first_line``/``_commands_of``), or run by
    the integration tests (``INTEGRATION_BLOCKS``): a claimed block no test runs would pass unseen."""
    import ast

    tree = ast.parse(Path(__file__).read_text())
    asked = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
             and getattr(node.func, "id", "") in ("by_first_line", "_commands_of")
             and isinstance(node.args[0], ast.Constant)}
    assert set(CLAIMED) - set(INTEGRATION_BLOCKS) <= asked, set(CLAIMED) - set(INTEGRATION_BLOCKS) - asked


def test_every_block_is_checked():
    unclaimed = [f"README.md:{b.line}: {b.first!r}" for b in blocks() if not b.first.startswith(CLAIMED)]
    assert unclaimed == [], "a README code block no test runs: add it to tests/test_readme.py"



# ---------------------------------------------------------------- the measured results and where they come from

NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)*")
"""A number, or a version as one (``2.11.0``)."""
LINK = re.compile(r"\[[^\]]*\]\(([^)]*)\)")


def summary_rows() -> List[str]:
    """The rows of the README's "Measured results" table, header and rule left out."""
    section = README.read_text().split("\n## Measured results\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2 and set(rows[1]) <= set("|-: "), "the Measured results section has no table"
    return rows[2:]


def appears(number: str, text: str) -> bool:
    """``number`` as a whole number in ``text``: 1.0 is not in 1.03, nor 17 in 170 or 2,17."""
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", text) is not None


def test_appears_matches_whole_numbers_only():
    assert appears("1.03", "e1 1.03-1.95") and appears("13,418", "| 13,418 |") and appears("93", "93%")
    assert not appears("1.0", "1.03") and not appears("17", "170") and not appears("418", "13,418")
    assert NUMBER.findall("torch 2.11.0+cu130, 0.54x, 1,191 MiB") == ["2.11.0", "130", "0.54", "1,191"]
    assert appears("2.11.0", "torch 2.11.0+cu130") and not appears("2.11", "torch 2.11.0+cu130")


def test_every_number_in_the_summary_is_in_the_results_file_its_row_links():
    for row in summary_rows():
        links = [link for link in LINK.findall(row) if link.startswith("tests/benchmarks/results/")]
        assert len(links) == 1, f"a summary row must link its one results file: {row}"
        source = (ROOT / links[0]).read_text()
        cited = NUMBER.findall(LINK.sub("", row))
        assert cited, f"a summary row without a number: {row}"
        missing = [number for number in cited if not appears(number, source)]
        assert missing == [], f"{links[0]} does not hold {missing}, which the README's summary row cites: {row}"


DIRECTION = "speed ratio, higher is better"
TIME_RATIO = re.compile(r"\d(?:\.\d+)?x?\s+(?:of\s+)?(?:the\s+)?[\w' .`=()-]{0,40}?\btimes?\b|\bslower\b|"
                        r"\btime ratio|\b\w+/oracle\b", re.IGNORECASE)
"""A time ratio: a ratio read against a time ("1.03x the oracle's time"), "slower", or the online table's e1/oracle
(a time over the oracle's time)."""


def time_ratios(text: str) -> List[str]:
    return [m.group(0) for m in TIME_RATIO.finditer(text)]


def test_the_time_ratio_check_finds_one_and_passes_speed_ratios():
    found = time_ratios("online epoch 1 1.00-1.03x the oracle's time")
    assert len(found) == 1 and found[0].endswith("1.03x the oracle's time")
    assert time_ratios("e1/oracle 1.02; 0.91 slower") == ["e1/oracle", "slower"]
    assert time_ratios("0.97-1.02 of the oracle on 600-batch rows; 1.88x a plain loop; in 1-14 % of one sweep's "
                       "time (a share of time, not a ratio)") == []


def test_one_ratio_direction_in_the_results():
    """Every ratio of the Measured results is a speed ratio (higher is better), as its header and the sentence above
    it say; the oracle is defined there."""
    section = README.read_text().split("\n## Measured results\n", 1)[1].split("\n## ", 1)[0]
    header = [line for line in section.splitlines() if line.startswith("|")][0]
    assert DIRECTION in header, f"the results table's header does not say {DIRECTION!r}: {header}"
    assert "**speed ratio, higher is better**" in section and "The **oracle** is the best plain `DataLoader` of a " \
        "sweep of fixed `num_workers`" in section
    for row in summary_rows():
        assert time_ratios(LINK.sub("", row).replace("tuner/sweep", "")) == [], row
    assert len(summary_rows()) <= 8
    stale = [line for line in section.splitlines() if "Not re-run since" in line or "not re-run since" in line]
    assert len(stale) == 1, "the rows not re-run since the online search are named in one place"


def test_the_pitch_figures_are_in_the_file_it_links():
    pitch = README.read_text().split("\n## ", 1)[0]
    links = [link for link in LINK.findall(pitch) if link.startswith("tests/benchmarks/results/")]
    assert len(links) == 1
    source = (ROOT / links[0]).read_text()
    cited = [n for n in NUMBER.findall(LINK.sub("", pitch.split("\n\n")[1])) if "." in n]  # the first paragraph
    assert cited and all(appears(number, source) for number in cited), cited


def test_the_five_errors_are_among_autotune_doctors():
    from autoloader.cli.main import TROUBLESHOOTING

    section = README.read_text().split("\n## The five errors users hit most\n", 1)[1].split("\n## ", 1)[0]
    entries = [line for line in section.splitlines() if line.startswith("- **")]
    assert len(entries) == 5 and "`autotune doctor --help`" in section
    for entry in entries:
        for error in re.findall(r"\*\*`([^`]+)`\*\*", entry):
            assert error in TROUBLESHOOTING, f"README's error {error!r} is not in autotune doctor --help"


def test_every_results_file_heads_each_run_with_date_versions_machine_and_load():
    files = sorted(RESULTS.glob("*.md"))
    linked = {Path(link).name for row in summary_rows() for link in LINK.findall(row)}
    assert linked <= {f.name for f in files}
    for path in files:
        runs = path.read_text().split("\n## ")[1:]
        assert runs, f"{path.name} records no run"
        for run in runs:
            for field in ("- Date:", "- Command:", "- Versions:", "- Machine:", "- Load:"):
                assert field in run, f"{path.name}, section {run.splitlines()[0]!r}: no {field!r} line"


def test_a_benchmark_run_goes_above_the_earlier_ones_and_keeps_them():
    from benchmarks.bench_results import insert_run

    old = "# Title\n\nWhat it measures.\n\n## Run of 2026-01-01\n\n| a |\n"
    new = insert_run(old, "## Run of 2026-02-02\n\n| b |\n")
    assert new == "# Title\n\nWhat it measures.\n\n## Run of 2026-02-02\n\n| b |\n\n## Run of 2026-01-01\n\n| a |\n"
    assert insert_run("# Title\n", "## Run\n") == "# Title\n\n## Run\n"


PUBLIC_ISSUES = ("pytorch", "dali", "timm")
"""Issue trackers a reader can open (PyTorch issue 13246, pytorch#190489, NVIDIA DALI issue 1415, timm issue 2781)."""


def internal_references(text: str) -> List[str]:
    """Work-item numbers of this project ("issue 22", "issue 23's", "issues 16 and 23", "#22"): a reader cannot open
    them. A number after a public tracker's name is fine."""
    found = []
    for match in re.finditer(r"(\S*)\s*\b(issues? \d+|issue's)", text, re.IGNORECASE):
        if match.group(1).lower().strip("(").rstrip(":") not in PUBLIC_ISSUES:
            found.append(match.group(2))
    for match in re.finditer(r"(\S*)#\d+", text):
        if not match.group(1).lower().rstrip("/").endswith(PUBLIC_ISSUES):
            found.append(match.group(0))
    return found


def test_internal_references_are_found_and_public_ones_are_not():
    assert internal_references("the goals are issue 22's; see #22 and issue 23") == ["issue 22", "issue 23", "#22"]
    assert internal_references("PyTorch issue 13246, pytorch#190489, NVIDIA DALI issue 1415, timm issue 2781") == []


def test_no_internal_work_item_numbers_where_users_read():
    for path in [README, *sorted(RESULTS.glob("*.md"))]:
        assert internal_references(path.read_text()) == [], path.relative_to(ROOT)


# ---------------------------------------------------------------- install and release

def test_the_install_table_lists_every_extra_as_setup_cfg_has_it():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = {name: sorted(line.strip() for line in value.splitlines() if line.strip())
              for name, value in config["options.extras_require"].items()}
    section = README.read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    table = {}
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if row.startswith("| `"):
            table[cells[0].strip("`")] = sorted(p.strip() for p in cells[1].split(", "))  # ray[data,train] is one
    assert table == extras, "README's Install table and setup.cfg's extras differ"


def test_one_version_string_and_py_typed_ships(tmp_path):
    import autoloader

    assert "version = attr: autoloader.__version__" in (ROOT / "setup.cfg").read_text()
    assert (ROOT / "autoloader" / "py.typed").is_file()
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=120)
    built = importlib.metadata.PathDistribution(tmp_path / "autoloader.egg-info")
    assert built.version == autoloader.__version__, "setup.cfg's resolved version is autoloader.__version__"
    assert "autoloader/py.typed" in built.read_text("SOURCES.txt").split(), "py.typed is not in the distribution"
    installed = importlib.metadata.distribution("autoloader")
    origin = json.loads(installed.read_text("direct_url.json") or "{}").get("url", "")
    if origin.rstrip("/") == ROOT.as_uri():  # installed from this checkout (CI): its metadata says the same
        assert installed.version == autoloader.__version__
