"""The machine profile saved beside the cache (``machine.json``) and read back: ``autotune probe`` measures the disk
once, and later runs borrow its figures instead of measuring again."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional

from .._fs import PROFILE_FILE, atomic_write_json, default_cache_dir
from ..errors import warn_user
from .machine import MachineProfile


def save_profile(profile: MachineProfile, cache_dir: "str | os.PathLike[str] | None" = None) -> Path:
    """Write ``profile`` to ``machine.json`` in ``cache_dir`` (default: the autoloader cache) atomically."""
    if not isinstance(profile, MachineProfile):
        raise TypeError(f"profile must be a MachineProfile, got {type(profile).__name__}")
    path = Path(cache_dir if cache_dir is not None else default_cache_dir()) / PROFILE_FILE
    atomic_write_json(path, profile.to_dict())
    return path


def load_profile(cache_dir: "str | os.PathLike[str] | None" = None) -> Optional[MachineProfile]:
    """The saved profile, or None when there is none; an unreadable or corrupt one also gives None, with an
    ``AutoloaderWarning``."""
    path = Path(cache_dir if cache_dir is not None else default_cache_dir()) / PROFILE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        warn_user(f"cannot read the machine profile {path}: {exc}")
        return None
    try:
        return MachineProfile.from_dict(json.loads(text))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        warn_user(f"ignoring the corrupt machine profile {path} ({exc}); run `autotune probe` to redo it")
        return None


def with_saved_disk(profile: MachineProfile) -> MachineProfile:
    """``profile`` with the disk figures of the saved profile (``autotune`` / ``autotune probe`` measured them) when it
    has none of its own: the disk is never measured here, it takes seconds."""
    if profile.disk is not None:
        return profile
    saved = load_profile()
    if saved is None or saved.disk is None:
        return profile
    return replace(profile, disk=saved.disk)

