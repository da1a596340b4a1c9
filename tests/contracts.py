"""The README's contracts as properties (tests/properties): what a configuration is (``Data``: what decides the epochs;
``Mode``: how the loader is made, which must not change them), hypothesis strategies drawing whole ones, the loop
that records what the training loop sees, and when two runs must agree.

A run's ``Record`` holds, per epoch, every batch's sample indices, the values a dataset drew while augmenting, and the
loop's own draws after each batch (torch, Python, numpy: as dropout or the user's code would draw).
"""
from __future__ import annotations

import dataclasses
import gc
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import numpy as np
import torch
from hypothesis import strategies as st
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, WeightedRandomSampler)

from autoloader import PrefetchLoader, make_loader, with_threads
from contract_data import (ChunkBatchSampler, GlobalRngSampler, Items, OwnStateSampler, PrivateSampler,
                           PythonRandomSampler, Stream)

SAMPLERS = ("sequential", "shuffle", "replacement", "weighted", "subset", "distributed", "own-state", "global-rng",
            "python-random", "private", "batch-sampler", "chunks")
"""How the epoch's order is made: DataLoader(shuffle=...), torch's samplers, a DistributedSampler of one simulated rank,
samplers of the user's own (with a state_dict, drawing from torch's or Python's global RNG, or from an RNG autoloader
cannot see), a BatchSampler, a batch sampler of the user's own."""
RNGS = ("generator", "sampler-generator", "global")
"""Where the order's randomness comes from: ``generator=`` on the DataLoader, a generator on the sampler only, or
only the global RNG (``torch.manual_seed``)."""


@dataclass(frozen=True)
class Data:
    """What decides the epochs: two loaders with the same ``Data`` must yield the same batches."""

    n: int
    batch_size: int
    drop_last: bool
    sampler: str
    rng: str
    augment: bool
    stream: bool = False
    replicas: int = 1
    rank: int = 0
    seed: int = 0
    bad: Tuple[int, ...] = ()
    """Samples whose loading raises ``BadSample`` (``contract_data``), once armed."""

    @property
    def private(self) -> bool:
        return self.sampler == "private"


@dataclass(frozen=True)
class Mode:
    """How the loader is made: ``plain`` wraps a DataLoader in a PrefetchLoader; ``trials`` and ``online`` are
    make_loader's tuning modes (``num_workers`` None: tuned, up to 2); ``lazy``: make_loader's trials at the first
    ``iter()`` (``step`` given, ``retune=False``), the epochs then served by a DataLoader."""

    tuning: str = "plain"
    num_workers: Optional[int] = 0
    persistent: bool = False
    prefetch: Optional[int] = None
    threads: int = 1

    @property
    def main_draws(self) -> str:
        """Where a dataset's augmentation draws happen: always in the main process, never, or it depends (tuned)."""
        if self.num_workers is None:
            return "varies"
        return "always" if self.num_workers == 0 else "never"


# -- strategies --------------------------------------------------------------------------------------------------
@st.composite
def datas(draw: Any, *, streams: bool = True, private: bool = True, replicas: bool = True) -> Data:
    stream = streams and draw(st.integers(0, 9)) == 0
    sampler = "sequential" if stream else draw(st.sampled_from(
        [s for s in SAMPLERS if private or s != "private"] if replicas else
        [s for s in SAMPLERS if s != "distributed" and (private or s != "private")]))
    n = draw(st.integers(8 if sampler == "private" else 1, 48))
    rng = draw(st.sampled_from(RNGS))
    world = draw(st.integers(1, 3)) if sampler == "distributed" else 1
    return Data(n=n, batch_size=draw(st.integers(1, 7)), drop_last=draw(st.booleans()), sampler=sampler, rng=rng,
                augment=draw(st.integers(0, 3)) == 0, stream=stream, replicas=world,
                rank=draw(st.integers(0, world - 1)), seed=draw(st.integers(0, 2 ** 16)))


