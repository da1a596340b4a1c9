"""An independent check of README "Checkpoint and resume", modelled on torchdata's StatefulDataLoader tests
(test/stateful_dataloader/test_state_dict.py: snapshot at zero, at the end, after a load, multi-epoch, a sampler
without state, two loaders at once, JSON) plus the repros of an earlier independent suite.

Every case runs the uninterrupted loop (a fresh, identically seeded loader), then the same loop stopped at a save
point, and a new loader (maybe another configuration) made in another RNG state that loads the state: the batches it
yields (sample indices: every dataset's sample is its index) and the loop's draws from torch's, Python's and numpy's
global RNGs after each batch and after the last epoch must be the uninterrupted run's, from the save point on. A save
"at (e, k)" is after k batches of pass e, inside the loop (k=0: before pass e's ``iter()``).
"""
from __future__ import annotations

import gc
import random
import time
import warnings
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import pytest
import torch
from torch.utils.data import (BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler,
                              Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler)

from autoloader import PrefetchLoader, make_loader, with_threads
from autoloader.loader.resume.state import _digest
from helpers import live_children, round_trip, wait_no_children

pytestmark = [pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning", "ignore::UserWarning"),
              pytest.mark.slow]  # 77 cases, ~2 min: CI's slow step; its counterexamples are in test_resume_regressions


# -- data ------------------------------------------------------------------------------------------------------------
class Ids(Dataset):
    """Sample ``i`` is ``i``; ``latency_s`` makes online tuning try candidates."""

    def __init__(self, n: int, latency_s: float = 0.0) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.latency_s:
            time.sleep(self.latency_s)
        return torch.tensor(i)


class Records(Ids):
    """Sample ``i`` is a dict (``{"idx": i, "x": ...}``)."""

    def __getitem__(self, i: int) -> dict:
        return {"idx": i, "x": torch.full((2,), float(i))}


class Augmented(Dataset):
    """Draws from torch's, Python's and numpy's global RNGs while loading, as random augmentation does: sample
    ``i`` is ``[i, draw]``."""

    def __init__(self, n: int = 50) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, int(torch.randint(0, 1000, ())) * 10 ** 6 + random.randrange(1000) * 1000
                             + int(np.random.randint(1000))])


class Stream(IterableDataset):
    """0, 1, ... n-1, its position its ``state_dict()``; starts over after its end."""

    def __init__(self, n: int) -> None:
        self.n, self.position = n, 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield torch.tensor(self.position - 1)
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


