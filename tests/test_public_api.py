"""The public API (autoloader/__init__.py): its names, and that importing it touches no hardware."""
import os
import re
import subprocess
import sys
from pathlib import Path

import autoloader
from autoloader.loader import threads

PUBLIC = ["AutoloaderWarning", "EpochStats", "LoaderConfig", "MachineProfile", "PrefetchLoader", "ThreadedDataset",
          "TrialResult", "TuneResult", "TuningError", "make_loader", "probe_machine", "tune", "unwrap", "with_threads"]


def test_public_names_are_sorted_and_import_touches_no_hardware():
    assert autoloader.__all__ == sorted(autoloader.__all__) == PUBLIC
    assert all(getattr(autoloader, name) is not None for name in PUBLIC)
    for name in ("ThreadedDataset", "unwrap", "with_threads"):  # the threads API, as autoloader.loader.threads has it
        assert getattr(autoloader, name) is getattr(threads, name)
    code = ("import sys, torch, autoloader\n"
            "assert not torch.cuda.is_initialized()\n"
            "assert 'autoloader.probe' in sys.modules\n"
            "assert not [m for m in sys.modules if m.startswith('autoloader.cli')], 'the command is not imported'\n"
            "import psutil\n"
            "assert not psutil.Process().children()\n"
            "import autoloader.cli\n"
            "assert [m for m in sys.modules if m.startswith('autoloader.cli')] == ['autoloader.cli']\n"
            "print('ok')\n")
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_threads_api_wraps_and_unwraps_a_dataset():
    data = list(range(10))
    wrapped = autoloader.with_threads(data, 4)
    assert isinstance(wrapped, autoloader.ThreadedDataset) and autoloader.unwrap(wrapped) is data
    assert [wrapped[i] for i in range(3)] == [0, 1, 2] and len(wrapped) == 10
    assert wrapped.__getitems__([3, 4, 5]) == [3, 4, 5]                        # fetched by its threads
    assert autoloader.unwrap(data) is data and autoloader.with_threads(wrapped, 1) is data


def test_the_docstring_lists_the_public_api_and_nothing_else():
    """The package's docstring is the list of what is public (the rest is internal): every name in ``__all__`` and
    the two dotted names it adds, each importable, and no other."""
    listed = set()
    for item in re.findall(r"^- (.+?):", autoloader.__doc__, re.M):
        listed.update(re.findall(r"``([\w.]+)``", item))
    dotted = {name for name in listed if "." in name}
    assert listed - dotted - {"autotune"} == set(PUBLIC), "autotune: the command"
    assert dotted == {"autoloader.distributed.node_decisions", "autoloader.cli.plot.plot_online_epoch"}
    for name in dotted:
        module, attribute = name.rsplit(".", 1)
        assert callable(getattr(__import__(module, fromlist=[attribute]), attribute)), name


def test_a_torch_older_than_the_minimum_is_named_at_import():
    """``import autoloader`` refuses a torch older than ``MIN_TORCH`` (DataLoader's ``in_order``) with the fix, and
    accepts every release and local build from it on; a version it cannot read is not refused on a guess."""
    assert autoloader.MIN_TORCH == (2, 6)
    for old in ("2.5.1", "2.5.1+cu121", "1.13.1", "2.0.0a0+gitabc"):
        said = autoloader._torch_too_old(old)
        assert said is not None and f"torch {old}" in said and "torch >= 2.6" in said and "pip install" in said
    for fine in ("2.6.0", "2.13.0+cpu", "2.10.0a0+git1234", "3.0.0", " 2.6.1", "nightly"):
        assert autoloader._torch_too_old(fine) is None, fine
    code = "import torch\ntorch.__version__ = '2.5.1+cu121'\nimport autoloader\n"
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 1 and "ImportError: autoloader needs torch >= 2.6" in out.stderr, out.stderr[-2000:]
    assert "torch 2.5.1+cu121" in out.stderr


def test_the_minimum_torch_is_what_setup_cfg_requires_and_what_the_installed_torch_meets():
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    required = [line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()]
    assert "torch>=%d.%d" % autoloader.MIN_TORCH in required
    import torch

    assert autoloader._torch_too_old(torch.__version__) is None


def test_windows_is_refused_at_import_with_the_reason():
    code = "import sys, torch\nsys.platform = 'win32'\nimport autoloader\n"  # torch imported as on Linux
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 1 and "ImportError: autoloader runs on Linux" in out.stderr and "WSL2" in out.stderr, \
        out.stderr[-2000:]
