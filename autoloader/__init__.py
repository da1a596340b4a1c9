"""autoloader: a PyTorch DataLoader tuned for this machine and dataset, by measuring it in your training loop or by
short trials against your training step.

    loader = make_loader(train_set, batch_size=64, shuffle=True)   # and any DataLoader argument
    for images, labels in loader:    # on the GPU already; the first epoch tunes the loader as it trains
        ...
    print(loader.tuning)             # what was chosen, why, and what each candidate measured

The reference is each definition's docstring (``help(autoloader.make_loader)``, or ``python -m pydoc autoloader``):

- ``make_loader``: the tuned loader (every argument, how it tunes, what it raises); the main entry.
- ``tune``: the same search by trials, returning a ``TuneResult`` without building a loader or caching it.
- ``PrefetchLoader``: what ``make_loader`` returns, or a wrapper of your own DataLoader: batches copied to the GPU
  on a side stream, ``tuning``, ``decisions``, ``stats``, ``state_dict()``/``load_state_dict()``.
- ``ThreadedDataset``, ``with_threads``, ``unwrap``: a batch's samples fetched by threads inside each process.
- ``LoaderConfig``, ``TuneResult``, ``TrialResult``, ``EpochStats``: the records (what each field means).
- ``probe_machine``, ``MachineProfile``: what autoloader knows about this machine.
- ``AutoloaderWarning``, ``TuningError``: the warning category, and autoloader's own failure.
- ``autoloader.distributed.node_decisions``: every node's decision under torchrun.
- ``autoloader.cli.plot.plot_online_epoch``: the picture of an epoch that tuned online (``pip install
  "autoloader[plot]"``).
- The ``autotune`` command: ``autotune --help`` and ``autotune COMMAND --help``.

That list is the public API. Every other module and name is internal (the README's map under Development says what
each does): it may change in any release.

Importing it probes no hardware and touches no CUDA; that happens when you call ``make_loader``, ``tune`` or
``probe_machine``. Logs go to ``logging.getLogger("autoloader")``.
"""
import logging
import re
import sys
from typing import Optional

import torch

MIN_TORCH = (2, 6)
"""The oldest torch autoloader runs on: every DataLoader it builds passes ``in_order`` (added in torch 2.6)."""


def _torch_too_old(version: str) -> Optional[str]:
    """Why ``version`` (a ``torch.__version__``) is too old for autoloader; None when it is recent enough, or when
    it does not read as MAJOR.MINOR (a build whose version cannot be read is not refused on a guess)."""
    found = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if found is None or (int(found.group(1)), int(found.group(2))) >= MIN_TORCH:
        return None
    need = ".".join(map(str, MIN_TORCH))
    return (f"autoloader needs torch >= {need} (its DataLoaders pass in_order, added in torch {need}), but this Python "
            f"imports torch {version} from {getattr(torch, '__file__', None)}: upgrade it first, e.g. pip install "
            f"'torch>={need}' (on a CPU-only machine, from PyTorch's CPU index: README, Install)")


if _torch_too_old(torch.__version__):
    raise ImportError(_torch_too_old(torch.__version__))
if sys.platform == "win32":
    raise ImportError("autoloader runs on Linux (macOS untested): it guards its workers with POSIX signals (SIGALRM, "
                      "SIGCHLD) and reads their resources with the resource module, which Windows lacks; use it under "
                      "WSL2, or torch.utils.data.DataLoader directly")

from .config import LoaderConfig  # noqa: E402 - after the torch version check
from .errors import AutoloaderWarning, TuningError  # noqa: E402
from .factory import make_loader  # noqa: E402
from .loader.epochs import EpochStats  # noqa: E402
from .loader.prefetch import PrefetchLoader  # noqa: E402
from .loader.threads import ThreadedDataset, unwrap, with_threads  # noqa: E402
from .probe import MachineProfile, probe_machine  # noqa: E402
from .results import TrialResult, TuneResult  # noqa: E402
from .tuning.trials import tune  # noqa: E402

__all__ = [
    "AutoloaderWarning",
    "EpochStats",
    "LoaderConfig",
    "MachineProfile",
    "PrefetchLoader",
    "ThreadedDataset",
    "TrialResult",
    "TuneResult",
    "TuningError",
    "make_loader",
    "probe_machine",
    "tune",
    "unwrap",
    "with_threads",
]
__version__ = "0.3.0"

logging.getLogger("autoloader").addHandler(logging.NullHandler())
