"""The tuning cache: one JSON file per key, written atomically, validated on every read.

A bad entry (corrupt, truncated, foreign, from a newer or unknown schema, a directory, unreadable) is a miss with one
``AutoloaderWarning``; an entry an earlier autoloader wrote in an older schema is a miss with one ``logging`` INFO
line (it is outdated, not broken) and is replaced by the next ``put``. An unwritable directory loses the result for
the next run, with one warning, never the run.
No pickle: entries are plain JSON produced by ``TuneResult.to_dict``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Literal, Optional, Tuple, Union, overload

from .._fs import PROFILE_FILE, atomic_write_json, default_cache_dir
from ..errors import warn_user
from .fingerprint import SCHEMA_VERSION
from ..results import TuneResult

__all__ = ["SCHEMA_VERSION", "CacheEntry", "TuneCache", "resolve_cache"]

logger = logging.getLogger("autoloader.cache")

_KEY_RE = re.compile(r"[0-9a-f]{16,64}")
_TEMP_RE = re.compile(r"\.(?P<stem>[0-9a-f]{16,64}|machine)\.json\..+\.tmp")
_MAX_ENTRY_BYTES = 4 * 2**20


class _BadEntry(Exception):
    """Why a cache file cannot be used (internal; becomes a warning or ``CacheEntry.error``)."""


class _OldSchema(_BadEntry):
    """An entry an earlier autoloader wrote in an older schema: tuned again and replaced, with one log line (it is
    not broken, only outdated)."""


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str cache key from autoloader.cache.fingerprint.cache_key, got {key!r}")
    if not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"key must be a cache key from autoloader.cache.fingerprint.cache_key (16-64 hex digits), got {key!r}"
        )
    return key


def _read_json(path: Path) -> Any:
    """The JSON in ``path``; ``FileNotFoundError`` when absent, ``_BadEntry`` for anything unusable.

    Opened non-blocking and checked with ``fstat`` so a FIFO or device planted at the path cannot hang the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except IsADirectoryError:
        raise _BadEntry("it is a directory, not a file") from None
    except OSError as err:
        raise _BadEntry(f"cannot be opened ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise _BadEntry("it is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise _BadEntry("it is not a regular file")
        if info.st_size > _MAX_ENTRY_BYTES:
            raise _BadEntry(f"it is {info.st_size} bytes, far larger than any cache entry")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(_MAX_ENTRY_BYTES + 1)
    except OSError as err:
        raise _BadEntry(f"cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _BadEntry("it is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise _BadEntry(f"it is not valid JSON (corrupt or truncated: {err})") from None
    except RecursionError:
        raise _BadEntry("it is JSON nested too deeply to be a cache entry") from None


def _parse(key: str, data: Any) -> tuple:
    """``(created, meta, result)`` from an entry's JSON, or ``_BadEntry`` saying what is wrong."""
    if not isinstance(data, dict) or "result" not in data or "schema" not in data:
        raise _BadEntry("it is not an autoloader cache entry (no schema/result fields)")
    schema = data["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool) or schema > SCHEMA_VERSION:
        raise _BadEntry(f"its schema is {schema!r}, this autoloader reads schema {SCHEMA_VERSION}")
    if schema < SCHEMA_VERSION:
        raise _OldSchema(f"its schema is {schema}, from an earlier autoloader (this one writes {SCHEMA_VERSION})")
    if data.get("key") != key:
        raise _BadEntry(f"it holds key {data.get('key')!r}, not the key its name says")
    created = data.get("created")
    if created is not None and (not isinstance(created, (int, float)) or isinstance(created, bool)):
        raise _BadEntry(f"its created time {created!r} is not a number")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise _BadEntry("its meta field is not an object")
    if not isinstance(data["result"], dict):
        raise _BadEntry("its result field is not an object")
    try:
        result = TuneResult.from_dict(data["result"])
    except (ValueError, TypeError, KeyError) as err:
        raise _BadEntry(f"its result is malformed ({type(err).__name__}: {err})") from None
    if result.created is None and created is not None:
        result = dataclasses.replace(result, created=float(created))
    return created, meta, result


@dataclass(frozen=True)
class CacheEntry:
    """One file in the cache directory as ``autotune show`` lists it; ``result`` is None when ``error`` says why."""

    key: str
    path: Path
    created: Optional[float]
    meta: dict
    result: Optional[TuneResult]
    error: Optional[str]


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
            _created, meta, result = _parse(key, _read_json(path))
            workers = result.config.num_workers
            if workers > max_workers:
                raise _BadEntry(f"it asks for {workers} workers, more than the {max_workers} allowed here")
        except FileNotFoundError:
            logger.debug("cache miss: %s", path)
            return None
        except _OldSchema as old:
            logger.info("autoloader cache entry %s: %s; tuning again and replacing it", path, old)
            return None
        except _BadEntry as bad:
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
            data = _read_json(path)
            _parse(key, data)
        except (FileNotFoundError, _BadEntry):
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
            created, meta, result, error = None, {}, None, None
            try:
                created, meta, result = _parse(stem, _read_json(path))
            except FileNotFoundError:
                continue
            except _BadEntry as bad:
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
