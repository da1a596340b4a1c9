"""Every code block of the README is run by a test, so the README cannot drift from the code.

- ``bash`` blocks: the two commands of the quick start are the ones ``.ci/run`` runs (CI runs them in a fresh venv).
- ``python`` blocks: executed, as written, over small stand-ins for the names they assume (``train_set``,
  ``train_step``, ``epochs``...); the distributed one in a process group of its own. Those that need Lightning,
  Accelerate, ``datasets`` or WebDataset run in ``tests/integrations/test_readme_blocks.py`` with the real libraries.
- output blocks (a ``$ command`` then what it prints, or what the python block above printed): the command is run
  and every line of the README's output must have a line of the same shape in the real output (the same words, any
  numbers: ``same_shape``); a line of ``...`` stands for lines left out. The Development map must list every module,
  and its table of ``NOTE [ ... ]`` blocks every block, each in the file that defines it.
- the "Measured results" table: every number in a row is in the results file the row links
  (``tests/benchmarks/results/``, which the benchmarks write); the Install table lists setup.cfg's extras as they are;
  no internal work-item number ("issue 22", "#22") in the README or a results file; the reference is in the code
  (``tests/test_reference.py``), and the top level holds only what the project's layout allows (no ``docs/``).
Each block is claimed by exactly one check below (``test_every_block_is_checked``), so a new block needs one. The
checks that run ``autotune``, trials or torchrun are marked ``slow``: CI runs them (``.ci/run``), the default run
not.
"""
from __future__ import annotations

import configparser
import contextlib
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

def test_the_quick_start_commands_are_what_ci_runs():
    block = by_first_line("# 1. install")[0]
    commands = [line for line in block.text.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text()
    install_and_test = [c.strip() for c in commands[1].split("&&")]
    assert install_and_test[0] == "python3 -m venv .venv" and install_and_test[1] == ". .venv/bin/activate"
    for command in install_and_test[2:]:
        assert command in ci, f"README's {command!r} is not what .ci/run runs"
    first = [c.strip() for c in commands[0].split("&&")]
    assert first[:3] == install_and_test[:3] and first[3] == "pip install ." and first[4] == "autotune"
    assert "autotune = autoloader.cli.main:main" in (ROOT / "setup.cfg").read_text()


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
            "train_set": Images(), "remote_set": Images(), "epochs": 1, "train_step": lambda batch: None}


def _run(block: Block, namespace: Dict[str, object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.text, f"README.md:{block.line}", "exec"), namespace)
    return out.getvalue()


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_quick_start_and_use_it(own_cache):
    uses = by_first_line("from autoloader import make_loader")
    assert len(uses) == 1  # "Use it"
    for block in uses:
        namespace = _namespace(own_cache)
        printed = _run(block, namespace)
        loader = namespace["loader"]
        assert loader.tuning.source == "online" and loader.history and "Chosen:" in printed


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


def test_the_users_module_example_defines_a_factory():
    namespace = {"Dataset": Dataset}
    _run(by_first_line("# mydata.py")[0], namespace)
    assert callable(namespace["make_train_set"])


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
        train_set, epochs, train_step = Images(), 2, lambda batch: None
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