@st.composite
def modes(draw: Any, *, data: Data, tuned: bool = True) -> Mode:
    kinds = ["plain"] * 6
    if tuned and not data.private:  # a tuner's trials iterate the sampler: an RNG autoloader cannot see moves
        kinds += ["trials"]
        if not data.stream:
            kinds += ["online", "online"]
    tuning = draw(st.sampled_from(kinds))
    if tuning == "online":
        return Mode("online", None, threads=draw(st.sampled_from([1, 1, 2])))
    workers = draw(st.integers(0, 3)) if not (tuning == "trials" and draw(st.booleans())) else None
    if data.stream:  # README: an IterableDataset resumes when the main process reads it (num_workers=0)
        workers = 0
    persistent = bool(workers) and draw(st.booleans())
    prefetch = draw(st.sampled_from([None, 1, 2, 3])) if workers else None
    threads = draw(st.sampled_from([1, 1, 2])) if not data.stream else 1
    return Mode(tuning, workers, persistent, prefetch, threads)


# -- building ------------------------------------------------------------------------------------------------------
def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)


def build(data: Data, mode: Mode, *, armed: bool = True) -> PrefetchLoader:
    """A new loader for ``data`` made as ``mode`` says (every sampler and generator new, from ``data.seed``); its
    ``data.bad`` samples raise once ``armed`` (``arm`` arms them later)."""
    kind = Stream if data.stream else Items
    dataset = kind(data.n, data.augment, bad=data.bad, armed=armed)
    gen = torch.Generator().manual_seed(data.seed) if data.rng == "generator" else None
    own = torch.Generator().manual_seed(data.seed + 1) if data.rng == "sampler-generator" else None
    sampling: dict = {"batch_size": data.batch_size, "drop_last": data.drop_last}
    kind = data.sampler
    if kind == "shuffle" and own is None:
        sampling["shuffle"] = True
    elif kind in ("shuffle", "replacement"):
        sampling["sampler"] = RandomSampler(dataset, replacement=kind == "replacement", generator=own or gen,
                                            num_samples=data.n + 5 if kind == "replacement" else None)
    elif kind == "weighted":
        weights = [1.0 + (i % 3) for i in range(data.n)]
        sampling["sampler"] = WeightedRandomSampler(weights, data.n, replacement=data.n % 2 == 0,
                                                    generator=own or gen)
    elif kind == "subset":
        sampling["sampler"] = SubsetRandomSampler(list(range(0, data.n, 2)) or [0], generator=own or gen)
    elif kind in ("distributed", "distributed-drop"):
        sampling["sampler"] = DistributedSampler(dataset, num_replicas=data.replicas, rank=data.rank, shuffle=True,
                                                 seed=data.seed, drop_last=data.drop_last or kind.endswith("drop"))
    elif kind == "own-state":
        sampling["sampler"] = OwnStateSampler(data.n, data.seed)
    elif kind == "private":
        sampling["sampler"] = PrivateSampler(data.n, data.seed)
    elif kind == "global-rng":
        sampling["sampler"] = GlobalRngSampler(data.n)
    elif kind == "python-random":
        sampling["sampler"] = PythonRandomSampler(data.n)
    elif kind == "batch-sampler":
        sampling = {"batch_sampler": BatchSampler(RandomSampler(dataset, generator=own or gen), data.batch_size,
                                                  data.drop_last)}
    elif kind == "chunks":
        sampling = {"batch_sampler": ChunkBatchSampler(data.n, data.batch_size, own or gen or torch.Generator())}
    elif not data.stream:
        sampling["sampler"] = SequentialSampler(dataset)
    if gen is not None:
        sampling["generator"] = gen
    knobs: dict = {}
    if mode.num_workers is not None:
        knobs["num_workers"] = mode.num_workers
    if mode.num_workers:
        knobs["persistent_workers"] = mode.persistent
        if mode.prefetch is not None:
            knobs["prefetch_factor"] = mode.prefetch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode.tuning == "plain":
            threaded = with_threads(dataset, mode.threads) if mode.threads > 1 else dataset
            return PrefetchLoader(DataLoader(threaded, **sampling, **knobs))
        extra: dict = {"threads": mode.threads} if mode.threads > 1 else {}
        if mode.tuning == "lazy":
            extra.update(step=0.0, retune=False)
        return make_loader(dataset, cache=False, tuning="auto" if mode.tuning == "lazy" else mode.tuning,
                           max_workers=2, budget=0.6,
                           **{k: v for k, v in sampling.items() if k != "batch_size"},
                           **({"batch_size": sampling["batch_size"]} if "batch_size" in sampling else
                              {"batch_size": 1}), **knobs, **extra)


