"""Lightning DDP (2 CPU processes, gloo) killed mid-epoch and resumed from a checkpoint (issue 21).

Real launches of lightning_resume_script.py: an uninterrupted run; a run checkpointing every 4 steps and SIGKILLed
at step 10 (mid-epoch 1); ``fit(ckpt_path=<the step-8 checkpoint>)`` in a fresh launch, once as the killed run was
configured and once with a fixed ``num_workers=1``. Lightning 2.6 stores ``loader.state_dict()`` of a train loader
that has state_dict/load_state_dict (rank 0's checkpoint: autoloader's state holds every rank's) and loads it before
``iter()``. Per rank, every step after the checkpoint must train on exactly the uninterrupted run's batch.
"""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("lightning", reason="Lightning is not installed: pip install '.[integrations]'")

from _helpers import HERE, launch, read_reports, run_launch  # noqa: E402

SCRIPT = HERE / "lightning_resume_script.py"
CKPT_STEP, KILL, STEPS = 8, 10, 18  # lightning_resume_script: EVERY=4, KILL=10, 3 epochs of 6 steps


def _run(out, cache, phase, *flags):
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(SCRIPT), str(out), str(cache), "--phase", phase, *flags]
    if phase == "killed":
        returncode, output = run_launch(command)
        assert returncode != 0, f"the killed run was not killed:\n{output[-3000:]}"
        return output
    output = launch(command, out_dir=out)
    return [{int(k): v for k, v in r["steps"].items()} for r in read_reports(out, 2, output)]


@pytest.mark.integration
def test_killed_mid_epoch_then_resumed_trains_on_the_uninterrupted_batches(tmp_path):
    full = _run(tmp_path / "full", tmp_path / "cache-full", "full")
    assert [sorted(r) for r in full] == [list(range(STEPS))] * 2
    killed = tmp_path / "killed"
    output = _run(killed, tmp_path / "cache-killed", "killed")
    ckpt = killed / "ckpt" / f"s{CKPT_STEP}.ckpt"
    assert ckpt.exists(), f"no checkpoint after step {CKPT_STEP}: {list((killed / 'ckpt').glob('*'))}\n{output[-3000:]}"
    assert not (killed / "ckpt" / f"s{CKPT_STEP + 4}.ckpt").exists(), "the run was not killed before step 12"
    for name, flags in (("same", ()), ("one-worker", ("--num-workers", "1"))):
        resumed = _run(tmp_path / f"resume-{name}", tmp_path / "cache-killed", "resume", "--ckpt", str(ckpt), *flags)
        for rank in (0, 1):
            assert sorted(resumed[rank]) == list(range(CKPT_STEP, STEPS)), (name, rank, sorted(resumed[rank]))
            for step in range(CKPT_STEP, STEPS):
                assert resumed[rank][step] == full[rank][step], (
                    f"{name}, rank {rank}, step {step} (epoch {step // 6}, batch {step % 6}): resumed run trained on "
                    f"{resumed[rank][step]}, the uninterrupted run on {full[rank][step]}")
