"""The GPU scripts (``scripts/gpu_check.py``, ``scripts/gpu_resnet.py``) run on a machine without a GPU as their
``--cpu-dry-run`` says: the same code paths at small sizes, so that they do not rot between the rare runs on a GPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_script(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.slow
def test_gpu_resnet_dry_run_compares_every_configuration():
    out = run_script("gpu_resnet.py", "--cpu-dry-run", timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    for row in ("tuned (workers=", "num_workers=0", "cores rule (", "online, epoch 1 of 24 batches",
                "online, epoch 2 of 24 batches", "cores rule, epoch 2 of 24 batches"):
        assert row in out.stdout, f"{row!r} missing from:\n{out.stdout}"
    assert "of the best" in out.stdout


@pytest.mark.slow
def test_gpu_check_dry_run_passes_or_runs_every_check():
    out = run_script("gpu_check.py", "--cpu-dry-run", "--deadline", "180", timeout=220)  # the watchdog: 240 s
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = [line for line in out.stdout.splitlines() if line.startswith("SUMMARY:")]
    assert len(summary) == 1 and " 0 FAIL" in summary[0], out.stdout[-3000:]
    assert not [line for line in out.stdout.splitlines() if line.startswith("FAIL ")], out.stdout[-3000:]
    assert "PASS no_process_left" in out.stdout
