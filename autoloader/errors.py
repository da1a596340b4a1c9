"""autoloader's exception and warning types, the one way autoloader warns, and the one DataLoader warning it
silences."""
import contextlib
import inspect
import os
import warnings
from typing import Iterator

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class AutoloaderWarning(UserWarning):
    """The category of every warning autoloader gives: something degraded but a working loader was still returned.

    E.g. a corrupt cache entry (tuned again), an unwritable cache directory, no candidate that could be measured
    (``num_workers=0`` then), workers whose memory grows by copy-on-read past the memory budget, an
    ``IterableDataset`` that every worker repeats, ``threads`` that cannot apply. Each message names the fix.
    Filter with ``warnings.filterwarnings("ignore", category=autoloader.AutoloaderWarning)``; the details are logged
    to ``logging.getLogger("autoloader")``.
    """


class TuningError(RuntimeError):
    """autoloader's own machinery failed while tuning: not your dataset or step, whose exceptions reach you unchanged.

    ``tune`` raises it; ``make_loader`` catches it, warns (``AutoloaderWarning``) and falls back to a safe
    configuration (``loader.tuning.source == "fallback"``), which it does not cache.
    """


class TrialTimeout(Exception):
    """A trial (or the one sample read for the cache key) ran past its hard wall-clock limit."""

    from_limit = True
    """Marks the exception a ``SignalGuard`` raises at its limit (see NOTE [ Asynchronous exceptions ])."""


def warn_user(message: str) -> None:
    """Warn with ``AutoloaderWarning`` at the first caller outside autoloader, however deep inside it this runs."""
    level = 1
    frame = inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    del frame
    warnings.warn(message, AutoloaderWarning, stacklevel=level)


@contextlib.contextmanager
def quiet_worker_count_warning(active: bool) -> Iterator[None]:
    """Silence DataLoader's "will create N worker processes ... suggested max" warning for a count autoloader chose.

    That warning is a rule of thumb (workers <= cores); a tuned count above it was measured to be faster, typically
    workers that wait on storage or network. Counts the user chose still get the warning.
    """
    if not active:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield
