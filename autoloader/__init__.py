"""autoloader: a PyTorch DataLoader tuned for this machine and dataset by short trials against your training step.

Importing it probes no hardware and touches no CUDA; that happens when you call ``make_loader``, ``tune`` or
``probe_machine``.
"""
import logging

from .errors import AutoloaderWarning, TuningError
from .factory import make_loader
from .prefetch import EpochStats, PrefetchLoader
from .probe import MachineProfile, probe_machine
from .results import LoaderConfig, TrialResult, TuneResult
from .tuner import tune

__all__ = [
    "AutoloaderWarning",
    "EpochStats",
    "LoaderConfig",
    "MachineProfile",
    "PrefetchLoader",
    "TrialResult",
    "TuneResult",
    "TuningError",
    "make_loader",
    "probe_machine",
    "tune",
]
__version__ = "0.1.0"

logging.getLogger("autoloader").addHandler(logging.NullHandler())