class EpochStream(IterableDataset):
    """A permutation of 0..n-1 that changes every epoch: its own epoch counter (and position) is its state_dict(), as
    a stream that reshuffles its shards every epoch keeps it."""

    def __init__(self, n: int) -> None:
        self.n, self.position, self.epoch = n, 0, 0

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        while self.position < self.n:
            self.position += 1
            yield torch.tensor(order[self.position - 1])
        self.position, self.epoch = 0, self.epoch + 1

    def state_dict(self) -> dict:
        return {"position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.position, self.epoch = int(state["position"]), int(state["epoch"])


class OwnRandomSampler(Sampler):
    """Shuffles with Python's global ``random`` (lazily, at the first ``next()``), no state_dict."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = list(range(self.n))
        random.shuffle(order)
        yield from order


class NumpySampler(Sampler):
    """Shuffles with numpy's global RNG, eagerly at ``iter()``, no state_dict."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(np.random.permutation(self.n).tolist())


class PrivateSampler(Sampler):
    """Shuffles with its own ``random.Random`` and has no state_dict: autoloader cannot see its RNG."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, random.Random(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = list(range(self.n))
        self.rng.shuffle(order)
        return iter(order)


class NoLenSampler(Sampler):
    """A shuffled order drawn from torch's global RNG at the first ``next()``, without ``__len__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        yield from torch.randperm(self.n).tolist()


class NoLenBatchSampler(Sampler):
    """Batches of 1 to 4 indices, sizes and order drawn from its generator as it is iterated, without ``__len__``."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator = n, generator

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.generator).tolist()
        while order:
            size = int(torch.randint(1, 5, (), generator=self.generator))
            yield order[:size]
            order = order[size:]


def dict_collate(samples: List[dict]) -> dict:
    return {"idx": torch.tensor([s["idx"] for s in samples]), "x": torch.stack([s["x"] for s in samples])}


# -- the loop --------------------------------------------------------------------------------------------------------
def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def draws() -> Tuple[float, float, float]:
    """The loop's own draws (as dropout or the user's code makes them)."""
    return float(torch.rand(())), random.random(), float(np.random.rand())


def ids(batch: Any) -> Any:
    if isinstance(batch, dict):
        return batch["idx"].view(-1).tolist()
    if isinstance(batch, torch.Tensor):
        return batch.reshape(-1).tolist() if batch.dim() < 2 else batch.tolist()
    return batch


Events = List[Tuple[Any, ...]]


def run(loader: Any, passes: int, *, first: int = 0, stop: Optional[Tuple[int, int]] = None,
        set_epoch: Optional[Callable[[Any, int], None]] = None) -> Tuple[Events, Optional[dict]]:
    """``passes`` passes of the loop, numbered from ``first``: per batch (epoch, position, ids, the loop's draws), and
    the loop's draws after the last pass. ``stop=(p, k)``: ``state_dict()`` after k batches of pass p (k=0: before
    its ``iter()``), returned with the events so far."""
    events: Events = []
    for p in range(passes):
        epoch = first + p
        if stop == (p, 0):
            return events, loader.state_dict()
        if set_epoch is not None:
            set_epoch(loader, epoch)
        n = 0
        for batch in loader:
            n += 1
            events.append((epoch, n, ids(batch), draws()))
            if stop == (p, n):
                return events, loader.state_dict()
        if n == 0:
            events.append((epoch, 0, "empty pass", None))
    events.append(("final", 0, None, draws()))
    return events, None


def same(events: Events) -> Events:
    """Events without the in-pass position (a resumed pass counts from 1)."""
    return [(e, i, d) for e, _, i, d in events]


def close(*loaders: Any) -> None:
    for loader in loaders:
        for inner in (loader, getattr(loader, "loader", None), getattr(loader, "_loader", None)):
            if getattr(inner, "_iterator", None) is not None:
                inner._iterator = None
    del loaders
    gc.collect()


def exact(make: Callable[[], Any], *, at: Tuple[int, int], epochs: int = 3, resume: Optional[Callable] = None,
          how: str = "json", chain: Optional[Tuple[int, Callable]] = None, after_load: bool = False,
          set_epoch: Optional[Callable[[Any, int], None]] = None) -> Events:
    """The uninterrupted run of ``make()`` for ``epochs`` passes against one saved ``at`` and resumed by
    ``resume()`` (default ``make``) in another RNG state. ``chain=(j, again)``: the resumed loader is saved again
    after j batches of its first pass and ``again()`` resumes that. ``after_load``: the state the resumed loader
    gives right after the load (before iterating) is what resumes. Returns the events compared."""
    e, k = at
    seed_all(0)
    reference = make()
    whole, _ = run(reference, epochs, set_epoch=set_epoch)
    close(reference)
    seed_all(0)
    saver = make()
    before, state = run(saver, e + 1, stop=at, set_epoch=set_epoch)
    close(saver)
    assert state is not None, "the save point was not reached"
    assert same(before) == same(whole[:len(before)]), "the saver's own run before the save"
    length = sum(1 for ev in whole if ev[0] == e)
    start = e + 1 if 0 < k == length else e  # after the epoch's last batch: the next pass is the next epoch (README)
    want = same([ev for ev in whole if ev[0] == "final" or (ev[0], ev[1]) > (e, k)])
    seed_all(1234)  # another process, another RNG state
    resumer = (resume or make)()
    resumer.load_state_dict(round_trip(state, how))
    if after_load:
        again = resumer.state_dict()
        assert round_trip(again, how) == round_trip(state, how), "state_dict() right after a load is the loaded state"
        close(resumer)
        seed_all(4321)
        resumer = (resume or make)()
        resumer.load_state_dict(round_trip(again, how))
    got: Events = []
    if chain is not None:
        j, again_make = chain
        got, mid = run(resumer, 1, first=start, stop=(0, j), set_epoch=set_epoch)
        close(resumer)
        assert mid is not None, "the chained save point was not reached"
        seed_all(999)
        resumer = again_make()
        resumer.load_state_dict(round_trip(mid, how))
        first_pass = sum(1 for ev in want if ev[0] == start)
        start = start + 1 if 0 < j == first_pass else start
    rest, _ = run(resumer, epochs - start, first=start, set_epoch=set_epoch)
    close(resumer)
    got = same(got + rest)
    assert [g[:2] for g in got] == [w[:2] for w in want], "the batches after the save (epoch, sample ids)"
    assert got == want, "the loop's draws from torch's, Python's and numpy's RNGs after the save"
    return want


def plain(dataset: Any = None, **kwargs: Any) -> Callable[[], PrefetchLoader]:
    """``PrefetchLoader(DataLoader(dataset, **kwargs))``; callables among the kwargs are made anew for each loader
    (a generator, a sampler)."""
    def make() -> PrefetchLoader:
        data = dataset() if callable(dataset) else dataset
        made = {k: (v() if callable(v) and k in ("generator", "sampler", "batch_sampler") else v)
                for k, v in kwargs.items()}
        return PrefetchLoader(DataLoader(data, **made))
    return make


def tuned(dataset: Any, batch_size: int, **kwargs: Any) -> Callable[[], PrefetchLoader]:
    """``make_loader`` quick to tune: no cache, a small budget, at most 2 workers."""
    def make() -> PrefetchLoader:
        data = dataset() if callable(dataset) else dataset
        made = {k: (v() if callable(v) and k in ("generator", "sampler", "batch_sampler") else v)
                for k, v in kwargs.items()}
        made = {"cache": False, "budget": 0.3, "max_workers": 2, **made}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return make_loader(data, batch_size, **made)
    return make


def gen(seed: int = 0) -> Callable[[], torch.Generator]:
    return lambda: torch.Generator().manual_seed(seed)


@pytest.fixture(autouse=True)
def no_child_outlives_the_test():
    assert live_children() == [], "a child process was running before the test"
    yield
    gc.collect()
    left = wait_no_children(10.0)
    for child in left:
        child.kill()
    assert left == [], f"child processes outlived the test: {left}"


# -- the earlier suite's repros, verbatim -------------------------------------------------------------------------
def test_repro1_persistent_workers_second_epoch():
    mk = lambda: PrefetchLoader(DataLoader(list(range(100)), batch_size=10, shuffle=True, num_workers=2,  # noqa: E731
                                           persistent_workers=True, generator=torch.Generator().manual_seed(0)))
    exact(mk, at=(1, 1), epochs=3)


@pytest.mark.parametrize("k", [8, 9])
def test_repro2_save_near_the_end_with_a_generator(k):
    mk = lambda: PrefetchLoader(DataLoader(list(range(100)), batch_size=10, shuffle=True, num_workers=2,  # noqa: E731
                                           generator=torch.Generator().manual_seed(0)))
    exact(mk, at=(0, k))


def test_repro3_replacement_draws_chunks_lazily():
    mk = plain(list(range(100)), batch_size=10, num_workers=2, sampler=lambda: RandomSampler(
        list(range(100)), replacement=True, num_samples=170, generator=torch.Generator().manual_seed(0)))
    exact(mk, at=(0, 2), resume=plain(list(range(100)), batch_size=10, sampler=lambda: RandomSampler(
        list(range(100)), replacement=True, num_samples=170, generator=torch.Generator().manual_seed(0))))


def test_repro4_state_dict_after_load_before_iterating():
    loader = PrefetchLoader(DataLoader(list(range(100)), batch_size=10, shuffle=True))
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    resumed = PrefetchLoader(DataLoader(list(range(100)), batch_size=10, shuffle=True))
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state and state["batches"] == 3
    exact(plain(list(range(100)), batch_size=10, shuffle=True), at=(0, 3), after_load=True)


def test_repro5_iterable_dataset_keeps_the_loops_draws():
    exact(plain(lambda: Stream(30), batch_size=4), at=(0, 2), epochs=1)


def test_repro6_stream_state_into_workers_is_a_value_error():
    loader = PrefetchLoader(DataLoader(Stream(30), batch_size=4))
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="num_workers=0"):
        PrefetchLoader(DataLoader(Stream(30), batch_size=4, num_workers=2)).load_state_dict(state)


@pytest.mark.parametrize("saved, other, drop_last", [(600, 605, True), (600, 595, False)])
def test_repro7_same_batch_count_other_length_refused(saved, other, drop_last):
    loader = PrefetchLoader(DataLoader(list(range(saved)), batch_size=10, shuffle=True, drop_last=drop_last))
    next(iter(loader))
    state = loader.state_dict()
    resumer = PrefetchLoader(DataLoader(list(range(other)), batch_size=10, shuffle=True, drop_last=drop_last))
    assert len(resumer) == state["length"]
    with pytest.raises(ValueError, match="len\\(dataset\\)"):
        resumer.load_state_dict(state)


def test_repro8_truncated_or_garbled_states_name_the_problem():
    loader = PrefetchLoader(DataLoader(list(range(100)), batch_size=10, shuffle=True))
    next(iter(loader))
    state = loader.state_dict()
    assert state["stream"] is None  # the dataset's own state (not digested): None, so removing it changes nothing
    damaged = [({k: v for k, v in state.items() if k != name}, "format" if name == "format" else "digest")
               for name in state if name != "stream"]  # each field removed in turn
    damaged += [({**state, "epoch": 2}, "digest"), ({**state, "digest": state["digest"][:8]}, "digest"),
                (None, "must be a dict"), ([state], "must be a dict"), ({**state, "format": "2"}, "format")]
    # forged: the digest recomputed after the damage, so each field's own check must name it
    body = {k: v for k, v in state.items() if k != "digest"}
    ambient = state["now"]["ambient"]
    for change, says in [
            ({"now": {**state["now"], "ambient": {**ambient, "torch": "AAAA"}}}, "state['now']['ambient']['torch']"),
            ({"now": {**state["now"], "ambient": {**ambient, "numpy": {**ambient["numpy"], "pos": 9999}}}},
             "state['now']['ambient']['numpy']"),
            ({"start": None}, "state['start']"), ({"drawn": None}, "state['drawn']"), ({"length": 1}, "batches"),
            ({"now": None}, "state['now']"), ({"batches": "3"}, "state['batches']"),
            ({"start": {**state["start"], "generators": {"loader": "AAAA"}}}, "state['start']['generators']")]:
        forged = {**body, **change}
        damaged.append(({**forged, "digest": _digest(forged)}, says))
    for bad, says in damaged:
        resumer = PrefetchLoader(DataLoader(list(range(100)), batch_size=10, shuffle=True))
        with pytest.raises(ValueError) as caught:
            resumer.load_state_dict(bad)
            next(iter(resumer))
        assert says in str(caught.value), f"{caught.value!r} does not name {says!r}"


def test_repro9_main_process_augmentation_resumes_exactly():
    exact(plain(Augmented(50), batch_size=5, shuffle=True), at=(0, 3))
    exact(plain(Augmented(50), batch_size=5, shuffle=True), at=(1, 9))


# -- save points (torchdata's snapshot at zero, at the end, after a load; chained) ----------------------------------
def test_never_iterated_state_resumes_the_whole_run_global_seed_only():
    exact(plain(Ids(47), batch_size=5, shuffle=True, num_workers=2), at=(0, 0),
          resume=plain(Ids(47), batch_size=5, shuffle=True))


def test_after_the_first_batch_workers_0_to_3():
    exact(plain(Ids(60), batch_size=4, shuffle=True, generator=gen(3)), at=(0, 1),
          resume=plain(Ids(60), batch_size=4, shuffle=True, generator=gen(3), num_workers=3))


def test_mid_epoch_of_the_second_epoch_workers_3_to_1_prefetch():
    exact(plain(Ids(90), batch_size=7, shuffle=True, num_workers=3, prefetch_factor=4), at=(1, 6),
          resume=plain(Ids(90), batch_size=7, shuffle=True, num_workers=1, prefetch_factor=1))


def test_second_to_last_batch_drop_last_generator():
    exact(plain(Ids(53), batch_size=5, shuffle=True, drop_last=True, generator=gen(1), num_workers=3), at=(0, 9),
          resume=plain(Ids(53), batch_size=5, shuffle=True, drop_last=True, generator=gen(1)))


@pytest.mark.parametrize("workers", [0, 2])
def test_after_the_last_batch_inside_the_loop_resumes_at_the_next_epoch(workers):
    """torchdata yields an empty pass here; autoloader's README: the next epoch (as Lightning expects)."""
    want = exact(plain(Ids(40), batch_size=8, shuffle=True, num_workers=workers), at=(0, 5))
    assert want[0][0] == 1 and len([w for w in want if w[0] == 1]) == 5


