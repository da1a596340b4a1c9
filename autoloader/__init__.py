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

from .config import LoaderConfig
from .errors import AutoloaderWarning, TuningError
from .factory import make_loader
from .loader.epochs import EpochStats
from .loader.prefetch import PrefetchLoader
from .loader.threads import ThreadedDataset, unwrap, with_threads
from .probe import MachineProfile, probe_machine
from .results import TrialResult, TuneResult
from .tuning.trials import tune

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
