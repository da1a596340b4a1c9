"""The tuning cache: one JSON file per key, written atomically, validated on every read.

A bad entry (corrupt, truncated, foreign, from a newer or unknown schema, a directory, unreadable) is a miss with one
``AutoloaderWarning``; an entry an earlier autoloader wrote in an older schema is a miss with one ``logging`` INFO
line (it is outdated, not broken) and is replaced by the next ``put``. An unwritable directory loses the result for
the next run, with one warning, never the run.
No pickle: entries are plain JSON produced by ``TuneResult.to_dict``.
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple, Union, overload

from .._fs import PROFILE_FILE, atomic_write_json, default_cache_dir
from ..errors import warn_user
from ..results import TuneResult
from .entry import BadEntry, CacheEntry, OldSchema, parse_entry, read_json
from .fingerprint import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "TuneCache", "resolve_cache"]

logger = logging.getLogger("autoloader.cache")

_KEY_RE = re.compile(r"[0-9a-f]{16,64}")
_TEMP_RE = re.compile(r"\.(?P<stem>[0-9a-f]{16,64}|machine)\.json\..+\.tmp")


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str cache key from autoloader.cache.fingerprint.cache_key, got {key!r}")
    if not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"key must be a cache key from autoloader.cache.fingerprint.cache_key (16-64 hex digits), got {key!r}"
        )
    return key


@dataclass(frozen=True)
class TuneCache:
    """Tuning results stored as ``<directory>/<key>.json``; the directory is created by the first ``put``."""

    directory: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))

    def path_for(self, key: str) -> Path:
        return self.directory / f"{_check_key(key)}.json"

    def get(self, key: str, *, max_workers: int) -> Optional[TuneResult]:
        """The cached result for ``key`` with ``source="cache"``, or None (a miss; a bad entry also warns once).

        An entry asking for more than ``max_workers`` (this machine's bound) is treated as bad.
        """
        found = self.lookup(key, max_workers=max_workers)
        return found[0] if found is not None else None

    def lookup(self, key: str, *, max_workers: int) -> Optional[Tuple[TuneResult, dict]]:
        """``get``'s result and the entry's ``meta``, or None."""
        path = self.path_for(key)
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 0:
            raise ValueError(f"max_workers must be an int >= 0, got {max_workers!r}")
        try:
            _created, meta, result = parse_entry(key, read_json(path))
            workers = result.config.num_workers
            if workers > max_workers:
                raise BadEntry(f"it asks for {workers} workers, more than the {max_workers} allowed here")
        except FileNotFoundError:
            logger.debug("cache miss: %s", path)
            return None
        except OldSchema as old:
            logger.info("autoloader cache entry %s: %s; tuning again and replacing it", path, old)
            return None
        except BadEntry as bad:
            warn_user(
                f"ignoring autoloader cache entry {path}: {bad}. The loader is tuned again and the entry "
                f"replaced; `autotune clear` removes bad entries."
            )
            return None
        logger.debug("cache hit: %s (%s)", path, result.config.label())
        return result.with_source("cache"), meta

    def annotate(self, key: str, **meta: Any) -> bool:
        """Add ``meta`` to the entry for ``key`` (its result unchanged); False when there is no readable entry or it
        cannot be written."""
        path = self.path_for(key)
        try:
            data = read_json(path)
            parse_entry(key, data)
        except (FileNotFoundError, BadEntry):
            return False
        data["meta"] = {**data.get("meta", {}), **meta}
        try:
            atomic_write_json(path, data)
        except OSError as err:
            logger.info("could not annotate the autoloader cache entry %s: %s", path, err.strerror or err)
            return False
        return True

    def put(self, key: str, result: TuneResult, *, meta: Optional[dict] = None) -> Optional[Path]:
        """Store ``result`` under ``key`` atomically; the entry's path, or None (with a warning) when unwritable."""
        path = self.path_for(key)
        if not isinstance(result, TuneResult):
            raise TypeError(f"result must be a TuneResult, got {type(result).__name__}")
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict of JSON values or None, got {type(meta).__name__}")
        payload = {
            "schema": SCHEMA_VERSION,
            "key": key,
            "created": time.time(),
            "meta": meta or {},
            "result": result.to_dict(),
        }
        try:
            atomic_write_json(path, payload)
        except OSError as err:
            warn_user(
                f"could not write the autoloader cache entry {path} ({err.strerror or err}); tuning still happened "
                f"and its result is used for this run, but the next run will tune again. Make {self.directory} "
                f"a writable directory, set AUTOLOADER_CACHE_DIR to one, or pass cache=False."
            )
            return None
        logger.debug("cache write: %s", path)
        return path

    def _names(self) -> List[str]:
        try:
            return sorted(os.listdir(self.directory))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def entries(self) -> List[CacheEntry]:
        """Every entry file, valid or not (invalid ones carry ``error``); no warnings, this is a listing."""
        found = []
        for name in self._names():
            stem = name[: -len(".json")]
            if not name.endswith(".json") or not _KEY_RE.fullmatch(stem):
                continue
            path = self.directory / name
            created: Optional[float] = None
            meta: Dict[str, Any] = {}
            result: Optional[TuneResult] = None
            error: Optional[str] = None
            try:
                created, meta, result = parse_entry(stem, read_json(path))
            except FileNotFoundError:
                continue
            except BadEntry as bad:
                error = str(bad)
            found.append(CacheEntry(stem, path, created, meta, result, error))
        return found

    def remove(self, key: str) -> bool:
        """Delete the entry for ``key``; False when there was none."""
        path = self.path_for(key)
        if path.is_dir() and not path.is_symlink():
            try:
                path.rmdir()
            except OSError as err:
                logger.warning("not removing %s: it is a directory that is not empty (%s)", path, err.strerror)
                return False
            return True
        return _unlink(path)

    def clear(self, *, include_profile: bool = False) -> int:
        """Delete every entry and stray temporary file the cache owns; returns how many were removed.

        ``machine.json`` (the saved machine profile) is kept unless ``include_profile``; files the cache does not
        own are never touched. A directory at an entry's path is removed only when empty.
        """
        removed = 0
        for name in self._names():
            temp = _TEMP_RE.fullmatch(name)
            if name.endswith(".json") and _KEY_RE.fullmatch(name[: -len(".json")]):
                removed += int(self.remove(name[: -len(".json")]))
            elif temp and (temp.group("stem") != "machine" or include_profile):
                removed += int(_unlink(self.directory / name))
            elif name == PROFILE_FILE and include_profile:
                removed += int(_unlink(self.directory / name))
        return removed


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


@overload
def resolve_cache(cache: Literal[False]) -> None: ...
@overload
def resolve_cache(cache: Union[Literal[True], str, "os.PathLike[str]"]) -> TuneCache: ...
@overload
def resolve_cache(cache: Union[bool, str, "os.PathLike[str]"]) -> Optional[TuneCache]: ...


def resolve_cache(cache: Union[bool, str, "os.PathLike[str]"]) -> Optional[TuneCache]:
    """The store ``cache`` names: ``True`` → the default directory (``AUTOLOADER_CACHE_DIR`` is read now), ``False``
    → None, a path → that directory. Nothing is created here; the first ``put`` creates the directory.
    """
    if cache is True:
        return TuneCache(default_cache_dir())
    if cache is False:
        return None
    if isinstance(cache, (str, os.PathLike)):
        text = os.fspath(cache)
        if not text:
            raise ValueError("cache must not be an empty path; pass True, False or a directory path")
        return TuneCache(Path(os.fsdecode(text)).expanduser())
    raise TypeError(
        f"cache must be True (default directory), False (no cache) or a directory path (str or os.PathLike), "
        f"got {cache!r}"
    )
