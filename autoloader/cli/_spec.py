"""What ``autotune tune MODULE:FACTORY`` names: import the user's module and get the dataset, or say why not."""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class CliError(Exception):
    """A failure the command reports in one line, without a traceback."""


def _is_dataset(obj: object) -> bool:
    from torch.utils.data import Dataset

    if isinstance(obj, Dataset):
        return True
    kind = type(obj)
    return (not isinstance(obj, type) and kind.__module__ != "builtins" and hasattr(kind, "__getitem__")
            and hasattr(kind, "__len__"))


def _a(obj: object) -> str:
    if obj is None:
        return "None"
    name = type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def load_dataset(spec: str) -> Any:
    """The dataset ``MODULE:FACTORY`` names (FACTORY called with no arguments unless it is a dataset already); the
    current directory is importable. Raises ``CliError`` saying what could not be loaded and why."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise CliError(f"expected MODULE:FACTORY such as mydata:make_train_set, got {spec!r}")
    if sys.path[:1] != [os.getcwd()]:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ImportError as err:
        raise CliError(f"cannot import module {module_name!r} ({err})") from None
    except Exception as err:  # the user's module failed while importing: report it in one line
        raise CliError(f"importing module {module_name!r} raised {type(err).__name__}: {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if _is_dataset(obj):
        return obj
    if not callable(obj):
        raise CliError(f"{spec} is {_a(obj)}, not a Dataset or a function returning one")
    try:
        dataset = obj()
    except Exception as err:  # the user's factory failed: report it in one line
        raise CliError(f"{spec}() raised {type(err).__name__}: {err}") from None
    if not _is_dataset(dataset):
        raise CliError(f"{spec} returned {_a(dataset)}, not a Dataset (a torch.utils.data.Dataset, or an object "
                       f"with __getitem__ and __len__)")
    return dataset
