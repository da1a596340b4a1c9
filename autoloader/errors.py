"""The warning category autoloader uses, so users can filter it."""


class AutoloaderWarning(UserWarning):
    """Something degraded (a cache entry, a trial, a guard) but a working loader was still returned.

    Filter with ``warnings.filterwarnings("ignore", category=autoloader.AutoloaderWarning)``.
    """
