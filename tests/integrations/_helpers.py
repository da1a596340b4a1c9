"""Shared by the integration tests and the scripts they launch: a small dataset whose samples carry their index, a
launcher that never leaves a process behind, and the checks every integration must pass.

The checks (issue 14): in every epoch each sample is seen exactly once across ranks; each epoch has a new shuffle
order; every rank uses the same loader configuration (``loader.tuning``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import psutil
import torch
from torch.utils.data import Dataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUDGET_S = 3.0          # tuning budget in every integration test: the machine has 2 cores, shared
LAUNCH_TIMEOUT_S = 150  # one multi-process launch, import of the framework included


def child_env(**extra: str) -> Dict[str, str]:
    """The environment of a launched script: this checkout importable, one thread per process, quiet libraries."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(HERE), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore::DeprecationWarning")
    env.update(extra)
    return env


def run_launch(command: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
               timeout: float = LAUNCH_TIMEOUT_S) -> Tuple[int, str]:
    """Run ``command`` in its own session; (exit status, output). On a timeout the whole session is killed (so no
    rank or DataLoader worker survives) and the test fails with the output so far."""
    import pytest

    proc = subprocess.Popen(list(command), env=dict(env or child_env()), cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(map(str, command))} did not finish within {timeout:.0f} s:\n{output[-6000:]}")
    finally:
        try:  # whatever the launch left in its session (a rank that outlived its launcher) goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.returncode, output


TEARDOWN_ABORT = ("terminate called without an active exception", "Fatal Python error: Aborted")
"""What a DDP job over gloo may print when a rank aborts in C++ teardown after its Python code finished. Measured
without autoloader (Accelerate, a plain DataLoader, DDP, ``end_training()``, torchrun on 2 CPU ranks, the machine
loaded): 1 run in 15 aborted so, after every line of the script had run (README, Integrations, "torchrun": end with
``destroy_process_group()``)."""


def teardown_abort_only(returncode: int, output: str, out_dir: Optional[Path], world: int) -> bool:
    """True when a failed launch is only that teardown abort: the signature is in the output, the aborting thread
    had no Python frame left, and every rank wrote its report (its last step before exiting)."""
    if returncode == 0 or out_dir is None or not all(part in output for part in TEARDOWN_ABORT):
        return False
    after = output.split(TEARDOWN_ABORT[1], 1)[1].splitlines()[1:3]
    if not any("<no Python frame>" in line for line in after):
        return False
    return all((Path(out_dir) / f"rank{rank}.json").exists() for rank in range(world))


def launch(command: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
           timeout: float = LAUNCH_TIMEOUT_S, out_dir: Optional[Path] = None, world: int = 2) -> str:
    """``run_launch`` that fails the test on a non-zero exit; returns the output. With ``out_dir`` (where each of
    ``world`` ranks writes its report), a rank's abort in torch's teardown after every report was written
    (``teardown_abort_only``) is reported as a warning, not a failure: the reports are what the test checks."""
    returncode, output = run_launch(command, env=env, timeout=timeout)
    if teardown_abort_only(returncode, output, out_dir, world):
        import warnings

        warnings.warn(f"a rank aborted in torch's teardown after its work was done (exit {returncode}): "
                      f"{TEARDOWN_ABORT[0]!r}", RuntimeWarning, stacklevel=2)
        return output
    assert returncode == 0, f"{' '.join(map(str, command))} failed ({returncode}):\n{output[-6000:]}"
    return output


