"""WebDataset: shards written with ``wds.ShardWriter``, read by ``wds.WebDataset(urls, shardshuffle=...,
workersplitter=wds.split_by_worker)`` (a finite IterableDataset), in this process.

- Fewer shards (2) than the worker counts the search would try (its first jump for a latency-bound pipeline is 8):
  a worker without a shard makes webdataset raise ``ValueError: No samples found in dataset; perhaps you have fewer
  shards than workers``. That candidate must count as a failed trial (or not be tried: the number of shards is known,
  ``dataset.pipeline[0].urls``), never crash ``make_loader``; the loader returned then reads every sample once per
  epoch, in a new order each epoch.
- A finite stream that ends inside a trial: the workers' CPU must still be measured (the workers have exited before
  the trial's closing CPU sample, so it reads 0 % today, and the trial is marked steady).
"""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest

wds = pytest.importorskip("webdataset", reason="WebDataset is not installed: pip install '.[integrations]'")

from autoloader import make_loader, tune  # noqa: E402

from _helpers import BUDGET_S, check_epochs, check_same_config  # noqa: E402

SHARDS = 2
PER_SHARD = 32
N = SHARDS * PER_SHARD


@pytest.fixture(scope="module")
def shard_urls(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"{i:06d}", "npy": np.full((3, 8, 8), i % 256, dtype=np.uint8), "cls": i})
    urls = sorted(str(p) for p in root.glob("shard-*.tar"))
    assert len(urls) == SHARDS
    return urls


def wait_a_little(sample):
    """Per-sample latency (as a remote read): the search wants many workers for this pipeline."""
    time.sleep(0.002)
    return sample


def busy_a_little(sample):
    """Per-sample CPU work (as decoding): workers are busy, not waiting."""
    end = time.process_time() + 0.002
    while time.process_time() < end:
        pass
    return sample


def pipeline(urls, per_sample):
    return (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None, workersplitter=wds.split_by_worker)
            .shuffle(N).decode().to_tuple("npy", "cls").map(per_sample))


def test_fewer_shards_than_workers_is_a_failed_candidate_not_a_crash(shard_urls, cache_dir):
    loader = make_loader(pipeline(shard_urls, wait_a_little), batch_size=8, device="cpu", budget=BUDGET_S,
                         max_workers=16, tuning="trials")
    try:
        tuning = loader.tuning
        check_same_config([tuning.to_dict()])
        assert tuning.num_workers <= SHARDS, (
            f"chose {tuning.num_workers} workers for {SHARDS} shards: the extra workers read nothing")
        for trial in tuning.trials:
            if trial.config.num_workers > SHARDS:
                assert trial.status != "ok", f"{trial.config.label()} cannot run on {SHARDS} shards: {trial}"
        epochs = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            epochs.append([int(i) for _, ids in loader for i in ids])
        check_epochs([epochs], N)
    finally:
        del loader
        gc.collect()


def test_finite_stream_worker_cpu_is_measured(shard_urls):
    """One worker busy decoding a finite stream: its CPU share is measured (well above 0), or the trial says it
    could not measure it (``worker_cpu_util is None``) and is not marked steady. 0 % would read as "io"."""
    result = tune(pipeline(shard_urls, busy_a_little), batch_size=8, device="cpu", budget=BUDGET_S, max_workers=1)
    one = [t for t in result.trials if t.config.num_workers == 1 and t.ok]
    assert one, f"no successful 1-worker trial: {result.trials}"
    for trial in one:
        if trial.worker_cpu_util is None:
            assert not trial.steady, f"worker CPU unknown but the trial is marked steady: {trial}"
        else:
            assert trial.worker_cpu_util > 0.2, (
                f"a worker busy decoding reads {trial.worker_cpu_util:.0%} CPU (steady={trial.steady}): the stream "
                f"ended inside the trial and the workers exited before the closing CPU sample")