@pytest.mark.slow
def test_autotune_demo_output_has_the_shape_shown(tmp_path):
    block = by_first_line("$ autotune --plot")[0]
    args = ["autotune", "--no-disk", "--budget", "8"]  # the README's run, shorter, without the disk probe and the plot
    proc = _autotune(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    skip = ("wrote the plot", "disk ", "MB/s")
    expected = "\n".join(line for line in block.text.splitlines() if not any(s in line for s in skip))
    assert same_shape(expected, proc.stderr + proc.stdout) == [], proc.stderr + proc.stdout


README_KEY = "151ff8698c9d83e0ad88176a6c31e931"
"""The cache key the README's examples show (and its prefix ``151f``); the tests put their own entry's in its place."""


def _with_key(text: str, key: str) -> str:
    return text.replace(README_KEY, key).replace(README_KEY[:4], key[:4])


def _run_block(block: Block, cwd: Path, key: str = README_KEY) -> str:
    actual = ""
    for command in _commands(block):
        proc = _autotune([_with_key(arg, key) for arg in command], cwd)
        actual += proc.stdout + proc.stderr
    return actual


@pytest.mark.slow
def test_autotune_tune_output_has_the_shape_shown(tmp_path):
    (tmp_path / "mydata.py").write_text(USER_DATA)
    block = by_first_line("$ autotune tune mydata:make_train_set")[0]
    actual = _run_block(block, tmp_path)
    assert same_shape(block.text, actual) == [], actual


@pytest.mark.slow
def test_autotune_doctor_output_has_the_shape_shown(tmp_path):
    (tmp_path / "mydata.py").write_text(USER_DATA)
    _autotune(["autotune", "probe", "--no-disk"], tmp_path)
    tuned = _autotune(["autotune", "tune", "mydata:make_train_set", "--batch-size", "64", "--step", "0.05",
                       "--budget", "6", "--json"], tmp_path)
    key = json.loads(tuned.stdout)["key"]  # the README's doctor run had one cached tuning
    block = by_first_line("$ autotune doctor")[0]
    actual = _run_block(block, tmp_path, key)
    assert same_shape(_with_key(block.text, key), actual) == [], actual


# ---------------------------------------------------------------- the Development map

def development_map() -> List[str]:
    """The modules and packages the README's Development map lists, in its order, as paths under ``autoloader/``
    (``loader/``, ``loader/prefetch.py``)."""
    block = by_first_line("autoloader/")[0]
    listed: List[str] = []
    folders: List[str] = []  # the packages enclosing the current line
    for line in block.text.splitlines()[1:]:
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
    raise AssertionError(f"{module} is not in the Development map")


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
    """The Development section's table of NOTE blocks (cells "`file`: Name; Name"): file (under autoloader/) -> the
    blocks it lists there."""
    section = README.read_text().split("\n## Development\n", 1)[1]
    listed: Dict[str, List[str]] = {}
    for row in section.splitlines():
        for cell in row.strip().strip("|").split("|") if row.startswith("| `") else ():
            found = re.fullmatch(r"\s*`([^`]+)`: (.+?)\s*", cell)
            if found:
                listed[found.group(1)] = [name.strip() for name in found.group(2).split(";")]
    assert listed, "the Development section has no table of NOTE blocks"
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
    assert unlisted == [], f"NOTE blocks the README's Development table does not list: {unlisted}"


def test_the_top_level_holds_only_the_projects_layout():
    allowed = {"setup.cfg", "setup.py", "autoloader", "tests", "scripts", "README.md", ".ci"}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    top = {line.split("/", 1)[0] for line in tracked.stdout.splitlines()}
    assert {name for name in top if not name.startswith(".")} <= allowed, sorted(top)


# ---------------------------------------------------------------- every block is claimed

CLAIMED = ("# 1. install", "from autoloader import make_loader", "torch.save({\"model\"", "# mydata.py",
           "# train.py: torchrun", "$ autotune --plot", "$ autotune tune mydata:make_train_set", "$ autotune doctor",
           "autoloader/", *INTEGRATION_BLOCKS)


def test_every_block_is_checked():
    unclaimed = [f"README.md:{b.line}: {b.first!r}" for b in blocks() if not b.first.startswith(CLAIMED)]
    assert unclaimed == [], "a README code block no test runs: add it to tests/test_readme.py"



# ---------------------------------------------------------------- the measured results and where they come from

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
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


def test_every_number_in_the_summary_is_in_the_results_file_its_row_links():
    for row in summary_rows():
        links = [link for link in LINK.findall(row) if link.startswith("tests/benchmarks/results/")]
        assert len(links) == 1, f"a summary row must link its one results file: {row}"
        source = (ROOT / links[0]).read_text()
        cited = NUMBER.findall(LINK.sub("", row))
        assert cited, f"a summary row without a number: {row}"
        missing = [number for number in cited if not appears(number, source)]
        assert missing == [], f"{links[0]} does not hold {missing}, which the README's summary row cites: {row}"


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
