"""Ctrl-C at every point of a candidate's life, in both tuning modes (issue 20): the user gets ``KeyboardInterrupt``
(never an error of autoloader's own, such as the ``UnboundLocalError`` an online candidate's cleanup once raised),
within 2 s, and no worker process outlives it. Each case runs ``interrupt_script.py`` in its own process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


@pytest.mark.slow
@pytest.mark.parametrize("point", ["create", "fork", "first", "window", "switch"])
@pytest.mark.parametrize("mode", ["trials", "online"])
def test_ctrl_c_raises_keyboard_interrupt_quickly_and_leaves_no_child(mode, point):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]))
    proc = subprocess.run([sys.executable, str(TESTS / "interrupt_script.py"), mode, point], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["fired"], f"the {point} point was never reached in {mode} mode: {proc.stderr[-2000:]}"
    assert outcome["raised"] == "KeyboardInterrupt", proc.stderr[-3000:]
    assert outcome["after_s"] <= 2.0, outcome
    assert outcome["children"] == [], outcome
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
