"""How the ranks of one node agree while they tune: ``Coordinator``, one method per sync point, the only place a
search, a trial or an online epoch talks to the other ranks (NOTE [ One decision across ranks ] in distributed.py).

Every figure enters a column-wise minimum over the ranks (the slowest rank's rate; a cost enters negated, so the
largest wins), or comes from the node leader. The sync points are fixed, each named by its method, and every rank of
the node calls the same ones in the same order:
- ``leader``: the node leader's machine profile, its cached decision, a tuned or online decision (``distributed.Group
  .broadcast``);
- ``outcome``: once per measured candidate, its figures (``AGREED_MAX``), whether it was steady and drained, whether it
  failed, the search's clock and the main process's memory (the per-worker estimate before a worker was measured);
- ``native``: once per search, whether a native-threads limit changes any rank's pools;
- ``batch``: once per batch while an online candidate measures (stop together; the tails of a hidden switch; whether
  the window opened by the epoch's end);
- ``epoch``: once per steady online epoch, its rate and stall (the re-tune rule).
Each exchange carries its sync point's name, so ranks whose paths parted get "ranks diverged" naming where each one
was, instead of pairing two different exchanges or hanging. One process (``Coordinator()``) is a node of one rank:
every point returns what it is given, without communicating.
"""
from __future__ import annotations

import atexit
import dataclasses
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch.distributed as dist

from .errors import TuningError

__all__ = ["AGREED_MAX", "Agreed", "BatchVerdict", "Coordinator", "all_gather"]

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


AGREED_MAX = ("fetch_s_per_batch", "fetch_cpu_s_per_batch", "fetch_delay_s_per_batch", "consumer_s_per_batch",
              "consumer_cpu_s_per_batch", "other_cpus",
              "worker_cpu_util", "main_cpu_util", "stall_fraction", "worker_uss_bytes", "worker_uss_growth_bytes",
              "worker_rss_bytes", "batch_bytes", "worker_uss_total_bytes", "window_s", "batches", "worker_copied_bytes",
              "worker_copied_run_bytes", "worker_copy_span_bytes", "worker_shared_bytes", "startup_s")
"""Every number of a trial a decision reads besides the rate, agreed as the largest across ranks (``threads_policy``
reads the window's length and batches, ``candidates.admit`` the start-up: a rank-local value there lets the ranks'
searches part ways; a start-up read apart had one rank skip a candidate its node's other rank measured, "ranks
diverged" in CI's simulated two-node run)."""


_DRAINED_ORDER = (True, False, None)
"""``TrialResult.drained`` enters the exchange as its index here, so that the minimum across ranks is the agreed
value: the loop waited for a batch on any rank (the slowest rank's rate is then a rate its workers made), never on
every rank, or not a window with workers.
``steady`` agrees the same way (not steady on any rank: not steady). Both are read by online decisions
(``online_policy.sustained``, ``online_plan``), so a rank-local value would let the ranks' searches part ways."""

TrialResult = Any
"""``results.TrialResult`` (not imported: this module sits below every other, so that any of them may agree)."""


@dataclass(frozen=True)
class Agreed:
    """One candidate's outcome as every rank of the node holds it (``Coordinator.outcome``)."""

    trial: Optional[TrialResult]
    """The measurement with every figure agreed (failed everywhere when it failed anywhere); None when the
    measurement itself broke (``error``)."""
    error: Optional[TuningError]
    """Why autoloader's measurement broke (here, or on another rank): the search stops."""
    elapsed_s: float
    """The search's clock: the slowest rank's seconds since it started."""
    main_private_bytes: int
    """The largest main process's private memory (``probe.private_bytes``: the most a forked worker could copy)."""


@dataclass(frozen=True)
class BatchVerdict:
    """What the ranks agreed after a batch of a measured online candidate (``Coordinator.batch``)."""

    stop: bool
    """Every window is complete, or a candidate failed somewhere: all stop at this batch."""
    failed_elsewhere: bool
    same_tail: bool
    """Every rank holds as many batches in flight and sees the epoch end in the tail alike: a hidden switch may
    pair up (NOTE [ Hidden switch ] in tuning/handover.py)."""
    unopened: bool
    """A window that had not opened on some rank (its burst waits for the previous run's workers, which each rank
    reaps on its own)."""


Outcome = Union[TrialResult, TuningError]


