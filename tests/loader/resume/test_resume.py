"""Exact resume (autoloader.loader.resume.state, NOTE [ Exact resume ]): ``PrefetchLoader.state_dict()`` taken after k
batches, saved with torch.save or JSON, loaded into a new loader (maybe another configuration) in a fresh RNG state:
the new loader yields exactly what the uninterrupted run yields after batch k, this epoch and the next.

The loop draws from the global RNG between batches (as dropout does), so an RNG left where it should not be shows.
"""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

from autoloader import PrefetchLoader, make_loader
from helpers import round_trip, wait_no_children
from online_data import Indexed

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")

N, BATCH = 103, 10


class Counted(Indexed):
    """``Indexed`` that counts the samples loaded in this process."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.loaded = 0

    def __getitem__(self, i: int) -> torch.Tensor:
        self.loaded += 1
        return super().__getitem__(i)


class OwnStateSampler(Sampler):
    """A sampler with its own RNG (Python's) and ``state_dict``: the state it saves is what redraws the epoch."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng, self.loads = n, random.Random(seed), 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = list(range(self.n))
        self.rng.shuffle(order)
        return iter(order)

    def state_dict(self):
        return {"rng": repr(self.rng.getstate())}

    def load_state_dict(self, state) -> None:
        self.loads += 1
        self.rng.setstate(eval(state["rng"]))  # noqa: S307 - the test's own repr


class GlobalRngSampler(Sampler):
    """No ``state_dict``: draws its order from the global RNG, lazily, at the first ``next()``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        yield from torch.randperm(self.n).tolist()


class Counter(IterableDataset):
    """0, 1, 2, ... ``n - 1`` then from where it stopped; its position is its state."""

    def __init__(self, n: int, stateful: bool = True) -> None:
        self.n, self.position, self.stateful = n, 0, stateful

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield torch.tensor([self.position - 1])
        self.position = 0

    def __getattr__(self, name):
        if name in ("state_dict", "load_state_dict") and self.__dict__.get("stateful"):
            return {"state_dict": lambda: {"position": self.position},
                    "load_state_dict": lambda s: setattr(self, "position", s["position"])}[name]
        raise AttributeError(name)


def _ids(batch) -> list:
    return batch.view(-1).tolist()


def _loop(loader, epochs, *, stop_after=None):
    """Per epoch, the index lists; the loop draws from the global RNG after each batch. With ``stop_after`` it
    returns (batches so far, state) after that many batches of the last epoch."""
    out = []
    for epoch in range(epochs):
        out.append([])
        for batch in loader:
            out[-1].append(_ids(batch))
            torch.rand(3)
            if stop_after is not None and epoch == epochs - 1 and len(out[-1]) == stop_after:
                return out, loader.state_dict()
    return out, None


def _check_exact(make, *, epoch=0, k=4, resume=None, how="torch"):
    """The uninterrupted run against a run stopped after ``k`` batches of ``epoch`` and resumed by ``resume()``."""
    torch.manual_seed(0)
    whole, _ = _loop(make(), epoch + 2)
    torch.manual_seed(0)
    before, state = _loop(make(), epoch + 1, stop_after=k)
    torch.manual_seed(1234)  # another process, another RNG state
    resumed = (resume or make)()
    resumed.load_state_dict(round_trip(state, how))
    after, _ = _loop(resumed, 2)
    assert before[epoch] == whole[epoch][:k]
    assert after[0] == whole[epoch][k:], "the rest of the interrupted epoch"
    assert after[1] == whole[epoch + 1], "the next epoch"
    return resumed


def _plain(**kwargs):
    data = kwargs.pop("data", None) or Indexed(N)
    return lambda: PrefetchLoader(DataLoader(data, BATCH, **kwargs))


@pytest.mark.parametrize("how", ["torch", "json"])
def test_shuffle_with_a_generator_resumes_exactly_with_more_workers(how):
    gen = dict(shuffle=True, generator=None)
    make = lambda workers=0: PrefetchLoader(DataLoader(  # noqa: E731
        Indexed(N), BATCH, num_workers=workers, **{**gen, "generator": torch.Generator().manual_seed(7)}))
    _check_exact(make, epoch=1, k=3, resume=lambda: make(2 if how == "torch" else 0), how=how)
    assert wait_no_children() == []


@pytest.mark.parametrize("setup", ["global-seed", "drop-last", "own-state-sampler", "no-state-sampler"])
def test_exact_for_each_kind_of_order(setup):
    kwargs = {"global-seed": lambda: dict(shuffle=True), "drop-last": lambda: dict(shuffle=True, drop_last=True),
              "own-state-sampler": lambda: dict(sampler=OwnStateSampler(N, 3)),
              "no-state-sampler": lambda: dict(sampler=GlobalRngSampler(N))}[setup]
    resumed = _check_exact(lambda: _plain(**kwargs())(), epoch=1, k=5)
    if setup == "own-state-sampler":
        assert resumed.sampler.loads >= 1, "a sampler with state_dict is restored through it"


def test_skipped_batches_load_no_sample():
    torch.manual_seed(0)
    loader = _plain(sampler=GlobalRngSampler(N))()
    _, state = _loop(loader, 1, stop_after=7)
    data = Counted(N)
    resumed = _plain(data=data, sampler=GlobalRngSampler(N))()
    resumed.load_state_dict(state)
    rest = [_ids(b) for b in resumed]
    assert len(rest) == len(loader) - 7 and data.loaded == N - 7 * BATCH, "skipped batches are never loaded"


def test_distributed_sampler_per_rank_and_a_changed_world_size_raises():
    for rank in (0, 1):
        _check_exact(lambda: _plain(sampler=DistributedSampler(Indexed(N), num_replicas=2, rank=rank, seed=4))(),
                     epoch=1, k=2)
    torch.manual_seed(0)
    _, state = _loop(_plain(sampler=DistributedSampler(Indexed(N), num_replicas=2, rank=0))(), 1, stop_after=2)
    other = _plain(sampler=DistributedSampler(Indexed(N), num_replicas=3, rank=0))()
    with pytest.raises(ValueError, match="num_replicas=2 but this loader has num_replicas=3"):
        other.load_state_dict(state)


def test_a_save_between_epochs_and_a_broken_state():
    torch.manual_seed(0)
    whole, _ = _loop(_plain(shuffle=True)(), 3)
    torch.manual_seed(0)
    loader = _plain(shuffle=True)()
    _loop(loader, 1)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 0 and not state["in_epoch"]
    torch.manual_seed(5)
    resumed = _plain(shuffle=True)()
    resumed.load_state_dict(round_trip(state, "json"))
    assert _loop(resumed, 2)[0] == whole[1:]
    torch.manual_seed(0)
    _, at_last = _loop(_plain(shuffle=True)(), 2, stop_after=len(whole[1]))  # inside the loop, after its last batch
    assert at_last["epoch"] == 1 and at_last["batches"] == len(whole[1]), "after the epoch's last batch"
    torch.manual_seed(5)
    resumed = _plain(shuffle=True)()
    resumed.load_state_dict(at_last)
    assert _loop(resumed, 1)[0] == whole[2:]
    with pytest.raises(ValueError, match="format"):
        resumed.load_state_dict({"format": 99})
    with pytest.raises(ValueError, match="digest"):
        resumed.load_state_dict({**state, "batches": 1})
    with pytest.raises(ValueError, match="saved by world_size=2 processes but this run has world_size=1"):
        resumed.load_state_dict({"format": state["format"], "world_size": 2, "per_rank": [state, state]})
    with pytest.raises(ValueError, match="pass the same generator="):
        _plain(shuffle=True, generator=torch.Generator())().load_state_dict(state)
    with pytest.raises(ValueError, match="saved with sampler='RandomSampler' but this loader has sampler="):
        PrefetchLoader(DataLoader(Indexed(N), 5)).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with batch_size=10 but this loader has batch_size=5"):
        PrefetchLoader(DataLoader(Indexed(N), 5, shuffle=True)).load_state_dict(state)


def test_iterable_dataset_resumes_through_its_state_dict_else_a_clear_error():
    whole = [_ids(b) for b in PrefetchLoader(DataLoader(Counter(50), 4))]
    loader = PrefetchLoader(DataLoader(Counter(50), 4))
    it = iter(loader)
    first = [_ids(next(it)) for _ in range(3)]
    state = round_trip(loader.state_dict(), "json")
    resumed = PrefetchLoader(DataLoader(Counter(50), 4))
    resumed.load_state_dict(state)
    assert first + [_ids(b) for b in resumed] == whole
    plain = PrefetchLoader(DataLoader(Counter(50, stateful=False), 4))
    next(iter(plain))
    with pytest.raises(ValueError, match="has no state_dict"):
        plain.state_dict()


@pytest.mark.slow
def test_online_save_mid_search_resumes_exactly_online_trials_or_threads():
    data = Indexed(1203, latency_s=0.0003)
    gen = lambda: torch.Generator().manual_seed(9)  # noqa: E731
    online = lambda: make_loader(data, 10, shuffle=True, generator=gen(), cache=False,  # noqa: E731
                                 tuning="online", max_workers=2)
    fixed = lambda: make_loader(data, 10, shuffle=True, generator=gen(), cache=False,  # noqa: E731
                                tuning="trials", num_workers=1)
    threads = lambda: make_loader(data, 10, shuffle=True, generator=gen(), cache=False,  # noqa: E731
                                  tuning="trials", num_workers=0, threads=2)
    torch.manual_seed(0)
    loader = online()
    _, state = _loop(loader, 1, stop_after=30)
    assert loader.online_traces and not loader.decisions, "the save happened while candidates served the epoch"
    for resume in (online, fixed, threads):
        _check_exact(online, epoch=0, k=30, resume=resume)
    assert wait_no_children() == []
