"""Accelerate on 2 CPU processes (torchrun, gloo): a PrefetchLoader registered with
``accelerator.register_for_checkpointing`` resumes exactly through ``save_state``/``load_state`` (issue 21).

Accelerate's own dataloader states cover only the DataLoaders it wraps; ``prepare`` returns a PrefetchLoader
unchanged, so it is registered as a custom object: ``save_state`` calls ``state_dict()`` on every rank (autoloader's
state holds all of them) and writes it once; ``load_state`` hands it to every rank's loader.
"""
from __future__ import annotations

import pytest

pytest.importorskip("accelerate", reason="Accelerate is not installed: pip install '.[integrations]'")

from _helpers import HERE, launch, read_reports, torchrun  # noqa: E402

SCRIPT = HERE / "accelerate_resume_script.py"
SAVE, STEPS = 8, 18  # accelerate_resume_script: save after step 8 of 3 epochs x 6 steps


@pytest.mark.integration
def test_save_state_load_state_resume_every_rank_exactly(tmp_path):
    state_dir = tmp_path / "state"
    runs = {}
    for phase in ("full", "resume"):
        out = tmp_path / phase
        out.mkdir()
        output = launch(torchrun(SCRIPT, str(out), str(tmp_path / "cache"), "--phase", phase,
                                 "--state-dir", str(state_dir)), out_dir=out)
        runs[phase] = [{int(k): v for k, v in r["steps"].items()} for r in read_reports(out, 2, output)]
    assert any(name.startswith("custom_checkpoint_") for name in read_reports(tmp_path / "full", 2)[0]["saved"])
    for rank in (0, 1):
        full, resumed = runs["full"][rank], runs["resume"][rank]
        assert sorted(full) == list(range(STEPS)), (rank, sorted(full))
        assert sorted(resumed) == list(range(SAVE, STEPS)), (rank, sorted(resumed))
        for step in range(SAVE, STEPS):
            assert resumed[step] == full[step], (
                f"rank {rank}, step {step}: resumed on {resumed[step]}, the uninterrupted run on {full[step]}")
