"""What a DataLoader user relies on, each behaviour run against a plain ``DataLoader`` and ``make_loader`` in the same
test (modelled on the behaviours PyTorch's own test/test_dataloader.py covers; internals such as ``_iterator`` are
out of scope): order and content, samplers and batch samplers, ``len()``, dict/namedtuple/custom batches,
``worker_init_fn``, worker info and seeds, errors and their types, timeouts, start methods, persistent workers, the
DataLoader's attributes. make_loader runs as users meet it: tuned online (the default, few workers), or with the
workers fixed (trials at the first ``iter()``). Slow cases (timeouts, spawned workers) run in CI's slow step."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, WeightedRandomSampler)

from autoloader import make_loader
from conformance_data import (Numbers, Pair, Pids, RaggedBatches, Ready, Record, Records, Sharded, Slow, Unsized,
                              WhoLoads, as_record, bad_collate, failing_init, keep_as_list, mark_worker)
from contracts import seed_all
from helpers import REPO, TESTS, drain, raised

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning", "ignore::UserWarning")

ONLINE = dict(cache=False, max_workers=2)
"""make_loader as users meet it: tuned online, here with at most 2 workers."""
FIXED = dict(cache=False, budget=0.5)
"""make_loader with the test's ``num_workers`` fixed: trials at the first iter() tune the other knobs."""


def epochs(loader, count: int = 2) -> list:
    return [drain(loader) for _ in range(count)]


def side_by_side(make_dataset, *, seed: int = 0, count: int = 2, ours: dict = ONLINE, **kwargs):
    """``count`` epochs of ``DataLoader(dataset, **kwargs)`` and of ``make_loader(dataset, **kwargs, **ours)``, each
    from the global RNGs seeded with ``seed`` and its own dataset and samplers (``make_dataset``, ``kwargs`` values that are
    callables of the dataset)."""
    runs = []
    for build in (DataLoader, lambda d, **k: make_loader(d, **k, **ours)):
        seed_all(seed)
        dataset = make_dataset()
        made = {k: v(dataset) if callable(v) and k in ("sampler", "batch_sampler", "generator") else v
                for k, v in kwargs.items()}
        runs.append(epochs(build(dataset, **made), count))
    return runs


# -- order and content: samplers and batch samplers ----------------------------------------------------------------

SAMPLINGS = {
    "sequential": dict(batch_size=3),
    "drop_last": dict(batch_size=3, drop_last=True),
    "shuffle, global RNG": dict(batch_size=4, shuffle=True),
    "shuffle, generator": dict(batch_size=4, shuffle=True, generator=lambda d: torch.Generator().manual_seed(9)),
    "RandomSampler with replacement": dict(batch_size=5, sampler=lambda d: RandomSampler(d, replacement=True,
                                                                                        num_samples=23)),
    "WeightedRandomSampler": dict(batch_size=4, sampler=lambda d: WeightedRandomSampler([1.0, 3.0] * 10, 20)),
    "SubsetRandomSampler": dict(batch_size=2, sampler=lambda d: SubsetRandomSampler(range(0, 20, 3))),
    "SequentialSampler": dict(batch_size=6, sampler=lambda d: SequentialSampler(d)),
    "BatchSampler": dict(batch_sampler=lambda d: BatchSampler(RandomSampler(d), 3, drop_last=True)),
    "a batch sampler of its own": dict(batch_sampler=lambda d: RaggedBatches(len(d))),
    "batch_size=None": dict(batch_size=None, shuffle=True),
}


@pytest.mark.parametrize("kwargs", list(SAMPLINGS.values()), ids=list(SAMPLINGS))
def test_order_and_content(kwargs):
    theirs, ours = side_by_side(lambda: Numbers(20), seed=4, **kwargs)
    assert ours == theirs and theirs[0], "every epoch: the same batches, in the same order"


def test_a_distributed_sampler_follows_set_epoch():
    def run(build):
        data = Numbers(20)
        sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
        loader = build(data, sampler)
        seen = []
        for epoch in (0, 1, 5, 2):
            loader.sampler.set_epoch(epoch)  # as Lightning does, on the loader's sampler
            seen.append(drain(loader))
        return seen

    theirs = run(lambda d, s: DataLoader(d, batch_size=3, sampler=s))
    assert run(lambda d, s: make_loader(d, batch_size=3, sampler=s, **ONLINE)) == theirs
    assert len({str(epoch) for epoch in theirs}) == 4
    # Known difference: set_epoch(e) again with the same e before the next epoch reads as "nobody called set_epoch",
    # and autoloader advances the epoch itself (NOTE [ What frameworks read ]: Accelerate's loops never call it).