def test_after_the_loop_ended_between_epochs_persistent_to_plain():
    exact(plain(Ids(40), batch_size=6, shuffle=True, num_workers=2, persistent_workers=True), at=(1, 0), epochs=4,
          resume=plain(Ids(40), batch_size=6, shuffle=True))


def test_threads_and_pinning_may_change():
    """README: threads and pinning may change between save and resume (a ThreadedDataset fetches each batch)."""
    data = Ids(64)
    exact(plain(data, batch_size=8, shuffle=True, generator=gen(7), num_workers=2), at=(0, 3),
          resume=plain(with_threads(data, 3), batch_size=8, shuffle=True, generator=gen(7), pin_memory=True))
    exact(plain(with_threads(data, 2), batch_size=8, shuffle=True, generator=gen(7), num_workers=1), at=(1, 6),
          resume=plain(data, batch_size=8, shuffle=True, generator=gen(7)), how="torch")


def test_right_after_a_load_into_other_workers():
    exact(plain(Ids(70), batch_size=10, shuffle=True, generator=gen(5), num_workers=2), at=(0, 3), after_load=True,
          resume=plain(Ids(70), batch_size=10, shuffle=True, generator=gen(5), num_workers=1))


def test_chained_resumes_across_configurations():
    exact(plain(Ids(80), batch_size=6, shuffle=True, num_workers=2), at=(0, 4),
          resume=plain(Ids(80), batch_size=6, shuffle=True, num_workers=3, persistent_workers=True),
          chain=(3, plain(Ids(80), batch_size=6, shuffle=True)))


