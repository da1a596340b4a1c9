"""Deciding what to try and what to keep: the pure decisions (``policy``, ``threads_policy``), the worker bound, and
the model-guided search that yields candidates and returns a ``TuneResult``."""