def test_len():
    cases = [(Numbers(20), dict(batch_size=3)), (Numbers(20), dict(batch_size=3, drop_last=True)),
             (Numbers(20), dict(batch_size=None)), (Numbers(20), dict(batch_sampler=RaggedBatches(20))),
             (Sharded(20), dict(batch_size=3)), (Sharded(20), dict(batch_size=3, drop_last=True))]
    for dataset, kwargs in cases:
        want = len(DataLoader(dataset, **kwargs))
        loader = make_loader(dataset, **kwargs, **ONLINE)
        assert len(loader) == want, kwargs  # before the first iter()
        drain(loader)
        assert len(loader) == want, kwargs
    assert len(DataLoader(Sharded(20), batch_size=3)) == math.ceil(20 / 3)
    for made in (DataLoader(Unsized(), batch_size=2), make_loader(Unsized(), batch_size=2, **ONLINE)):
        with pytest.raises(TypeError):
            len(made)


def test_an_empty_dataset():
    """DataLoader loads an empty map-style dataset as empty epochs: so does make_loader, with nothing to tune."""
    empty = Numbers(0)
    assert len(make_loader(empty, batch_size=2, **ONLINE)) == len(DataLoader(empty, batch_size=2)) == 0
    loader = make_loader(empty, batch_size=2, **ONLINE)
    assert epochs(loader) == [[], []] and loader.tuning.source == "fallback"


# -- batches of any structure --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [dict(batch_size=4), dict(batch_size=4, collate_fn=keep_as_list),
                                    dict(batch_size=None)], ids=["collated", "collate_fn", "batch_size=None"])
def test_dict_and_namedtuple_batches(kwargs):
    theirs, ours = side_by_side(Records, count=1, **kwargs)
    assert ours == theirs
    if "collate_fn" not in kwargs and kwargs["batch_size"]:
        first = theirs[0][0]
        assert first[0] == "dict" and first[1]["pair"][0] == "Pair", "a dict of a namedtuple, as collated"


def test_a_custom_batch_type_and_numpy_items():
    theirs = [b for b in DataLoader(Numbers(8), batch_size=3, collate_fn=as_record)]
    ours = [b for b in make_loader(Numbers(8), batch_size=3, collate_fn=as_record, **ONLINE)]
    assert ours == theirs and all(type(b) is Record for b in ours), "a batch that is no tensor passes as it is"
    theirs, ours = side_by_side(Ready, count=1, batch_size=2)  # numpy items, collated into tensors
    assert ours == theirs and theirs[0][0][1][0][0] == "tensor"
    assert isinstance(next(iter(make_loader(Numbers(4), batch_size=2, collate_fn=lambda s: Pair(*s),
                                            **ONLINE))), Pair)


# -- workers: worker_init_fn, get_worker_info, seeds -----------------------------------------------------------------

def test_worker_init_fn_worker_info_and_seeds():
    """With the user's generator, each worker's torch seed is the one DataLoader gives it (base seed + id): tuning
    draws nothing from the user's generator; worker_init_fn runs in every worker, before its first sample. (With
    persistent workers the tuner chose, later epochs keep the first epoch's workers and so their seeds.)"""
    theirs, ours = side_by_side(lambda: WhoLoads(16), ours=FIXED, batch_size=2, num_workers=2,
                                persistent_workers=False, worker_init_fn=mark_worker,
                                generator=lambda d: torch.Generator().manual_seed(11))
    assert ours == theirs
    rows = [row for batch in theirs[0] for row in batch[2]]
    assert {(r[1], r[2], r[4]) for r in rows} == {(0, 2, 100), (1, 2, 101)}, "worker id, workers, worker_init_fn"
    assert len({r[3] for r in rows}) == 2 and theirs[0] != theirs[1], "a seed per worker, new each epoch"


@pytest.mark.slow
def test_main_process_loading_has_no_worker_info():
    theirs, ours = side_by_side(lambda: WhoLoads(6), ours=FIXED,
                                batch_size=3, num_workers=0)
    assert ours == theirs and all(row[1] == -1 for batch in ours[0] for row in batch[2])


@pytest.mark.slow
def test_an_iterable_dataset_split_by_worker_info():
    for sharded in (True, False):  # not split: every worker yields it all, as DataLoader does
        theirs, ours = side_by_side(lambda: Sharded(12, shard=sharded), ours=FIXED, batch_size=4, num_workers=2)
        assert ours == theirs
        assert len([row for batch in ours[0] for row in batch[2]]) == 12 * (1 if sharded else 2)


# -- errors and their types -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case, workers", [("ValueError", 0), ("ValueError", 2), ("KeyError", 0), ("collate_fn", 0),
                                           ("every sample", 0)] + [pytest.param(case, 2, marks=pytest.mark.slow)
                                                                   for case in ("KeyError", "collate_fn", "every sample")])