def test_chained_resume_saved_at_the_resumed_passes_last_batch():
    exact(plain(Ids(50), batch_size=10, shuffle=True, generator=gen(2), num_workers=2), at=(0, 2),
          resume=plain(Ids(50), batch_size=10, shuffle=True, generator=gen(2)),
          chain=(3, plain(Ids(50), batch_size=10, shuffle=True, generator=gen(2), num_workers=1)))


def test_many_epochs_after_a_save_in_the_first():
    exact(plain(Ids(30), batch_size=4, shuffle=True, num_workers=1, persistent_workers=True), at=(0, 2), epochs=5,
          resume=plain(Ids(30), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True))


def test_torchdata_multi_epoch_save_after_two_epochs_global_seed():
    """TestMultiEpochSDL: saved after 2 whole epochs (no generator), 2 more epochs equal a 4-epoch run."""
    exact(plain(Ids(100), batch_size=1, shuffle=True, num_workers=2), at=(2, 0), epochs=4)


@pytest.mark.parametrize("interrupt", [10, 50, 80])
def test_torchdata_sampler_without_state_after_a_break(interrupt):
    """TestNotStatefulSamplerSDL: break out of the loop at ``interrupt``, then state_dict()."""
    for sampler in (RandomSampler, SequentialSampler):
        make = plain(Ids(100), batch_size=1, sampler=lambda s=sampler: s(range(100)))
        seed_all(0)
        first = make()
        got = []
        for i, batch in enumerate(first):
            got.append(ids(batch))
            if i == interrupt:
                break
        state = first.state_dict()
        seed_all(0)
        resumed = make()
        resumed.load_state_dict(state)
        got += [ids(b) for b in resumed]
        seed_all(0)
        assert got == [ids(b) for b in make()]


