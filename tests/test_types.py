"""The package is typed (``autoloader/py.typed``) and its types check: ``mypy autoloader`` with setup.cfg's ``[mypy]``
configuration reports nothing.

mypy is in the ``test`` extra; its cache (``.mypy_cache``) makes a repeated run take a few seconds, a first one about
half a minute on 2 cores.
"""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_is_configured_in_setup_cfg():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["mypy"]["python_version"] == "3.10", "the declared floor (python_requires) is what mypy checks"
    assert config["options"]["python_requires"].strip() == ">=3.10"
    assert "mypy" in config["options.extras_require"]["test"].split()
    for name, section in config.items():
        if name == "mypy" or name.startswith("mypy-"):
            assert "ignore_errors" not in section, f"[{name}] hides errors instead of fixing them"
    assert "ignore_missing_imports" not in config["mypy"], "ignore missing imports per package, not for all"


def test_mypy_reports_no_error():
    proc = subprocess.run([sys.executable, "-m", "mypy", "autoloader"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"mypy autoloader failed:\n{proc.stdout}{proc.stderr}"
