"""What autoloader does with torch's SIGCHLD handler, the one that raises "DataLoader worker (pid X) is killed by
signal" in the main thread when a worker it watches dies. They use private functions of
``torch.utils.data._utils.signal_handling``, when they exist (torch has no public way), and do nothing otherwise
(``supervise/deaths.py`` wraps the handler for the epochs no signal guard watches)."""
from __future__ import annotations

from typing import Any


def install_first() -> None:
    """Install torch's handler now, once per process, as its first multi-worker iterator would: a signal guard's
    wrapper then sits above it (NOTE [ Asynchronous exceptions ] in signals.py); were the function gone, torch's
    handler would sit above the wrapper during the first iterator only."""
    from torch.utils.data._utils import signal_handling

    install = getattr(signal_handling, "_set_SIGCHLD_handler", None)
    if callable(install):
        install()


def is_torchs(handler: Any) -> bool:
    """``handler`` is the one ``install_first`` installs (defined in torch's ``signal_handling``)."""
    from torch.utils.data._utils import signal_handling

    return getattr(handler, "__module__", None) == signal_handling.__name__


def unwatch(iterator: Any) -> None:
    """Take ``iterator``'s workers out of what the handler watches (NOTE [ Process cleanup ] in procs.py, steps 2 and
    4), as the iterator's own shutdown does last."""
    from torch.utils.data._utils import signal_handling

    remove = getattr(signal_handling, "_remove_worker_pids", None)
    if remove is not None and getattr(iterator, "_worker_pids_set", False):
        remove(id(iterator))
        iterator._worker_pids_set = False
