"""One cache entry file, read back and checked: ``read_json`` (never blocks, never reads past ``MAX_ENTRY_BYTES``),
``parse_entry`` (its schema, key, fields and result), ``CacheEntry`` (a file as ``autotune show`` lists it).

Anything unusable is a ``BadEntry`` saying why, in words; an entry in an older schema an ``OldSchema`` (outdated, not
broken). ``store.TuneCache`` decides what each becomes: a warning, a log line, a listing's ``error``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..results import TuneResult
from .fingerprint import SCHEMA_VERSION

MAX_ENTRY_BYTES = 4 * 2**20
"""Far larger than any entry: a bigger file is refused unread."""


class BadEntry(Exception):
    """Why a cache file cannot be used (becomes a warning, or ``CacheEntry.error`` in a listing)."""


class OldSchema(BadEntry):
    """An entry an earlier autoloader wrote in an older schema: tuned again and replaced, with one log line (it is
    not broken, only outdated)."""


def read_json(path: Path) -> Any:
    """The JSON in ``path``; ``FileNotFoundError`` when absent, ``BadEntry`` for anything unusable.

    Opened non-blocking and checked with ``fstat`` so a FIFO or device planted at the path cannot hang the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except IsADirectoryError:
        raise BadEntry("it is a directory, not a file") from None
    except OSError as err:
        raise BadEntry(f"cannot be opened ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise BadEntry("it is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise BadEntry("it is not a regular file")
        if info.st_size > MAX_ENTRY_BYTES:
            raise BadEntry(f"it is {info.st_size} bytes, far larger than any cache entry")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_ENTRY_BYTES + 1)
    except OSError as err:
        raise BadEntry(f"cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadEntry("it is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise BadEntry(f"it is not valid JSON (corrupt or truncated: {err})") from None
    except RecursionError:
        raise BadEntry("it is JSON nested too deeply to be a cache entry") from None


def parse_entry(key: str, data: Any) -> Tuple[Optional[float], Dict[str, Any], TuneResult]:
    """``(created, meta, result)`` from an entry's JSON, or ``BadEntry`` saying what is wrong."""
    if not isinstance(data, dict) or "result" not in data or "schema" not in data:
        raise BadEntry("it is not an autoloader cache entry (no schema/result fields)")
    schema = data["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool) or schema > SCHEMA_VERSION:
        raise BadEntry(f"its schema is {schema!r}, this autoloader reads schema {SCHEMA_VERSION}")
    if schema < SCHEMA_VERSION:
        raise OldSchema(f"its schema is {schema}, from an earlier autoloader (this one writes {SCHEMA_VERSION})")
    if data.get("key") != key:
        raise BadEntry(f"it holds key {data.get('key')!r}, not the key its name says")
    created = data.get("created")
    if created is not None and (not isinstance(created, (int, float)) or isinstance(created, bool)):
        raise BadEntry(f"its created time {created!r} is not a number")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise BadEntry("its meta field is not an object")
    if not isinstance(data["result"], dict):
        raise BadEntry("its result field is not an object")
    try:
        result = TuneResult.from_dict(data["result"])
    except (ValueError, TypeError, KeyError) as err:
        raise BadEntry(f"its result is malformed ({type(err).__name__}: {err})") from None
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
