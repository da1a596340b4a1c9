"""autoloader: a PyTorch DataLoader tuned for this machine and dataset by short trials against your training step.

Importing it probes no hardware and touches no CUDA; that happens when you call ``make_loader``, ``tune`` or
``probe_machine``.
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