def test_torchdata_load_into_the_same_loader_mid_iteration():
    """TestInitialState / test_map_iterrupted_shuffle: states loaded into the loader that made them, while its
    iterator (persistent workers) is mid-epoch."""
    seed_all(0)
    loader = PrefetchLoader(DataLoader(Ids(40), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True))
    state0 = loader.state_dict()
    exp = [ids(b) for b in loader]
    it = iter(loader)
    exp += [ids(next(it)) for _ in range(4)]
    state1 = loader.state_dict()
    loader.load_state_dict(state1)
    exp += [ids(b) for b in loader]
    loader.load_state_dict(state0)
    assert loader.state_dict() == state0
    again = [ids(b) for b in loader] + [ids(b) for b in loader]
    assert again == exp
    close(loader)


def test_torchdata_load_then_state_into_an_iterated_loader():
    """test_load_then_state: a never-iterated state loaded into a loader mid-epoch."""
    seed_all(0)
    loader = PrefetchLoader(DataLoader(Ids(40), batch_size=4, shuffle=True, num_workers=2))
    state0 = loader.state_dict()
    exp = [ids(b) for b in loader]
    seed_all(7)
    other = PrefetchLoader(DataLoader(Ids(40), batch_size=4, shuffle=True, num_workers=2))
    it = iter(other)
    for _ in range(3):
        next(it)
    other.load_state_dict(state0)
    assert other.state_dict() == state0
    assert [ids(b) for b in other] == exp
    del it
    close(loader, other)


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_state_dict_at_every_step_changes_nothing(kind):
    """Lightning may call state_dict() often: a run that calls it after every batch and between epochs is the run
    that never does (batches and the loop's draws)."""
    make = (plain(Augmented(30), batch_size=4, shuffle=True) if kind == "map" else
            plain(lambda: EpochStream(18), batch_size=4))

    def loop(states):
        seed_all(0)
        loader, out = make(), []
        for _ in range(3):
            if states:
                loader.state_dict()
            for batch in loader:
                out.append((ids(batch), draws()))
                if states:
                    loader.state_dict()
        return out + [draws()]

    assert loop(True) == loop(False)


def test_torchdata_two_loaders_at_once():
    """TestConcurrentDataLoaders: two loaders iterated together, both saved, both resumed."""
    def pair():
        return (PrefetchLoader(DataLoader(Ids(30), batch_size=3, shuffle=True, num_workers=1)),
                PrefetchLoader(DataLoader(Ids(20), batch_size=2, shuffle=True)))

    def loop(a, b, epochs, stop=None):
        out = []
        for epoch in range(epochs):
            for n, (x, y) in enumerate(zip(a, b), 1):
                out.append((epoch, ids(x), ids(y), draws()))
                if stop == (epoch, n):
                    return out, (a.state_dict(), b.state_dict())
        return out + [draws()], None

    seed_all(0)
    whole, _ = loop(*pair(), 3)
    seed_all(0)
    before, (sa, sb) = loop(*pair(), 2, stop=(1, 4))
    seed_all(55)
    a, b = pair()
    a.load_state_dict(round_trip(sa, "json"))
    b.load_state_dict(round_trip(sb, "torch"))
    rest, _ = loop(a, b, 2)
    rest = [(r[0] + 1,) + r[1:] if isinstance(r, tuple) and len(r) == 4 else r for r in rest]
    assert before + rest == whole
    close(a, b)


