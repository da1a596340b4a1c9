"""What a source of several DataLoaders answers as the DataLoader it stands for (autoloader/tuning/stand_in.py): the
DataLoader in force's length and attributes, a ``worker_init_fn`` set once for every DataLoader built after, and
the persistent workers' iterator frameworks shut down."""
import pytest
from torch.utils.data import DataLoader

from autoloader.tuning.stand_in import DataLoaderStandIn


class _Source(DataLoaderStandIn):
    def __init__(self, plain):
        self.plain, self._overrides = plain, {}


def _init(worker_id):
    return worker_id


def test_it_answers_as_the_dataloader_in_force():
    plain = DataLoader(list(range(10)), batch_size=3, drop_last=True)
    source = _Source(plain)
    assert len(source) == 3 and source.batch_size == 3 and source.drop_last and source.dataset is plain.dataset
    source.plain = DataLoader(list(range(10)), batch_size=5)
    assert len(source) == 2 and source.batch_size == 5, "the DataLoader now in force, not the first"
    with pytest.raises(AttributeError):
        source.__array_interface__  # a dunder is never read through (copy, pickle and numpy probe them)
    with pytest.raises(AttributeError):
        source.no_such_attribute


def test_a_worker_init_fn_set_once_reaches_every_dataloader_built_after():
    source = _Source(DataLoader(list(range(4))))
    source.worker_init_fn = _init
    assert source._overrides == {"worker_init_fn": _init} and source.plain.worker_init_fn is _init
    assert source.worker_init_fn is _init


def test_frameworks_reach_the_persistent_workers_iterator():
    plain = DataLoader(list(range(4)), num_workers=0)
    source = _Source(plain)
    assert source.serving_loader is plain and source._iterator is None
    marker = object()
    source._iterator = marker
    assert plain._iterator is marker
    source._iterator = None
    assert plain._iterator is None