class Coordinator:
    """The ranks of one node (``size`` processes of ``group``; None: the default group, a single node) agreeing at
    the sync points above. ``Coordinator()``: one process."""

    def __init__(self, size: int = 1, group: Any = None, *, leader: bool = True) -> None:
        self.size, self.group, self.is_leader = size, group, leader

    @property
    def agrees_per_batch(self) -> bool:
        """Whether the ranks agree on each batch a candidate measures before they move (``batch``): several ranks. A
        single process decides alone, as soon as a window is complete (NOTE [ Online epoch scheduler ])."""
        return self.size > 1

    def _min(self, point: str, values: Sequence[float]) -> List[float]:
        """The column-wise minimum of every rank's ``values``, exchanged at ``point``."""
        mine = [float(v) for v in values]
        if self.size == 1:
            return mine
        gathered = self._gather(point, mine)
        if any(len(g) != len(mine) for g in gathered):
            raise RuntimeError(f"autoloader ranks diverged: this rank agreed on {len(mine)} values at {point}, the "
                               f"ranks of its node on {[len(g) for g in gathered]}; see NOTE [ One decision across "
                               f"ranks ] in autoloader/distributed.py")
        return [min(column) for column in zip(*gathered)]

    def _gather(self, point: str, obj: Any) -> List[Any]:
        gathered = all_gather((point, obj), size=self.size, group=self.group)
        points = [g[0] if isinstance(g, tuple) and len(g) == 2 else None for g in gathered]
        if any(other != point for other in points):
            raise RuntimeError(f"autoloader ranks diverged: this rank exchanged at {point}, the ranks of its node at "
                               f"{points}; see NOTE [ One decision across ranks ] in autoloader/distributed.py")
        return [g[1] for g in gathered]

    # -- the sync points --------------------------------------------------------------------------------------------
    def leader(self, point: str, obj: Any) -> Any:
        """The node leader's ``obj`` on every rank (a gather, so it checks the ranks are at the same ``point``)."""
        return obj if self.size == 1 else self._gather(point, obj if self.is_leader else None)[0]

    def outcome(self, outcome: Outcome, *, elapsed_s: float, main_private_bytes: int) -> Agreed:
        """One candidate's outcome on every rank: the slowest rank's rate, the largest of each other figure
        (``AGREED_MAX``), ``steady`` and ``drained`` as ``_DRAINED_ORDER`` says, failed everywhere when it failed
        anywhere, a ``TuningError`` anywhere an error everywhere."""
        trial = None if isinstance(outcome, TuningError) else outcome
        values = [0.0 if trial is None else 1.0, -1.0 if trial is None or not trial.ok else float(trial.samples_per_s),
                  -elapsed_s, -float(main_private_bytes)]
        values += [math.inf if trial is None or getattr(trial, n) is None else -float(getattr(trial, n))
                   for n in AGREED_MAX]
        values += [1.0 if trial is None else float(trial.steady),
                   float(_DRAINED_ORDER.index(None if trial is None else trial.drained))]
        agreed = self._min("outcome", values)
        elapsed, private = -agreed[2], int(-agreed[3])
        if agreed[0] == 0.0 or trial is None:
            error = outcome if isinstance(outcome, TuningError) else TuningError("autoloader failed on another rank")
            return Agreed(None, error, elapsed, private)
        update: Dict[str, Any] = {}
        figures, (steady, drained) = agreed[4:-2], agreed[-2:]
        for name, value in zip(AGREED_MAX, figures):
            update[name] = None if math.isinf(value) else \
                int(-value) if name.endswith("bytes") or name == "batches" else -value
        update.update(steady=steady == 1.0, drained=_DRAINED_ORDER[int(drained)])
        if agreed[1] < 0:
            update.update(samples_per_s=None, status="failed",
                          reason=trial.reason if not trial.ok else "failed on another rank")
        else:
            update["samples_per_s"] = agreed[1]
        return Agreed(trial if self.size == 1 else dataclasses.replace(trial, **update), None, elapsed, private)

    def native(self, changes: bool) -> bool:
        """Whether a native-threads limit changes a pool on any rank (the pools are each rank's own)."""
        return self._min("native", [0.0 if changes else 1.0])[0] == 0.0

    def batch(self, *, complete: bool, failed: bool, opened: bool = True, in_flight: int = 0,
              last: bool = False) -> BatchVerdict:
        """After each batch a candidate measures online: stop when every window is complete or one failed; the
        tail of a hidden switch (batches in flight, whether the epoch ends in it) compared."""
        agreed = self._min("batch", [1.0 if complete else 0.0, 0.0 if failed else 1.0, 1.0 if opened else 0.0,
                                     float(in_flight), -float(in_flight), float(last), -float(last)])
        all_complete, none_failed, all_opened = agreed[0] == 1.0, agreed[1] == 1.0, agreed[2] == 1.0
        same = agreed[3] == -agreed[4] and agreed[5] == -agreed[6]
        return BatchVerdict(stop=all_complete or not none_failed, failed_elsewhere=not none_failed and not failed,
                            same_tail=same, unopened=not all_opened)

    def epoch(self, rate: Optional[float], stall: Optional[float]) -> Tuple[Optional[float], Optional[float]]:
        """A steady online epoch's rate (the slowest rank's) and stall (the largest); None where any rank has none."""
        low, high = self._min("epoch", [-1.0 if rate is None else rate, 1.0 if stall is None else -stall])
        return (None if low < 0 else low), (None if high > 0 else -high)
