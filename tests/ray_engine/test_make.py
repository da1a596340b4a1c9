"""engine='ray' without Ray: importing autoloader never imports Ray, every argument it cannot take is refused
before Ray is touched (each error names the fix), and a missing Ray names the extra. The fetcher the tasks run
builds batches as torch's own does."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from autoloader import make_loader
from autoloader.ray.work import fetch

ROOT = Path(__file__).resolve().parents[2]


class Squares(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([i * i]), i


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_importing_autoloader_and_its_ray_package_imports_no_ray():
    code = ("import sys, autoloader, autoloader.ray, autoloader.ray.make, autoloader.ray.source\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_without_ray_installed_the_error_names_the_extra():
    code = ("import sys; sys.modules['ray'] = None\nimport torch\nfrom autoloader import make_loader\n"
            "try:\n    make_loader([torch.zeros(1)] * 4, 2, engine='ray', cache=False)\n"
            "except ImportError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert 'pip install "ray[data,train]==2.60.0"' in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("kwargs, error, words", [
    ({"engine": "spark"}, ValueError, "engine='spark' must be one of"),
    ({"address": "10.0.0.1:6379"}, ValueError, "pass engine='ray'"),
    ({"engine": "ray", "address": 6379}, TypeError, "address must be a Ray cluster address"),
    ({"engine": "ray", "tuning": "online"}, ValueError, "tuning='trials'"),
    ({"engine": "ray", "threads": True}, ValueError, "leave threads out"),
    ({"engine": "ray", "memory_budget": 0.5}, ValueError, "leave memory_budget out"),
    ({"engine": "ray", "num_workers": 2}, ValueError, "max_workers= caps the tasks"),
    ({"engine": "ray", "worker_init_fn": print}, ValueError, "leave worker_init_fn out"),
])
def test_what_engine_ray_cannot_take_is_refused_naming_the_fix(kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace("[", r"\[")):
        make_loader(Squares(), 2, cache=False, **kwargs)


def test_an_iterable_dataset_is_refused():
    with pytest.raises(ValueError, match="map-style dataset by index"):
        make_loader(Stream(), 2, engine="ray", cache=False)


class WithGetitems(Squares):
    def __getitems__(self, indices):
        return [(torch.tensor([-i]), i) for i in indices]


@pytest.mark.parametrize("dataset", [Squares(), WithGetitems()])
@pytest.mark.parametrize("batch_size", [3, None])
def test_the_tasks_fetch_batches_as_torchs_fetcher_does(dataset, batch_size):
    plain = DataLoader(dataset, batch_size=batch_size)
    batches = list(plain.batch_sampler if plain.batch_sampler is not None else plain.sampler)
    got = [fetch(dataset, plain.collate_fn, index, plain.batch_sampler is not None) for index in batches]
    for mine, theirs in zip(got, plain):
        assert repr(mine) == repr(theirs)
    assert len(got) == len(plain)


def test_runtime_env_must_be_a_dict_and_is_checked_before_ray_is_touched():
    with pytest.raises(TypeError, match=r"runtime_env must be a dict of Ray's runtime environment"):
        make_loader(Squares(), 2, cache=False, engine="ray", runtime_env="./code")


def test_timeout_bounds_every_batch_else_the_limits_grow_with_a_blocks_load_time():
    from autoloader.ray.make import limits
    from autoloader.ray.waits import BATCH, PER_BATCH_FACTOR, STARTUP

    given = limits(3.0, 0.5, 4)
    assert (given["startup"].seconds, given["wait"].seconds) == (3.0, 3.0)
    assert (given["startup"].name, given["wait"].name) == ("STARTUP", "BATCH")
    grown = limits(None, 0.5, 4)
    assert grown["startup"].seconds == STARTUP.seconds + PER_BATCH_FACTOR * 2.0
    assert grown["wait"].seconds == BATCH.seconds + PER_BATCH_FACTOR * 2.0
