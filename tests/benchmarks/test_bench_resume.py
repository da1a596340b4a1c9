"""Resuming deep into a 1,000,000-sample epoch is cheap (run with ``pytest tests/benchmarks --benchmarks``).

Side by side, from the same state (batch 15,000 of 15,625, shuffled): ``load_state_dict`` then the first batch
(redraw the order, skip 15,000 index batches, no sample loaded), against replaying the epoch up to there with a plain
DataLoader (what a loader without state does to get back to the same point: every skipped sample is loaded). The run
is added to tests/benchmarks/results/resume.md (``bench_results``).
"""
import itertools
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader import PrefetchLoader
from bench_results import Run
from helpers import emit_table

N, BATCH, K = 1_000_000, 64, 15_000
ROWS = []


class Cheap(Dataset):
    """Sample ``i`` is ``i`` (the cheapest possible fetch: the replay's cost is a floor); counts what it loads."""

    def __init__(self) -> None:
        self.loaded = 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        self.loaded += 1
        return i


def _loader(data):
    return PrefetchLoader(DataLoader(data, BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)))


def test_resume_at_batch_k_of_a_million_sample_epoch_is_fast(benchmark):
    saving = _loader(Cheap())
    it = iter(saving)
    for _ in range(K):
        next(it)
    state = saving.state_dict()
    expected = next(it).tolist()
    del it

    def resume():
        data = Cheap()
        loader = _loader(data)
        loader.load_state_dict(state)
        return data, next(iter(loader))

    data, first = benchmark.pedantic(resume, rounds=3, iterations=1)
    assert first.tolist() == expected, "the batch after the saved one"
    assert data.loaded == BATCH, "only the first batch is loaded (nothing is read ahead on the CPU), no skipped sample"
    resume_s = benchmark.stats.stats.median

    started = time.perf_counter()
    replay = DataLoader(Cheap(), BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    replayed = next(itertools.islice(iter(replay), K, None))
    replay_s = time.perf_counter() - started
    assert replayed.tolist() == expected
    benchmark.extra_info.update(resume_s=resume_s, replay_s=replay_s)
    print(f"\nresume at batch {K:,} of {N // BATCH:,} ({N:,} samples): load_state_dict + first batch "
          f"{resume_s:.3f} s, no skipped sample loaded; replaying the epoch to there {replay_s:.2f} s "
          f"({replay_s / resume_s:,.0f}x)")
    ROWS.append((resume_s, replay_s))
    assert resume_s < 1.0


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("resume", "Resuming deep into an epoch")
    yield
    if not ROWS:
        return
    lines = [f"Batch {K:,} of {N // BATCH:,} ({N:,} samples, batch {BATCH}, shuffled; a sample costs nothing to "
             f"load): `load_state_dict` + the first batch (median of 3), against replaying the epoch to there with a "
             f"plain DataLoader.", "",
             "| resume s | replay s | replay / resume | skipped samples loaded on resume |", "|---|---|---|---|"]
    lines += [f"| {resume_s:.3f} | {replay_s:.2f} | {replay_s / resume_s:,.0f}x | 0 |" for resume_s, replay_s in ROWS]
    emit_table("\n".join(lines))
    run.write("\n".join(lines))
