"""How the processes that tune together agree on every figure a decision reads: ``reduce_min`` over them (the slowest
rank's rate; a cost enters negated, so the largest wins). One process agrees with itself (``Alone``). Which processes
agree (the ranks of one node) and why every call must be made by all of them, in the same order: NOTE [ One decision
across ranks ] in distributed.py.
"""
from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import Any, List, Optional, Protocol, Sequence

import torch.distributed as dist

__all__ = ["Agreement", "Alone", "MinAcrossRanks", "all_gather", "gather_checked"]

# NOTE [ An exchange right before exit ]
# ``all_gather_object`` returns once its work is complete, but gloo's worker thread drops its own reference to the
# work (and to the tensors holding the pickles) just after. When Python let go of those tensors first, that thread
# must take the GIL to free them; if the interpreter has begun to finalize by then, the thread exits inside C++ code
# that may not unwind and the process aborts ("terminate called without an active exception", SIGABRT, after every
# line of the script ran). autoloader's last exchange (an online decision, a checkpoint's gather) often comes a few
# milliseconds before a script ends: measured with an Accelerate script on 2 gloo ranks, 2 of 8 launches aborted so.
# So every exchange goes through ``all_gather``, which notes when it ran, and an exit handler (atexit handlers run
# before the interpreter starts to finalize) gives the other threads the GIL for a moment when an exchange ran within
# ``_EXIT_GRACE_S``: the gloo thread frees the tensors then, while it still may.

_EXIT_GRACE_S = 0.2
_last_exchange: List[float] = []
_exit_hook = threading.Lock()


def _let_exchanges_finish() -> None:
    if _last_exchange:
        left = _EXIT_GRACE_S - (time.monotonic() - _last_exchange[0])
        if left > 0:
            time.sleep(left)


def all_gather(obj: Any, *, size: int, group: Any = None) -> List[Any]:
    """Every rank's ``obj`` (``all_gather_object`` over ``group`` of ``size`` ranks; None: the default group). The one
    call through which autoloader exchanges anything (NOTE [ An exchange right before exit ])."""
    gathered: List[Optional[Any]] = [None] * size
    dist.all_gather_object(gathered, obj, group=group)
    with _exit_hook:
        if not _last_exchange:
            atexit.register(_let_exchanges_finish)
            _last_exchange.append(0.0)
        _last_exchange[0] = time.monotonic()
    return gathered


class Agreement(Protocol):
    """How several processes agree on one decision: every figure through ``reduce_min`` (see NOTE [ One decision
    across ranks ] in distributed.py); one process agrees with itself (``Alone``)."""

    def reduce_min(self, values: Sequence[float]) -> List[float]:
        ...


class Alone:
    def reduce_min(self, values: Sequence[float]) -> List[float]:
        return list(values)


class MinAcrossRanks:
    """``reduce_min`` over the ranks of one node (see NOTE [ One decision across ranks ]); ``group`` None: the default
    group (a single node)."""

    def __init__(self, size: int, group: Any = None) -> None:
        self.size, self.group = size, group

    def reduce_min(self, values: Sequence[float]) -> List[float]:
        """The column-wise minimum of every rank's ``values``."""
        mine = [float(v) for v in values]
        gathered = gather_checked(mine, size=self.size, group=self.group, site=sys._getframe(1).f_code.co_qualname)
        if any(len(g) != len(mine) for g in gathered):
            raise RuntimeError(f"autoloader ranks diverged: this rank agreed on {len(mine)} values, the ranks of its "
                               f"node on {[len(g) for g in gathered]}; see NOTE [ One decision across ranks ] in "
                               f"autoloader/distributed.py")
        return [min(column) for column in zip(*gathered)]


def gather_checked(obj: Any, *, size: int, group: Any, site: str) -> List[Any]:
    """Every rank's ``obj`` (``all_gather_object`` over ``group`` of ``size`` ranks), each sent with ``site``, where
    its rank called from. Ranks whose searches took different paths get a clear error here, naming where each one
    was, instead of a silent mismatch (two calls that exchange alike values) or a hang (a broadcast on one rank met by
    a gather on another): every autoloader exchange within a node goes through this one function."""
    gathered = all_gather((site, obj), size=size, group=group)
    sites = [g[0] if isinstance(g, tuple) and len(g) == 2 else None for g in gathered]
    if any(other != site for other in sites):
        raise RuntimeError(
            f"autoloader ranks diverged: this rank exchanged from {site}, the ranks of its node from {sites}; see "
            f"NOTE [ One decision across ranks ] in autoloader/distributed.py")
    return [g[1] for g in gathered]
