"""The checks of what users pass (autoloader._validate): each refusal names the argument, its value and the fix, and
each accepted value comes back normalised."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from autoloader import _validate as v


class _Local(Dataset):
    def __init__(self) -> None:
        self.transform = lambda x: x  # a lambda: not picklable

    def __getitem__(self, i):
        return i

    def __len__(self):
        return 4


@pytest.mark.parametrize("check, value, error, says", [
    (v.check_batch_size, 0, ValueError, "batch_size=32"), (v.check_batch_size, 8.0, ValueError, "positive int"),
    (v.check_batch_size, True, ValueError, "positive int"), (v.check_budget, "5", TypeError, "budget=30"),
    (v.check_budget, 0, ValueError, "num_workers=... to skip tuning"), (v.check_max_workers, 2.0, TypeError, "int"),
    (v.check_max_workers, -1, ValueError, "0 means no worker"), (v.check_memory_budget, True, TypeError, "bytes"),
    (v.check_memory_budget, 0, ValueError, ">= 1 byte"), (v.check_memory_budget, 1.5, ValueError, "=1 \\* 2\\*\\*30"),
    (v.check_native_threads, True, ValueError, "not a setting"), (v.check_native_threads, "2", TypeError, "int >= 1"),
    (v.check_native_threads, 0, ValueError, "native_threads=1")])
def test_each_refusal_names_the_fix(check, value, error, says):
    with pytest.raises(error, match=says):
        check(value)


def test_accepted_values_come_back_normalised():
    assert v.check_memory_budget(None) is None and v.check_memory_budget(2**30) == 2**30
    assert v.check_memory_budget(1) == 1 and v.check_memory_budget(0.25) == 0.25 and v.check_memory_budget(1.0) == 1.0
    assert v.check_native_threads(None) is None and v.check_native_threads(False) is False
    assert v.check_native_threads(torch.tensor(3).item()) == 3
    for fine in (None, 1, 64):
        v.check_batch_size(fine)


def test_threads_one_means_none_and_true_or_n_are_kept():
    assert v.check_threads(1, _Local()) is False and v.check_threads(False, _Local()) is False
    assert v.check_threads(True, _Local()) is True and v.check_threads(4, _Local()) == 4
    with pytest.raises(ValueError, match="threads=False for none"):
        v.check_threads(0, _Local())
    with pytest.raises(TypeError, match="threads=True"):
        v.check_threads("8", _Local())


def test_key_and_cache_must_be_of_their_kind():
    common = dict(batch_size=8, step=None, budget=None, max_workers=None)
    v.check_common(**common, key="train", cache="/tmp/x")
    with pytest.raises(TypeError, match="key='imagenet-train'"):
        v.check_common(**common, key=3, cache=True)
    with pytest.raises(TypeError, match="cache must be True"):
        v.check_common(**common, key=None, cache=1)


def test_an_unpicklable_attribute_is_named_under_spawn_only():
    v.check_picklable(start_method="fork", objects={"dataset": _Local()})
    with pytest.raises(ValueError, match=r"dataset\.transform cannot be pickled .*'spawn' start method"):
        v.check_picklable(start_method="spawn", objects={"dataset": _Local(), "collate_fn": None})


def test_an_address_needs_the_ray_engine():
    v.check_engine("dataloader", None)
    v.check_engine("ray", "auto")
    with pytest.raises(ValueError, match="must be one of"):
        v.check_engine("threads", None)
    with pytest.raises(ValueError, match="pass engine='ray'"):
        v.check_engine("dataloader", "10.0.0.1:6379")
    with pytest.raises(TypeError, match="address must be"):
        v.check_engine("ray", 6379)
