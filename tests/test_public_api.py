"""The public API (autoloader/__init__.py): its names, and that importing it touches no hardware."""
import os
import subprocess
import sys
from pathlib import Path

import autoloader


def test_public_names_are_sorted_and_import_touches_no_hardware():
    assert autoloader.__all__ == sorted(autoloader.__all__)
    code = ("import sys, torch, autoloader\n"
            "assert not torch.cuda.is_initialized()\n"
            "assert 'autoloader.probe' in sys.modules\n"
            "import psutil\n"
            "assert not psutil.Process().children()\n"
            "print('ok')\n")
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
