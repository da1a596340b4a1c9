"""The ``autotune`` command (``main.main``): probe the machine, tune a demo or your dataset, show/clear the cache,
doctor. Importing the package imports none of its modules; ``make_loader`` imports nothing from here.
"""
