"""PyTorch Lightning DDP (2 CPU processes, gloo) with ``train_dataloader()`` returning ``make_loader(...)``.

Real runs of lightning_script.py through Lightning's own launcher (it starts rank 1 by running the script again).
Each epoch: every sample exactly once across the ranks, a new shuffle order; every rank: the same tuning.

What Lightning does with the returned object (lightning 2.6.6, see NOTES.md): a ``PrefetchLoader`` is not a
``DataLoader``, so Lightning never re-instantiates it or injects a DistributedSampler (autoloader shards by itself),
and at every epoch start it calls ``set_epoch`` on ``loader.sampler`` and ``loader.batch_sampler.sampler`` only, so
the wrapper must expose them. When fit ends it shuts down the workers of ``loader._iterator``.
"""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("lightning", reason="Lightning is not installed: pip install '.[integrations]'")

from _helpers import HERE, check_epochs, check_same_config, launch, read_reports, run_launch  # noqa: E402

SCRIPT = HERE / "lightning_script.py"
N = 64  # lightning_script.N
EPOCHS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each configuration launched once per module (about 10 s each), shared by the tests that read it."""
    done = {}

    def run(*flags: str, expect_success: bool = True):
        if flags not in done:
            out = tmp_path_factory.mktemp("lightning")
            command = [sys.executable, str(SCRIPT), str(out), str(out / "cache"), "--epochs", str(EPOCHS), *flags]
            if expect_success:
                output = launch(command, out_dir=out)
                done[flags] = (0, output, read_reports(out, 2, output))
            else:
                returncode, output = run_launch(command)
                done[flags] = (returncode, output, read_reports(out, 2, output) if returncode == 0 else None)
        return done[flags]

    return run


@pytest.mark.parametrize("use_distributed_sampler", [1, 0], ids=["use_distributed_sampler", "no_distributed_sampler"])
def test_ddp_every_sample_once_new_order_each_epoch_same_config(runs, use_distributed_sampler):
    _, _, reports = runs("--use-distributed-sampler", str(use_distributed_sampler))
    assert [r["world_size"] for r in reports] == [2, 2]
    # Lightning leaves a non-DataLoader alone: the object it iterates is autoloader's, sharded by autoloader.
    assert [r["loader_type"] for r in reports] == ["PrefetchLoader"] * 2, reports[0]["loader_type"]
    assert all(r["sampler_is_distributed"] for r in reports), [r["sampler"] for r in reports]
    check_same_config([r["tuning"] for r in reports])
    check_epochs([r["epochs"] for r in reports], N)
    # Lightning numbers epochs from 0 and calls set_epoch(epoch) at the start of each one.
    assert [r["sampler_epoch"] for r in reports] == [EPOCHS - 1] * 2, (
        "Lightning's set_epoch must reach autoloader's DistributedSampler: Lightning calls it on "
        "loader.sampler and loader.batch_sampler.sampler, which PrefetchLoader must expose")


def test_ddp_workers_shut_down_when_fit_ends(runs):
    """With workers (persistent, as autoloader chooses), Lightning's teardown shuts them down through
    ``loader._iterator``, as it does for a plain DataLoader; a wrapper that hides ``_iterator`` keeps them alive
    until the loader is garbage collected."""
    _, _, reports = runs("--use-distributed-sampler", "1", "--num-workers", "1")
    for report in reports:
        assert report["num_workers"] == 1 and report["persistent_workers"] is True, report
    check_same_config([r["tuning"] for r in reports])
    check_epochs([r["epochs"] for r in reports], N)
    for report in reports:
        assert report["workers_alive_after_fit"] == [], (
            f"rank {report['rank']}: DataLoader workers {report['workers_alive_after_fit']} still alive after "
            f"Trainer.fit returned: Lightning shuts down workers via loader._iterator, which PrefetchLoader hides")


def test_loader_built_before_fit_fails_loudly_or_is_sharded(runs):
    """``trainer.fit(model, train_dataloaders=make_loader(...))``: the loader is built before Lightning initialises
    torch.distributed, so autoloader does not shard, and Lightning does not either (not a DataLoader): every rank
    trains on the whole dataset, each tuned on its own. Correct is a clear error (naming autoloader and what to do),
    or a loader that is sharded after all."""
    returncode, output, reports = runs("--use-distributed-sampler", "1", "--outside", expect_success=False)
    if returncode != 0:
        assert "autoloader" in output.lower() and "distributed" in output.lower(), (
            f"the run failed, but not with autoloader's error naming torch.distributed:\n{output[-4000:]}")
        return
    check_same_config([r["tuning"] for r in reports])
    check_epochs([r["epochs"] for r in reports], N)
