"""The tuning cache: entries on disk (``store``), their keys (``fingerprint``), and one request's entry (``slot``)."""
from .fingerprint import SCHEMA_VERSION
from .store import CacheEntry, TuneCache, resolve_cache

__all__ = ["SCHEMA_VERSION", "CacheEntry", "TuneCache", "resolve_cache"]
