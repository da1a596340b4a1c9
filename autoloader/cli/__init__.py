"""The ``autotune`` command: probe the machine, tune a demo or your dataset, show/clear the cache, doctor.

``make_loader`` imports nothing from here.
"""
from .main import build_parser, main

__all__ = ["build_parser", "main"]
