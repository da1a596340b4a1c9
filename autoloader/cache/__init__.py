"""The tuning cache: entries on disk (``store``), one entry file read back and checked (``entry``), their keys
(``fingerprint``), and one request's entry (``slot``)."""
from .entry import CacheEntry
from .fingerprint import SCHEMA_VERSION
from .store import TuneCache, resolve_cache

__all__ = ["SCHEMA_VERSION", "CacheEntry", "TuneCache", "resolve_cache"]
