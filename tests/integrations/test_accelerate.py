"""Hugging Face Accelerate on 1 and 2 CPU processes (2: torchrun, gloo), with the loop Accelerate's docs show:
``accelerator.prepare(...)`` then ``for batch in loader`` once per epoch, no ``set_epoch`` call.

Real runs of accelerate_script.py, which tries three combinations (see its docstring) and reports each:

- ``prefetch`` (``accelerator.prepare(make_loader(...))``): returned unchanged by Accelerate, autoloader shards.
  Each epoch must reshuffle without a ``set_epoch`` call, as Accelerate's own loaders do.
- ``inner`` (``accelerator.prepare(make_loader(...).loader)``): Accelerate shards the already-sharded loader again;
  correct is a clear error from autoloader, or every sample exactly once.
- ``unsharded`` (``make_loader(..., distributed=False)`` then ``prepare(.loader)``): Accelerate alone shards.
  The ranks tune independently here (``distributed=False``), so the same configuration is not promised and not
  checked.
"""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("accelerate", reason="Accelerate is not installed: pip install '.[integrations]'")

from _helpers import HERE, check_epochs, check_same_config, launch, read_reports, torchrun  # noqa: E402

SCRIPT = HERE / "accelerate_script.py"
N = 64  # accelerate_script.N


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """One launch per world size (all three scenarios in it), shared by the tests."""
    done = {}

    def get(world: int):
        if world not in done:
            out = tmp_path_factory.mktemp(f"accelerate{world}")
            args = (str(out), str(out / "cache"))
            command = torchrun(SCRIPT, *args, nproc=world) if world > 1 else [sys.executable, str(SCRIPT), *args]
            output = launch(command, out_dir=out, world=world)
            done[world] = read_reports(out, world, output)
            for report in done[world]:
                assert report["world_size"] == world, report
        return done[world]

    return get


def _no_error(name: str, parts: list) -> None:
    for rank, part in enumerate(parts):
        assert part["error"] is None, f"{name}, rank {rank}: {part['error']}\n{part.get('traceback', '')}"


@pytest.mark.parametrize("world", [1, 2])
def test_prepare_the_prefetch_loader(reports, world):
    parts = [r["prefetch"] for r in reports(world)]
    _no_error("prepare(make_loader(...))", parts)
    assert all(p["returned_unchanged"] for p in parts), "Accelerate prepares only DataLoader instances"
    check_same_config([p["tuning"] for p in parts])
    check_epochs([p["epochs"] for p in parts], N, what="prepare(make_loader(...)): ")


@pytest.mark.parametrize("world", [1, 2])
def test_prepare_the_inner_loader_fails_loudly_or_shards_once(reports, world):
    parts = [r["inner"] for r in reports(world)]
    errors = [p["error"] for p in parts]
    if any(errors):
        assert all(errors), f"only some ranks raised: {errors}"
        for error in errors:
            lowered = error.lower()
            assert "autoloader" in lowered and "accelerate" in lowered and "shard" in lowered, (
                f"prepare(make_loader(...).loader) must fail with autoloader's own message about Accelerate "
                f"sharding an already sharded loader, got: {error}")
        return
    assert all(p["prepared_type"] == "DataLoaderShard" for p in parts)
    check_same_config([p["tuning"] for p in parts])
    check_epochs([p["epochs"] for p in parts], N, what="prepare(make_loader(...).loader): ")


@pytest.mark.parametrize("world", [1, 2])
def test_unsharded_loader_sharded_by_accelerate(reports, world):
    parts = [r["unsharded"] for r in reports(world)]
    _no_error("prepare(make_loader(..., distributed=False).loader)", parts)
    assert all(p["prepared_type"] == "DataLoaderShard" for p in parts)
    for p in parts:  # Accelerate rebuilt the loader from the tuned one: it kept the tuned worker count
        assert p["num_workers"] == p["tuning"]["config"]["num_workers"], p
    check_epochs([p["epochs"] for p in parts], N, what="prepare(make_loader(..., distributed=False).loader): ")
