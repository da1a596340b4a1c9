"""What ``autotune tune MODULE:FACTORY`` names (autoloader.cli._spec.load_dataset), called directly: a factory, a
dataset object itself, a dotted attribute, a duck-typed dataset, the current directory made importable, and each
failure as one ``CliError`` line. The command's one-line output for them is in test_commands.py."""
from __future__ import annotations

import os
import sys

import pytest
from torch.utils.data import Dataset, TensorDataset

from autoloader.cli._spec import CliError, load_dataset

MODULE = "spec_user_module"
CODE = '''
import torch
from torch.utils.data import Dataset, TensorDataset

class Squares(Dataset):
    def __getitem__(self, i):
        return i * i
    def __len__(self):
        return 4

class Duck:
    def __getitem__(self, i):
        return i
    def __len__(self):
        return 3

train = TensorDataset(torch.arange(6))

class holder:
    nested = staticmethod(lambda: Duck())

def make():
    return Squares()

def fails():
    raise RuntimeError("no data directory")

def nothing():
    return None

answer = 42
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(CODE)
    (tmp_path / "broken_spec_module.py").write_text("raise KeyError('HOME')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    for name in (MODULE, "broken_spec_module"):
        sys.modules.pop(name, None)


def test_a_factory_is_called_and_the_current_directory_made_importable(user_module):
    dataset = load_dataset(f"{MODULE}:make")
    assert isinstance(dataset, Dataset) and [dataset[i] for i in range(len(dataset))] == [0, 1, 4, 9]
    assert sys.path[0] == os.getcwd()


def test_a_dataset_is_taken_as_it_is_and_a_class_is_called(user_module):
    assert isinstance(load_dataset(f"{MODULE}:train"), TensorDataset)
    assert type(load_dataset(f"{MODULE}:Squares")).__name__ == "Squares"


def test_a_dotted_attribute_and_a_duck_typed_dataset(user_module):
    duck = load_dataset(f"{MODULE}:holder.nested")
    assert type(duck).__name__ == "Duck" and len(duck) == 3


@pytest.mark.parametrize("spec, message", [
    (f"{MODULE}:", "expected MODULE:FACTORY such as mydata:make_train_set"),
    (":make", "expected MODULE:FACTORY"),
    (f"{MODULE}:holder.missing", f"module '{MODULE}' has no attribute 'holder.missing'"),
    ("broken_spec_module:make", "importing module 'broken_spec_module' raised KeyError: 'HOME'"),
    (f"{MODULE}:fails", f"{MODULE}:fails() raised RuntimeError: no data directory"),
    (f"{MODULE}:nothing", f"{MODULE}:nothing returned None, not a Dataset"),
    (f"{MODULE}:answer", f"{MODULE}:answer is an int, not a Dataset or a function returning one"),
])
def test_each_failure_is_one_line_naming_the_spec(user_module, spec, message):
    with pytest.raises(CliError) as failed:
        load_dataset(spec)
    assert message in str(failed.value) and "\n" not in str(failed.value)
