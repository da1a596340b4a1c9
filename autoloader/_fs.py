"""Where autoloader keeps its files, and how it writes them without ever leaving half a file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

PROFILE_FILE = "machine.json"
"""The saved machine profile, beside the cache entries in the cache directory."""


def default_cache_dir() -> Path:
    """``$AUTOLOADER_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoloader``, else ``~/.cache/autoloader``."""
    explicit = os.environ.get("AUTOLOADER_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "autoloader"


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` atomically.

    The text goes to a temporary file in the same directory, is fsynced, and is moved over ``path`` with
    ``os.replace``: readers see the old file or the new one, never a torn one. ``os.replace`` replaces a symlink
    at ``path`` rather than writing through it, so a planted link never redirects the write. Raises ``OSError``
    when the directory cannot be created or written; callers decide whether that is fatal.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
