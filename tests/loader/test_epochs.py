"""What starting an epoch of a DataLoader draws and pulls (autoloader.loader.epochs), checked against torch itself: a
change in torch's DataLoader internals that these rules model fails here."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils.data import DataLoader, Sampler

from autoloader.loader.epochs import epoch_iter, pulls_made, reuses_iterator
from helpers import wait_no_children


class Counting(Sampler):
    """Counts every time its iterator is asked for an index, the one past its end included."""

    def __init__(self, n: int) -> None:
        self.n, self.asked = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        sampler = self

        class It:
            def __init__(self) -> None:
                self.i = 0

            def __iter__(self):
                return self

            def __next__(self) -> int:
                sampler.asked += 1
                if self.i >= sampler.n:
                    raise StopIteration
                self.i += 1
                return self.i - 1
        return It()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers, prefetch", [(0, None), (1, 1), (2, 2), (3, 1)])
def test_pulls_made_is_what_torch_asks_the_sampler(workers, prefetch):
    sampler = Counting(12)
    loader = DataLoader(list(range(12)), batch_size=None, sampler=sampler, num_workers=workers,
                        prefetch_factor=prefetch)
    it = iter(loader)
    for returned in range(1, 13):
        next(it)
        assert min(sampler.asked, 13) == min(pulls_made(workers, prefetch, returned), 13), returned
    del it
    assert wait_no_children() == []


def test_every_epoch_draws_one_base_seed_with_persistent_workers():
    generator = torch.Generator().manual_seed(1)
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True, generator=generator)
    states, forked = [], []

    @contextlib.contextmanager
    def forking(started):
        forked.append(started)
        yield

    for _ in range(3):
        assert reuses_iterator(loader) == bool(states)
        before = generator.get_state().clone()
        for _ in epoch_iter(loader, forking=forking):
            pass
        states.append((before, generator.get_state().clone()))
    assert forked == [loader], "held while the workers fork, the first epoch only: the others reuse them"
    reference = torch.Generator().manual_seed(1)
    for before, after in states:
        assert torch.equal(before, reference.get_state())
        torch.empty((), dtype=torch.int64).random_(generator=reference)
        assert torch.equal(after, reference.get_state()), "exactly one base-seed draw per epoch"
    loader._iterator = None
    assert wait_no_children() == []