# -- samplers and batches -------------------------------------------------------------------------------------------
def test_weighted_random_sampler_with_a_generator_workers_1_to_2():
    weights = [1.0 + i % 4 for i in range(60)]
    exact(plain(Ids(60), batch_size=7, num_workers=1, sampler=lambda: WeightedRandomSampler(
        weights, 60, replacement=True, generator=torch.Generator().manual_seed(4))), at=(1, 3),
          resume=plain(Ids(60), batch_size=7, num_workers=2, sampler=lambda: WeightedRandomSampler(
              weights, 60, replacement=True, generator=torch.Generator().manual_seed(4))))


def test_weighted_without_replacement_global_seed():
    weights = [1.0 + i % 3 for i in range(45)]
    exact(plain(Ids(45), batch_size=4, sampler=lambda: WeightedRandomSampler(weights, 30, replacement=False)),
          at=(0, 5), resume=plain(Ids(45), batch_size=4, num_workers=2,
                                  sampler=lambda: WeightedRandomSampler(weights, 30, replacement=False)))


def test_subset_random_sampler_global_seed_workers_2_to_0():
    exact(plain(Ids(80), batch_size=5, num_workers=2, sampler=lambda: SubsetRandomSampler(list(range(0, 80, 3)))),
          at=(1, 2), resume=plain(Ids(80), batch_size=5, sampler=lambda: SubsetRandomSampler(list(range(0, 80, 3)))))


def test_sequential_sampler_workers_3_persistent():
    exact(plain(Ids(33), batch_size=4, num_workers=3, persistent_workers=True), at=(1, 5),
          resume=plain(Ids(33), batch_size=4))


def test_random_sampler_more_samples_than_the_dataset_draws_its_later_permutations_once():
    """num_samples=250 of 40: RandomSampler draws a new randperm from its generator every 40 indices, lazily; the
    saver's workers had pulled past a boundary the resumer's would not have reached."""
    make = lambda workers, prefetch=None: plain(  # noqa: E731
        Ids(40), batch_size=6, num_workers=workers, prefetch_factor=prefetch,
        sampler=lambda: RandomSampler(range(40), num_samples=250, generator=torch.Generator().manual_seed(8)))
    exact(make(3, 4), at=(0, 5), resume=make(0))
    exact(make(0), at=(0, 6), resume=make(3, 4))


@pytest.mark.parametrize("call", ["sampler", "loader", "nobody"])
def test_distributed_sampler_rank_1_of_3(call):
    def set_epoch(loader, epoch):
        if call == "sampler":
            loader.sampler.set_epoch(epoch)  # as Lightning does
        elif call == "loader":
            loader.set_epoch(epoch)

    make = lambda workers: plain(Ids(50), batch_size=3, num_workers=workers, sampler=lambda: DistributedSampler(  # noqa
        range(50), num_replicas=3, rank=1, shuffle=True, seed=6))
    want = exact(make(2), at=(1, 4), epochs=3, resume=make(0), set_epoch=set_epoch)
    epochs = [[w[1] for w in want if w[0] == e] for e in (1, 2)]
    assert epochs[0] != epochs[1][:len(epochs[0])], "a new order each epoch"
    exact(make(0), at=(2, 0), epochs=4, resume=make(1), set_epoch=set_epoch)


@pytest.mark.parametrize("call", ["sampler", "nobody"])
def test_distributed_sampler_saved_after_the_epochs_last_batch(call):
    """The first pass after the load is the next epoch: the loop (as Lightning) numbers it e+1."""
    def set_epoch(loader, epoch):
        if call == "sampler":
            loader.sampler.set_epoch(epoch)

    make = lambda workers: plain(Ids(50), batch_size=3, num_workers=workers, sampler=lambda: DistributedSampler(  # noqa
        range(50), num_replicas=3, rank=2, shuffle=True, seed=1))
    exact(make(0), at=(0, 6), epochs=3, resume=make(2), set_epoch=set_epoch)


def test_distributed_state_into_another_rank_or_world_refused():
    loader = plain(Ids(50), batch_size=3, sampler=lambda: DistributedSampler(range(50), num_replicas=3, rank=1))()
    next(iter(loader))
    state = loader.state_dict()
    for replicas, rank in ((2, 1), (3, 2)):
        other = plain(Ids(50), batch_size=3, sampler=lambda: DistributedSampler(range(50), num_replicas=replicas,
                                                                                rank=rank))()
        with pytest.raises(ValueError, match="num_replicas|sampler_rank"):
            other.load_state_dict(state)


def test_batch_sampler_of_a_random_sampler_with_a_generator():
    make = lambda workers: plain(Ids(57), num_workers=workers, batch_sampler=lambda: BatchSampler(  # noqa: E731
        RandomSampler(range(57), generator=torch.Generator().manual_seed(2)), 7, drop_last=False))
    exact(make(2), at=(0, 7), resume=make(0))
    exact(make(0), at=(1, 8), resume=make(3))


def test_dict_batches_with_a_collate_fn():
    make = lambda workers: plain(Records(44), batch_size=5, shuffle=True, num_workers=workers,  # noqa: E731
                                 collate_fn=dict_collate)
    exact(make(0), at=(0, 4), resume=make(2))


