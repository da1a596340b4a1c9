"""Facts about the machine a loader runs on: usable CPUs, memory, /dev/shm, disk, GPUs, and this process's limits.
No decisions: a figure that cannot be read is None, never a guess.

``machine`` builds the ``MachineProfile`` (``saved`` keeps it beside the cache, ``_fields`` reads its JSON back);
``_cgroup``, ``_disk``, ``_gpu`` and ``_process`` read one source each.
"""
from ._disk import DiskInfo
from ._gpu import GpuInfo, remembered_gpus
from ._process import THREAD_ENV_VARS, open_files_limit, private_bytes, start_method
from .._fs import PROFILE_FILE
from .machine import CpuInfo, MachineProfile, MemoryInfo, ShmInfo, probe_machine
from .saved import load_profile, save_profile, with_saved_disk

__all__ = ["CpuInfo", "DiskInfo", "GpuInfo", "MachineProfile", "MemoryInfo", "PROFILE_FILE", "ShmInfo",
           "THREAD_ENV_VARS", "load_profile", "open_files_limit", "private_bytes", "probe_machine", "remembered_gpus", "save_profile",
           "start_method", "with_saved_disk"]
