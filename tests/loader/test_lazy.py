"""make_loader's LazySource (autoloader.loader.lazy): nothing is read before the first ``iter()`` (NOTE [ Nothing before
iter() ]); what is set on the loader before then reaches the real source; a failed start is tried again."""
from __future__ import annotations

import gc
import time

import pytest
import torch
from torch.utils.data import DataLoader

import autoloader.factory as _factory
from autoloader import make_loader
from conformance_data import Counting, WhoLoads, mark_worker
from helpers import drain, live_children, wait_no_children

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")


def test_before_the_first_iter_it_answers_as_its_stand_in(tmp_path):
    data = Counting(8)
    loader = make_loader(data, batch_size=2, num_workers=1, prefetch_factor=3, cache=tmp_path, budget=0.5)
    assert data.reads == 0 and not live_children()
    assert type(loader.loader) is DataLoader and loader.loader.num_workers == 1 and loader.prefetch_factor == 3
    assert loader.tuning.source == "pending" and loader.cache_key is None and loader.decisions == ()
    data.scale = 1
    assert drain(loader) == drain(DataLoader(data, batch_size=2))
    assert loader.tuning.source == "tuned" and loader.cache_key is not None and loader.num_workers == 1


def test_a_worker_init_fn_set_before_the_first_iter_runs_in_the_workers():
    """Lightning's ``seed_everything(workers=True)`` sets it on the loader it is given, before iterating it."""
    loader = make_loader(WhoLoads(8), batch_size=2, num_workers=2, cache=False, budget=0.5)
    loader.worker_init_fn = mark_worker
    assert loader.worker_init_fn is mark_worker
    rows = [row for batch in drain(loader) for row in batch[2]]
    assert {row[4] for row in rows} == {100, 101}, "worker_init_fn ran in both workers"
    assert loader.worker_init_fn is mark_worker


def test_a_failed_start_is_tried_again_at_the_next_iter(monkeypatch):
    real, calls = _factory._resolve, []

    def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(_factory, "_resolve", interrupted_once)
    loader = make_loader(Counting(4), batch_size=2, num_workers=0, cache=False, budget=0.5)
    loader.dataset.scale = 1
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    assert loader.tuning.source == "pending"
    assert [b.view(-1).tolist() for b in loader] == [[0, 1], [2, 3]] and len(calls) == 2


@pytest.mark.slow
def test_set_epoch_and_a_state_loaded_before_the_first_iter():
    def make():
        return make_loader(Counting(12), batch_size=2, shuffle=True, num_workers=0, cache=False, budget=0.5,
                           generator=torch.Generator().manual_seed(1))

    saver = make()
    saver.dataset.scale = 1
    saver.set_epoch(4)
    it = iter(saver)
    seen = [next(it).view(-1).tolist() for _ in range(2)]
    state = saver.state_dict()
    rest = [b.view(-1).tolist() for b in it]
    resumed = make()
    resumed.dataset.scale = 1
    resumed.load_state_dict(state)  # before its first iter(): nothing was built yet
    assert state["epoch"] == 4 and seen and [b.view(-1).tolist() for b in resumed] == rest


class Waiting(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.002)  # waits: the trials choose workers
        return torch.tensor([i])


def test_an_epoch_left_after_one_batch_frees_its_workers_without_a_garbage_collection():
    """The loop takes one batch of a lazily tuned epoch (the trials' workers serve it) and drops the loader: the
    workers go with it. The served epoch's driver once kept its GeneratorExit in a local, a cycle through its frame
    and the run that held the workers until a garbage collection (found by a ``-m slow`` test's teardown)."""
    gc.collect()
    gc.disable()
    try:
        loader = make_loader(Waiting(400), batch_size=8, max_workers=2, cache=False, budget=2.0, step=0.001)
        next(iter(loader))
        assert loader.tuning.num_workers > 0 and live_children()
        del loader
        assert wait_no_children(5) == [], "the epoch's workers waited for a garbage collection"
    finally:
        gc.enable()