def test_unbatched_loader_batch_size_none():
    make = lambda workers: plain(Ids(25), batch_size=None, shuffle=True, num_workers=workers)  # noqa: E731
    exact(make(2), at=(0, 11), resume=make(0))


@pytest.mark.parametrize("workers", [(0, 0), (2, 0), (0, 3)])
def test_a_sampler_without_len_saved_after_the_last_batch_resumes_at_the_next_epoch(workers):
    """README: saved after an epoch's last batch, the first pass is the next epoch (the saver could not tell it was
    the last one); also mid-epoch and chained."""
    saver, resumer = workers
    make = lambda w: plain(Ids(20), batch_size=4, sampler=lambda: NoLenSampler(20), num_workers=w)  # noqa: E731
    exact(make(saver), at=(0, 5), resume=make(resumer))
    exact(make(saver), at=(1, 5), resume=make(resumer), how="torch")
    exact(make(saver), at=(0, 2), resume=make(resumer), chain=(3, make(saver)))
    batches = lambda w: plain(Ids(20), num_workers=w, batch_sampler=lambda: NoLenBatchSampler(  # noqa: E731
        20, torch.Generator().manual_seed(4)))
    seed_all(0)
    length = len([b for b in batches(0)()])
    exact(batches(saver), at=(0, length), resume=batches(resumer))
    exact(batches(saver), at=(1, length - 1), resume=batches(resumer), chain=(1, batches(resumer)))


def test_sampler_shuffling_with_pythons_and_numpys_global_rng():
    exact(plain(Ids(40), batch_size=4, sampler=lambda: OwnRandomSampler(40), num_workers=2), at=(1, 3),
          resume=plain(Ids(40), batch_size=4, sampler=lambda: OwnRandomSampler(40)))
    exact(plain(Ids(40), batch_size=4, sampler=lambda: NumpySampler(40)), at=(0, 6),
          resume=plain(Ids(40), batch_size=4, sampler=lambda: NumpySampler(40), num_workers=1))


def test_a_sampler_with_a_private_rng_is_refused_before_the_first_batch():
    make = plain(Ids(40), batch_size=4, sampler=lambda: PrivateSampler(40, 3))
    loader = make()
    next(iter(loader))
    state = loader.state_dict()
    resumer = make()
    resumer.load_state_dict(state)
    with pytest.raises(ValueError, match="state_dict"):
        next(iter(resumer))


def test_a_resumer_with_another_generator_seed_still_resumes_the_saved_order():
    exact(plain(Ids(50), batch_size=5, shuffle=True, generator=gen(1)), at=(0, 4),
          resume=plain(Ids(50), batch_size=5, shuffle=True, generator=gen(999)))


@pytest.mark.parametrize("change, says", [
    (dict(batch_size=6), "batch_size"), (dict(drop_last=True), "drop_last"), (dict(shuffle=False), "sampler"),
    (dict(generator=None), "generator"), (dict(sampler=lambda: SubsetRandomSampler(range(50)), shuffle=False),
                                          "sampler")])
def test_what_may_not_change_is_refused_before_a_batch(change, says):
    base = dict(batch_size=5, shuffle=True, generator=gen(1))
    loader = plain(Ids(50), **base)()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = plain(Ids(50), **{**base, **change})()
    with pytest.raises(ValueError, match=says):
        other.load_state_dict(state)


# -- IterableDataset ----------------------------------------------------------------------------------------------
def test_stream_chained_resume_and_the_loops_draws():
    exact(plain(lambda: Stream(37), batch_size=4), at=(0, 3), epochs=2, chain=(2, plain(lambda: Stream(37),
                                                                                        batch_size=4)))


@pytest.mark.parametrize("at", [(0, 3), (1, 2), (1, 0), (2, 0)])
def test_stream_that_reshuffles_every_epoch_resumes_its_following_epochs(at):
    """Saved mid-epoch or between epochs (torchdata's TestMultiEpochState): the stream's own state says its epoch."""
    exact(plain(lambda: EpochStream(20), batch_size=4), at=at, epochs=3)


def test_stream_saved_after_its_last_batch_gives_the_pass_its_state_says():
    """README: after its last batch, the dataset's own state says whether the first pass is empty or starts over;
    here its generator had not run out (position 20 of 20), so it is empty, then come the following epochs."""
    seed_all(0)
    whole = [[ids(b) for b in loader] for loader in [plain(lambda: EpochStream(20), batch_size=4)()] for _ in range(3)]
    seed_all(0)
    saver = plain(lambda: EpochStream(20), batch_size=4)()
    it = iter(saver)
    assert [ids(next(it)) for _ in range(5)] == whole[0]
    state = saver.state_dict()
    resumed = plain(lambda: EpochStream(20), batch_size=4)()
    resumed.load_state_dict(round_trip(state, "json"))
    assert [[ids(b) for b in resumed] for _ in range(3)] == [[]] + whole[1:]


