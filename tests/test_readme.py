"""Every code block of the README is run by a test (issue 26), so the README cannot drift from the code.

- ``bash`` blocks: the two commands of the quick start are the ones ``.ci/run`` runs (CI runs them in a fresh venv).
- ``python`` blocks: executed, as written, over small stand-ins for the names they assume (``train_set``,
  ``train_step``, ``epochs``...); the distributed one in a process group of its own. Those that need Lightning,
  Accelerate, ``datasets`` or WebDataset run in ``tests/integrations/test_readme_blocks.py`` with the real libraries.
- output blocks (a ``$ command`` then what it prints, or what the python block above printed): the command is run
  and every line of the README's output must have a line of the same shape in the real output (the same words, any
  numbers: ``same_shape``); a line of ``...`` stands for lines left out. The Development map must list every module.
Each block is claimed by exactly one check below (``test_every_block_is_checked``), so a new block needs one. The
checks that run ``autotune``, trials or torchrun are marked ``slow``: CI runs them (``.ci/run``), the default run not.
"""
from __future__ import annotations

import contextlib
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
from typing import Dict, List

import pytest
import torch
from torch.utils.data import Dataset

from helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks() -> List[Block]:
    found, lines = [], README.read_text().splitlines()
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
    assert len(uses) == 2  # the quick start's five lines, and "Use it"
    for block in uses:
        namespace = _namespace(own_cache)
        printed = _run(block, namespace)
        loader = namespace["loader"]
        assert loader.tuning.source == "online" and loader.history and "Chosen:" in printed


@pytest.mark.slow
def test_the_remote_example_prints_a_report_of_the_shape_shown(own_cache):
    code, shown = [b for b in blocks() if b.first.startswith("class Remote(Dataset):")][0], None
    following = blocks()[blocks().index(code) + 1]
    assert following.lang == "" and following.first.startswith("Chosen:")
    namespace = _namespace(own_cache)
    namespace["make_loader"] = _with(namespace["make_loader"], budget=4)  # the README's default budget, shortened
    shown = _run(code, namespace)
    assert same_shape(following.text, shown) == [], shown


def _with(function, **extra):
    return lambda *args, **kwargs: function(*args, **{**kwargs, **extra})


def test_threads_example(own_cache):
    printed = _run(by_first_line("loader = make_loader(remote_set")[0], _namespace(own_cache))
    assert "Chosen:" in printed


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
                      "ds = (wds.WebDataset(")
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
    progress, report = by_first_line("$ autotune --plot"), by_first_line("Machine profile")
    args = ["autotune", "--no-disk", "--budget", "8"]  # the README's run, shorter, without the disk probe and the plot
    proc = _autotune(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    skip = ("wrote the plot", "probing the machine; measuring disk", "disk ", "MB/s")
    expected = "\n".join(line for line in progress[0].text.splitlines() if not any(s in line for s in skip))
    assert same_shape(expected, proc.stderr) == [], proc.stderr
    expected = "\n".join(line for line in report[0].text.splitlines() if not any(s in line for s in skip))
    assert same_shape(expected, proc.stdout) == [], proc.stdout


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


def test_autotune_probe_output_has_the_shape_shown(tmp_path):
    block = by_first_line("$ autotune probe")[0]
    assert same_shape(block.text, _run_block(block, tmp_path)) == []


@pytest.mark.slow
def test_autotune_tune_then_from_the_cache(tmp_path):
    (tmp_path / "mydata.py").write_text(USER_DATA)
    first, again = by_first_line("$ autotune tune mydata:make_train_set")
    assert "from the cache" in again.text
    for block in (first, again):
        actual = _run_block(block, tmp_path)
        assert same_shape(block.text, actual) == [], actual
    for block in by_first_line("$ autotune tune imagenet"):  # the usage errors, word for word but the paths
        actual = _run_block(block, tmp_path)
        assert same_shape(block.text, actual, words=99) == [], actual


@pytest.mark.slow
def test_cache_commands_output_has_the_shape_shown(tmp_path):
    (tmp_path / "mydata.py").write_text(USER_DATA)
    _autotune(["autotune", "probe", "--no-disk"], tmp_path)
    tuned = _autotune(["autotune", "tune", "mydata:make_train_set", "--batch-size", "64", "--step", "0.05",
                       "--budget", "6", "--json"], tmp_path)
    key = json.loads(tuned.stdout)["key"]
    for prefix in ("$ autotune show", "$ autotune doctor", "$ autotune clear"):  # clear last: it empties the cache
        block = by_first_line(prefix)[0]
        actual = _run_block(block, tmp_path, key)
        assert same_shape(_with_key(block.text, key), actual) == [], actual


@pytest.mark.slow
def test_doctor_under_limits_has_the_shape_shown(tmp_path):
    block = by_first_line("$ ulimit -n 1024; taskset -c 0 autotune doctor")[0]
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOLOADER_CACHE_DIR": str(tmp_path / "cache")}
    run_cli(["probe", "--no-disk"], tmp_path)  # the saved profile describes the unconfined machine
    proc = subprocess.run(["bash", "-c", f"ulimit -n 1024; taskset -c 0 {sys.executable} -m autoloader.cli doctor"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert same_shape(block.text, proc.stdout + proc.stderr) == [], proc.stdout


# ---------------------------------------------------------------- the Development map

def test_the_development_map_lists_every_module_and_nothing_else():
    block = by_first_line("autoloader/")[0]
    listed, package = set(), None
    for line in block.text.splitlines()[1:]:
        name = line.split()[0] if line.strip() else ""
        depth = (len(line) - len(line.lstrip())) // 2
        if not name.endswith((".py", "/")):
            continue
        if depth == 1:
            package = name if name.endswith("/") else None
            listed.add(name)
        elif depth == 2 and package:
            listed.add(package + name)
    actual = {p.relative_to(ROOT / "autoloader").as_posix() for p in (ROOT / "autoloader").glob("*.py")}
    actual |= {p.name + "/" for p in (ROOT / "autoloader").iterdir() if (p / "__init__.py").exists()}
    actual |= {p.relative_to(ROOT / "autoloader").as_posix() for sub in ("loader", "measure", "search", "tuning")
               for p in (ROOT / "autoloader" / sub).glob("*.py") if p.name != "__init__.py"}
    assert listed == actual


# ---------------------------------------------------------------- every block is claimed

CLAIMED = ("# 1. install", "from autoloader import make_loader", "torch.save({\"model\"", "class Remote(Dataset):", "Chosen:",
           "loader = make_loader(remote_set", "# mydata.py", "# train.py: torchrun", "$ autotune --plot",
           "Machine profile", "$ autotune probe", "$ autotune tune mydata:make_train_set", "$ autotune show",
           "$ autotune clear", "$ autotune doctor", "$ autotune tune imagenet", "$ ulimit -n 1024", "autoloader/",
           *INTEGRATION_BLOCKS)


def test_every_block_is_checked():
    unclaimed = [f"README.md:{b.line}: {b.first!r}" for b in blocks() if not b.first.startswith(CLAIMED)]
    assert unclaimed == [], "a README code block no test runs: add it to tests/test_readme.py"