def torchrun(script: Path, *args: str, nproc: int = 2) -> List[str]:
    """The command that runs ``script`` on ``nproc`` local ranks with torchrun (gloo on CPU)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(script), *args]


def arm_watchdog(seconds: float = LAUNCH_TIMEOUT_S - 20) -> None:
    """In a launched script: a process still running after ``seconds`` prints every thread's stack and exits, so a
    hung rank says where it hung before the test kills the launch."""
    import faulthandler
    import threading

    faulthandler.enable()  # a fatal signal prints every thread's Python stack (TEARDOWN_ABORT's second line)
    faulthandler.dump_traceback_later(seconds, exit=False)  # every rank prints, none exits first and hides the rest
    timer = threading.Timer(seconds + 5.0, os._exit, args=(3,))
    timer.daemon = True
    timer.start()


def write_report(out_dir: str, rank: int, report: Mapping) -> None:
    path = Path(out_dir) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, path)


def read_reports(out_dir: Path, world: int, output: str = "") -> List[dict]:
    reports = []
    for rank in range(world):
        path = Path(out_dir) / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report; output:\n{output[-6000:]}"
        reports.append(json.loads(path.read_text()))
    return reports


# ---------------------------------------------------------------- datasets (importable in every rank and worker)

class Indexed(Dataset):
    """``n`` samples ``(uint8 image 3x8x8, index)``: the index identifies the sample; a little CPU per sample, so
    trials measure real loading."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        acc = 0
        for j in range(300):
            acc += (j * index) % 7
        return torch.full((3, 8, 8), index % 256, dtype=torch.uint8), index


# ---------------------------------------------------------------- the three checks

def check_epochs(per_rank_epochs: Sequence[Sequence[Sequence[int]]], n: int, *, what: str = "") -> None:
    """``per_rank_epochs[rank][epoch]`` is the list of sample ids rank saw in that epoch, in order.

    Every epoch: each of the ``n`` samples exactly once across ranks. Every rank: a different order in each epoch
    (a DistributedSampler whose set_epoch is never called repeats epoch 0's order)."""
    epochs = {len(e) for e in per_rank_epochs}
    assert len(epochs) == 1, f"{what}ranks ran different numbers of epochs: {[len(e) for e in per_rank_epochs]}"
    for epoch in range(epochs.pop()):
        seen = [i for rank in per_rank_epochs for i in rank[epoch]]
        missing = sorted(set(range(n)) - set(seen))
        repeated = sorted({i for i in seen if seen.count(i) > 1})
        assert not missing and not repeated and len(seen) == n, (
            f"{what}epoch {epoch}: each of the {n} samples must be seen exactly once across "
            f"{len(per_rank_epochs)} rank(s); saw {len(seen)}, {len(missing)} missing (e.g. {missing[:8]}), "
            f"{len(repeated)} repeated (e.g. {repeated[:8]}); per rank: {[len(r[epoch]) for r in per_rank_epochs]}")
    for rank, rank_epochs in enumerate(per_rank_epochs):
        for epoch in range(1, len(rank_epochs)):
            assert list(rank_epochs[epoch]) != list(rank_epochs[epoch - 1]), (
                f"{what}rank {rank}: epoch {epoch} has the same order as epoch {epoch - 1} "
                f"({list(rank_epochs[epoch])[:10]}...): the shuffle never changes (set_epoch did not reach the "
                f"sampler)")


def check_same_config(tunings: Sequence[Optional[dict]], *, what: str = "") -> None:
    """Every rank returns the same ``loader.tuning`` (its ``to_dict()``)."""
    assert all(t is not None for t in tunings), f"{what}a rank has no tuning: {tunings}"
    labels = [tuple(sorted(t["config"].items(), key=lambda kv: kv[0])) for t in tunings]
    assert len(set(labels)) == 1, f"{what}ranks chose different configs: {labels}"
    assert all(t == tunings[0] for t in tunings), f"{what}ranks returned different tunings"


def spawned_by(process: psutil.Process, roots: set) -> bool:
    """``process`` is one of ``roots`` or their descendant (or already gone): a module-scoped Ray session's own."""
    try:
        return process.pid in roots or any(parent.pid in roots for parent in process.parents())
    except psutil.NoSuchProcess:
        return True


def strays(roots: set, *, timeout_s: float = 10.0) -> list:
    """The live children of this process that are not ``roots`` or their descendants, waited for up to
    ``timeout_s`` to exit: what a test left behind beside a module-scoped Ray session (``spawned_by``)."""
    from helpers import live_children  # tests/: on the tests' path, not on the scripts that import this module

    deadline = time.monotonic() + timeout_s
    found = [p for p in live_children() if not spawned_by(p, roots)]
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = [p for p in live_children() if not spawned_by(p, roots)]
    return found