def test_errors_keep_their_type_and_the_epoch_goes_on(case, workers):
    dataset = {"ValueError": lambda: Numbers(12, bad=(5,)), "KeyError": lambda: Numbers(12, bad=(5,), key=True),
               "collate_fn": lambda: Numbers(12), "every sample": lambda: Numbers(12, bad=tuple(range(12)))}[case]
    kwargs = dict(batch_size=3, num_workers=workers, collate_fn=bad_collate if case == "collate_fn" else None)
    theirs, ours = side_by_side(dataset, ours=FIXED, **kwargs)
    assert ours == theirs
    assert any(item[0] == "raised" for item in ours[0]), "it raised"


@pytest.mark.slow
def test_a_failing_worker_init_fn():
    theirs, ours = side_by_side(lambda: Numbers(12), ours=FIXED, batch_size=2,
                                num_workers=2, worker_init_fn=failing_init)
    assert ours == theirs and ("raised", "ValueError", "worker 1 cannot start") in ours[0]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_timeout(workers):
    """A worker slower than ``timeout`` is a RuntimeError from ``next()``."""
    for made in (DataLoader(Slow(3.0), batch_size=2, num_workers=workers, timeout=0.5),
                 make_loader(Slow(3.0), batch_size=2, num_workers=workers, timeout=0.5, cache=False, budget=0.5)):
        assert raised(made) == ("RuntimeError", "DataLoader timed out after 0.5 seconds")


@pytest.mark.slow
def test_a_timeout_without_workers():
    """A known difference: DataLoader accepts ``timeout`` with ``num_workers=0`` and then fails at ``iter()`` (an
    assertion in its single-process iterator); autoloader, which may choose no workers, loads without the timeout."""
    kwargs = dict(batch_size=4, num_workers=0, timeout=0.5)
    assert raised(DataLoader(Numbers(8), **kwargs))[0] == "AssertionError"
    assert drain(make_loader(Numbers(8), **kwargs, **FIXED)) == drain(DataLoader(Numbers(8), batch_size=4))


# -- start methods and persistent workers ----------------------------------------------------------------------------

_START_METHODS = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    sys.path[:0] = sys.argv[1:]
    from test_conformance_dataloader import FIXED, side_by_side
    from conformance_data import WhoLoads, mark_worker
    if __name__ == "__main__":
        same = {}
        for method in ("spawn", "forkserver"):
            theirs, ours = side_by_side(lambda: WhoLoads(8), ours=FIXED, count=1, batch_size=2, num_workers=2,
                                        multiprocessing_context=method, worker_init_fn=mark_worker,
                                        generator=lambda d: torch.Generator().manual_seed(2))
            same[method] = ours == theirs and len(ours[0]) == 4
        print(json.dumps(same))
""")


@pytest.mark.slow
def test_start_methods():
    """Spawned and forkserver workers (in a subprocess: their helper processes outlive the loaders)."""
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", _START_METHODS, here, str(TESTS), str(REPO)], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"spawn": True, "forkserver": True}


def test_persistent_workers_are_kept_across_epochs():
    for build in (lambda d: DataLoader(d, batch_size=2, num_workers=2, persistent_workers=True),
                  lambda d: make_loader(d, batch_size=2, num_workers=2, persistent_workers=True, **FIXED)):
        seen = epochs(build(Pids()), 3)
        pids = [{row[1] for batch in epoch for row in batch[2]} for epoch in seen]
        assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]


@pytest.mark.slow
def test_persistent_workers_and_a_shared_generator_draw_one_base_seed_every_epoch():
    """The one known difference (README "Use it"): with persistent workers, a DataLoader draws its workers' base seed
    from the generator at the first epoch only, so a generator shared with the sampler gives later epochs another
    order than without them; autoloader draws one every epoch (NOTE [ One base seed per epoch ]), so the order never
    depends on persistent_workers: it is the non-persistent DataLoader's."""
    shared = dict(batch_size=4, shuffle=True, num_workers=2, generator=lambda d: torch.Generator().manual_seed(5))
    persistent, ours = side_by_side(lambda: Numbers(16), ours=FIXED, count=3, persistent_workers=True,
                                    **shared)
    fresh, _ = side_by_side(lambda: Numbers(16), ours=FIXED, count=3, persistent_workers=False, **shared)
    assert ours[0] == persistent[0] == fresh[0] and ours == fresh and persistent != fresh


# -- the DataLoader's attributes -------------------------------------------------------------------------------------

def test_the_dataloaders_attributes():
    data = Numbers(10)
    kwargs = dict(batch_size=3, drop_last=True, collate_fn=bad_collate, num_workers=1, timeout=7, prefetch_factor=3,
                  generator=torch.Generator())
    theirs = DataLoader(data, **kwargs)
    ours = make_loader(data, **kwargs, cache=False, budget=0.5)
    for name in ("dataset", "batch_size", "drop_last", "collate_fn", "num_workers", "timeout", "prefetch_factor",
                 "generator", "in_order"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert type(ours.sampler) is type(theirs.sampler) and type(ours.batch_sampler) is type(theirs.batch_sampler)
