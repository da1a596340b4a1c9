"""What a failed Ray run means, named as what it was. A batch whose ``__getitem__`` or ``collate_fn`` raised never
fails a run: the task returns that exception in the batch's place (work.py) and the loop gets it at that batch's
``next()`` (``raised``). A run fails when a task does: its worker died (a crash in native code, the operating system
or Ray's memory monitor killing it), its node died (preemption), the payload cannot be imported on a node, or the
driver lost Ray. Ray retries a task whose worker or node died ``TASK_RETRIES`` times; then the run fails and
``run_failure`` names what happened, where, and the fix.
"""
from __future__ import annotations

import re
from typing import List, Optional

from .transport import Failure
from .work import MissingModule

TASK_RETRIES = 4
"""Times Ray runs a task again after its worker or node died (Ray Data's default, -1, retries forever: a worker that
crashes on a sample would then never fail)."""

_DEATHS = {
    "OutOfMemoryError": ("Ray's memory monitor killed the worker loading it (the node ran low on memory)",
                         "give each task more memory: fewer tasks per node (max_workers=N), smaller batches, or "
                         "nodes with more memory"),
    "WorkerCrashedError": ("the Ray worker loading it died (a crash in native code, such as a segfault in a decoder, "
                           "or the operating system killing it for memory)",
                           "read the worker's log (`ray logs`, or python-core-worker-*.log in the session's logs "
                           "folder) and fix what crashed"),
    "NodeDiedError": ("the node running it died (preempted, or lost from the cluster)",
                      "check the cluster's nodes (`ray status`); with preemptible nodes, expect this and resume from "
                      "the last state_dict()"),
    "ObjectLostError": ("its data was lost with a node", "check the cluster's nodes (`ray status`)"),
    "OwnerDiedError": ("the process that owned its data died", "check the cluster's nodes (`ray status`)"),
    "ObjectFetchTimedOutError": ("its data could not be fetched from another node in time",
                                 "check the network between the nodes"),
    "TaskCancelledError": ("Ray cancelled it", "iterate again"),
}
_LOST = ("RaySystemError", "GetTimeoutError", "RpcError", "RayletDiedError", "GcsUnavailableError")


def original_error(error: BaseException) -> BaseException:
    """The innermost exception inside Ray's wrappers (``RayTaskError``, ``UserCodeException``): the first one in the
    chain that is not Ray's, else the last one seen."""
    seen: List[BaseException] = []
    current: Optional[BaseException] = error
    while current is not None and current not in seen:
        seen.append(current)
        if not type(current).__module__.startswith("ray"):
            return current
        current = getattr(current, "cause", None) or current.__cause__
    return seen[-1]


def _in_chain(error: BaseException, names: tuple) -> Optional[BaseException]:
    seen: List[BaseException] = []
    current: Optional[BaseException] = error
    while current is not None and current not in seen:
        seen.append(current)
        if any(type(current).__name__ == name or any(c.__name__ == name for c in type(current).__mro__)
               for name in names):
            return current
        current = getattr(current, "cause", None) or current.__cause__ or current.__context__
    return None


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def described(error: BaseException) -> str:
    """``Type: message`` of the innermost exception: the first one in Ray's chain that is not Ray's, else the first
    such line of the worker's traceback that Ray's message carries (the chain does not survive pickling)."""
    cause = original_error(error)
    if not type(cause).__module__.startswith("ray"):
        return f"{type(cause).__name__}: {cause}"
    for line in str(error).splitlines():
        found = _RAISED.match(line.strip())
        if found and not found.group(1).startswith(("ray", "Ray", "UserCodeException")):
            return line.strip()
    return f"{type(cause).__name__}: {cause}"


def run_failure(error: BaseException, position: int) -> BaseException:
    """What the loop gets when a run failed at batch ``position`` of the epoch: the ``MissingModule`` a worker raised;
    a ``RuntimeError`` naming a worker's or a node's death after ``TASK_RETRIES`` retries; a ``ConnectionError`` when
    the driver lost Ray; else a ``RuntimeError`` naming the innermost exception."""
    missing = _in_chain(error, ("MissingModule",))
    if missing is not None:
        inner = original_error(missing)
        return inner if isinstance(inner, MissingModule) else missing
    died = _in_chain(error, tuple(_DEATHS))
    if died is not None:
        name = next(n for n in _DEATHS if _in_chain(died, (n,)) is died)
        what, fix = _DEATHS[name]
        first = str(died).strip().splitlines()[0][:300] if str(died).strip() else ""
        return RuntimeError(f"autoloader: batch {position} of the epoch, or one loading beside it, could not be "
                            f"loaded: {what} ({name}: {first}); "
                            f"Ray ran the task {TASK_RETRIES + 1} times and gave up "
                            f"(autoloader.ray.failures.TASK_RETRIES). Fix: {fix}")
    cause = original_error(error)
    if isinstance(cause, ConnectionError) or _in_chain(error, _LOST) is not None:
        return ConnectionError(f"autoloader lost Ray while loading batch {position} ({type(cause).__name__}: "
                               f"{cause}): check that the cluster is up (`ray status`), then iterate again")
    return RuntimeError(f"autoloader: a Ray task failed while loading batch {position} of the epoch: "
                        f"{described(error)} (its traceback is above). No batch after it was served")


def raised(failure: Failure, position: int) -> Exception:
    """The exception a batch's loading raised in a Ray worker, to raise at the loop's ``next()``: the dataset's own
    (its type and message), with a note naming the batch and the worker's traceback; a ``RuntimeError`` naming its
    type and message when it could not travel (it could not be pickled)."""
    error = failure.error
    if error is None:
        error = RuntimeError(f"{failure.type_name}: {failure.message} (raised in a Ray worker; the exception itself "
                             f"could not be pickled, so it is described here)")
    note = (f"autoloader: raised loading batch {position} of the epoch in a Ray worker, whose traceback was:\n"
            f"{failure.traceback.rstrip()}")
    setattr(error, "__notes__", [*getattr(error, "__notes__", ()), note])  # BaseException.add_note, before 3.11
    return error