# -- running -------------------------------------------------------------------------------------------------------
@dataclass
class Record:
    """What the loop saw, per epoch: sample indices per batch, augmentation draws per batch, the loop's own draws."""

    indices: List[List[List[int]]] = field(default_factory=list)
    values: List[List[List[int]]] = field(default_factory=list)
    draws: List[List[Tuple[float, float, float]]] = field(default_factory=list)

    def epoch(self) -> None:
        self.indices.append([])
        self.values.append([])
        self.draws.append([])

    def add(self, batch: Any) -> None:
        rows = batch.view(-1, 2).tolist()
        self.indices[-1].append([r[0] for r in rows])
        self.values[-1].append([r[1] for r in rows])
        self.add_draws()

    def add_draws(self) -> None:
        """The loop's own draws after a batch (or after an error it logged)."""
        self.draws[-1].append((float(torch.rand(())), random.random(), float(np.random.rand())))

    def flat(self) -> "Record":
        """Every batch in one epoch."""
        one = Record()
        for name in ("indices", "values", "draws"):
            getattr(one, name).append([b for epoch in getattr(self, name) for b in epoch])
        return one

    def since(self, epoch: int, k: int) -> "Record":
        """What came after batch ``k`` of ``epoch``: the rest of that epoch, then the later ones."""
        cut = Record()
        for name in ("indices", "values", "draws"):
            whole = getattr(self, name)
            getattr(cut, name).extend([whole[epoch][k:]] + whole[epoch + 1:] if epoch < len(whole) else [])
        return cut


def run(loader: PrefetchLoader, epochs: int, record: Optional[Record] = None,
        stop: Optional[Tuple[int, int]] = None) -> Tuple[Record, Optional[dict]]:
    """``epochs`` epochs of the loop; ``stop=(e, k)``: stop after ``k`` batches of epoch ``e`` (``k=0``: before its
    ``iter()``) and return ``state_dict()`` then."""
    record = record if record is not None else Record()
    for e in range(epochs):
        if stop is not None and stop == (e, 0):
            return record, loader.state_dict()
        record.epoch()
        for batch in loader:
            record.add(batch)
            if stop is not None and stop == (e, len(record.indices[-1])):
                return record, loader.state_dict()
    return record, None


def closed(*loaders: Any) -> None:
    """Drop the loaders (their workers with them) and collect, so that no worker outlives an example."""
    for loader in loaders:
        for holder in (loader, getattr(loader, "loader", None)):  # as Lightning does, then the DataLoader in force
            if getattr(holder, "_iterator", None) is not None:
                holder._iterator = None
    del loaders
    gc.collect()


def agree(data: Data, saver: Mode, resumer: Mode) -> dict:
    """Which parts of two runs the contract says are equal (README "Checkpoint and resume"): the indices always, unless
    a dataset augmenting in the main process draws in one run where it does not in the other and the order's seed
    comes from the global RNG; the loop's draws likewise; the augmentation values only when both load in the main
    process, one sample at a time."""
    moves_global = data.augment and saver.main_draws != resumer.main_draws or data.augment and "varies" in (
        saver.main_draws, resumer.main_draws)
    order_global = data.rng == "global" or data.sampler in ("global-rng", "python-random")
    return {"indices": not (moves_global and order_global),
            "draws": not moves_global,
            "values": data.augment and saver.main_draws == resumer.main_draws == "always"
            and saver.threads == resumer.threads == 1}


def compare(got: Record, want: Record, parts: dict, context: str, *, prefix: bool = False) -> None:
    """``got`` equals ``want`` in the ``parts`` the contract covers; ``prefix``: ``got`` is the start of ``want``."""
    if not prefix:
        assert len(got.indices) == len(want.indices), f"{len(got.indices)} epochs, not {len(want.indices)}: {context}"
    for name in ("indices", "draws", "values"):
        if not parts[name]:
            continue
        mine, theirs = getattr(got, name), getattr(want, name)
        for epoch, batches in enumerate(mine):
            expected = theirs[epoch][:len(batches)] if prefix else theirs[epoch]
            assert batches == expected, f"{name} differ in epoch {epoch}: {context}"


def with_mode(data: Data, **changes: Any) -> Data:
    return dataclasses.replace(data, **changes)
