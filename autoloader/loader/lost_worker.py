"""A worker's death that reached the loop as the connection it broke: reported as torch reports a death.

# NOTE [ A connection a dead worker broke ]
# The main process receives a batch of tensors from a worker through a pipe, and each tensor's shared memory through a
# second connection to that worker (``multiprocessing.resource_sharer``, or ``reduction.recvfds`` on a socket). A worker
# killed while it hands a batch over breaks that connection, and the main process's ``next()`` raises
# ``ConnectionResetError`` or a bare ``EOFError``. torch's iterator then asks whether a worker died (``_try_get_data``:
# ``is_alive()``), but the kernel may not have made the killed worker a zombie yet: the connection error goes to the
# loop unexplained, and the worker's SIGCHLD, a moment later, runs torch's handler wherever the loop is then, typically
# inside the ``except`` that has just handled the error, which raises "DataLoader worker (pid X) is killed by signal" a
# second time, out of code that already dealt with the failure (``scripts/gpu_check.py``'s killed-while-pinning check; a
# plain DataLoader has the same race). ``reported`` closes the race where autoloader hands the loop a batch
# (``stream_copy.load``): a connection error raised inside ``multiprocessing`` (not a worker's own exception, which
# torch re-raises as "Caught ... in DataLoader worker", nor the dataset's own in this process, raised under DataLoader's
# fetcher with ``num_workers=0``: a network dataset's, or one reading a ``multiprocessing.Manager``, raised at once)
# waits up to ``DEATH_WAIT_S`` for a watched worker to be seen dead, and then the loop gets torch's own report,
# "DataLoader worker (pid X) is killed by signal: Killed.", chained to the connection error. torch's check forgets the
# dead worker's iterator as it raises, so the late SIGCHLD finds nothing to report. No death seen in that time: the
# connection error goes on unchanged. It uses torch's private ``_error_if_any_worker_fails`` (there is no public way),
# and changes nothing where it is gone.
"""
from __future__ import annotations

import re
import time
from typing import Callable, Optional

DEATH_WAIT_S = 0.5
"""How long a broken connection waits for its worker's death to be seen (a killed process is a zombie within
milliseconds of closing its connections; a connection that broke for another reason costs this once)."""

FETCHER = "torch.utils.data._utils.fetch"
"""The module of DataLoader's fetchers, which call the dataset (torch 2.13): an error raised under it is the dataset's
own, raised in the process that fetches (the main one with ``num_workers=0``), never a broken worker connection."""

WORKER_DEATH = re.compile(r"DataLoader worker \(pid")
"""torch's report of a worker's death: "DataLoader worker (pid X) is killed by signal" or "... exited unexpectedly"
(dataloader.py and signal_handling, torch 2.13)."""


def _check() -> Optional[Callable[[], None]]:
    from torch.utils.data._utils import signal_handling

    check = getattr(signal_handling, "_error_if_any_worker_fails", None)
    return check if callable(check) else None


def broken_connection(exc: BaseException) -> bool:
    """``exc`` is a connection to a worker that broke in the main process: a ``ConnectionError`` or ``EOFError``
    raised inside ``multiprocessing`` (its innermost frame), not a worker's own exception re-raised by torch, nor the
    dataset's own, raised under DataLoader's fetcher in this process (``num_workers=0``)."""
    if not isinstance(exc, (ConnectionError, EOFError)) or str(exc).startswith("Caught "):
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        if tb.tb_frame.f_globals.get("__name__") == FETCHER:
            return False
        tb = tb.tb_next
    return tb.tb_frame.f_globals.get("__name__", "").startswith("multiprocessing.")


def reported(exc: Exception, *, wait_s: float = DEATH_WAIT_S) -> Exception:
    """torch's report of the worker death that broke a connection (NOTE [ A connection a dead worker broke ]), with
    ``exc`` as its cause; ``exc`` itself when it is no broken connection, or when no death is seen within
    ``wait_s``."""
    check = _check() if broken_connection(exc) else None
    if check is None:
        return exc
    deadline = time.monotonic() + wait_s
    try:
        while True:
            check()
            if time.monotonic() >= deadline:
                return exc
            time.sleep(0.005)
    except RuntimeError as death:  # from the check, or from torch's SIGCHLD handler interrupting the wait
        if not WORKER_DEATH.match(str(death).strip()):
            raise
        death.__cause__ = exc
        return death
