"""Deciding what to try and what to keep: the pure decisions (``policy``, ``threads_policy`` within ``thread_bounds``,
``online_policy``, ``budget`` for memory, ``verdict`` for the result), the worker bound, and the model-guided search
that yields candidates and returns a ``TuneResult``."""