@pytest.mark.parametrize("batches", [0, 3])
def test_stream_state_between_epochs_into_workers_is_refused(batches):
    """Each worker's copy of an unsharded stream reads all of it: README says load_state_dict() refuses."""
    loader = plain(lambda: Stream(12), batch_size=4)()
    for _ in range(batches // 3):
        assert len([ids(b) for b in loader]) == 3
    state = loader.state_dict()
    assert not state["in_epoch"]
    with pytest.raises(ValueError, match="num_workers=0"):
        plain(lambda: Stream(12), batch_size=4, num_workers=2)().load_state_dict(state)


def test_stream_state_with_workers_says_use_num_workers_0():
    loader = PrefetchLoader(DataLoader(Stream(30), batch_size=4, num_workers=2))
    next(iter(loader))
    with pytest.raises(ValueError, match="num_workers=0"):
        loader.state_dict()
    close(loader)


# -- make_loader ---------------------------------------------------------------------------------------------------
def test_make_loader_trials_to_online():
    data = Ids(300, latency_s=0.0002)
    exact(tuned(data, 10, shuffle=True, generator=gen(4), tuning="trials"), at=(1, 7),
          resume=tuned(data, 10, shuffle=True, generator=gen(4), tuning="online"))


def test_make_loader_online_mid_search_to_plain():
    """75 batches of 8 ms: the search switches candidates inside epoch 0 and decides in epoch 1."""
    data = Ids(600, latency_s=0.001)
    exact(tuned(data, 8, shuffle=True, tuning="online"), at=(0, 40),
          resume=plain(data, batch_size=8, shuffle=True, num_workers=3))


def test_make_loader_online_to_a_fixed_persistent_config():
    data = Ids(400, latency_s=0.0003)
    exact(tuned(data, 10, shuffle=True, tuning="online"), at=(0, 25),
          resume=tuned(data, 10, shuffle=True, num_workers=2, persistent_workers=True, prefetch_factor=3))


def test_make_loader_fixed_config_chained_into_trials_and_online():
    data = Ids(200, latency_s=0.0002)
    fixed = tuned(data, 8, shuffle=True, num_workers=2, persistent_workers=True, prefetch_factor=3)
    exact(fixed, at=(1, 10), resume=tuned(data, 8, shuffle=True, tuning="trials"),
          chain=(5, tuned(data, 8, shuffle=True, tuning="online")))


def test_make_loader_cached_decision_resumes_an_online_search(tmp_path):
    data = Ids(300, latency_s=0.0003)
    first = tuned(data, 10, shuffle=True, generator=gen(6), tuning="online", cache=tmp_path)
    exact(first, at=(0, 9), resume=tuned(data, 10, shuffle=True, generator=gen(6), cache=tmp_path))


def test_make_loader_trials_with_the_users_sampler_generator_and_threads():
    make = lambda **kw: tuned(Ids(120), 6, sampler=lambda: RandomSampler(  # noqa: E731
        range(120), generator=torch.Generator().manual_seed(3)), tuning="trials", **kw)
    exact(make(), at=(0, 11), resume=make(threads=2))


def test_make_loader_with_a_distributed_sampler_and_set_epoch():
    make = lambda **kw: tuned(Ids(90), 4, sampler=lambda: DistributedSampler(  # noqa: E731
        range(90), num_replicas=2, rank=1, seed=1), **kw)
    exact(make(tuning="trials"), at=(1, 5), resume=make(num_workers=1),
          set_epoch=lambda loader, epoch: loader.sampler.set_epoch(epoch))


def test_make_loader_iterable_dataset():
    fixed0 = tuned(lambda: Stream(40), 5, num_workers=0)
    exact(fixed0, at=(0, 3), epochs=1)
    loader = tuned(lambda: Stream(40), 5, num_workers=2)()
    next(iter(loader))
    with pytest.raises(ValueError, match="num_workers=0"):
        loader.state_dict()
    close(loader)


def test_make_loader_sampler_shuffling_with_pythons_random():
    exact(tuned(Ids(60), 5, sampler=lambda: OwnRandomSampler(60), tuning="trials"), at=(1, 4),
          resume=tuned(Ids(60), 5, sampler=lambda: OwnRandomSampler(60), num_workers=2))


def test_make_loader_main_process_augmentation():
    exact(tuned(Augmented(40), 4, shuffle=True, num_workers=0), at=(0, 5))


def test_make_loader_dict_batches_and_batch_sampler():
    make = lambda **kw: tuned(Records(64), 1, batch_sampler=lambda: BatchSampler(  # noqa: E731
        RandomSampler(range(64)), 6, drop_last=True), collate_fn=dict_collate, **kw)
    exact(make(tuning="trials"), at=(0, 9), resume=make(num_workers=3, prefetch_factor=1))
