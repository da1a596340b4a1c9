"""The warning category autoloader uses, so users can filter it, and the one way autoloader warns."""
import inspect
import os
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class AutoloaderWarning(UserWarning):
    """Something degraded (a cache entry, a trial, a guard) but a working loader was still returned.

    Filter with ``warnings.filterwarnings("ignore", category=autoloader.AutoloaderWarning)``.
    """


def warn_user(message: str) -> None:
    """Warn with ``AutoloaderWarning`` at the first caller outside autoloader, however deep inside it this runs."""
    level = 1
    frame = inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    del frame
    warnings.warn(message, AutoloaderWarning, stacklevel=level)
