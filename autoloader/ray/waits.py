"""Every wait of the Ray engine on Ray, each with its limit (``Limit``), in one place: the driver never blocks on Ray
without one. A wait that runs out is a ``TimeoutError`` that names what was waited for, the limit (its name here and
its seconds) and the fix. Calls into Ray that have no timeout of their own (``ray.init``, ``ray.nodes()``,
``ray.put``) run in a daemon thread that the caller waits for (``bounded``): past the limit the caller gets the
error, and the thread, still blocked in Ray, is left to finish or to die with the process.

``timeout=`` of ``make_loader`` (seconds) replaces ``BATCH`` and ``STARTUP`` for that loader."""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Limit:
    """The most ``seconds`` one wait may take: ``name`` (this module's attribute), what is waited for, and the fix
    when it runs out."""

    name: str
    seconds: float
    what: str
    fix: str

    def error(self, detail: str = "") -> TimeoutError:
        """The ``TimeoutError`` of this wait running out (``detail``: where it was)."""
        where = f" ({detail})" if detail else ""
        return TimeoutError(f"autoloader: {self.what} did not finish within {self.seconds:g} s{where} "
                            f"(autoloader.ray.waits.{self.name}): {self.fix}")

    def with_seconds(self, seconds: float) -> "Limit":
        return dataclasses.replace(self, seconds=float(seconds))


CONNECT = Limit("CONNECT", 5.0, "a TCP connection to the Ray cluster's address",
                "start the cluster (`ray start --head --port=PORT` on its head), check the address (or RAY_ADDRESS), "
                "or pass address=None to start a local Ray")
INIT = Limit("INIT", 120.0, "ray.init joining the cluster",
             "check that the address is a Ray head's GCS port and that `ray status` answers there, that RAY_AUTH_MODE "
             "and the token match the cluster's, and that this machine can reach the nodes' ports")
QUERY = Limit("QUERY", 60.0, "a question to the Ray cluster (its nodes and resources)",
              "check the cluster with `ray status`; its head (GCS) may be overloaded or unreachable")
PUT = Limit("PUT", 120.0, "ray.put of the dataset or an epoch's order into Ray's object store",
            "the object store may be full (`ray memory` shows what holds it): give Ray more object store memory, or "
            "make the dataset smaller to pickle (read samples from files, not from memory)")
NODES = Limit("NODES", 300.0, "a Ray cluster with no CPU getting its first CPU node",
              "an autoscaling cluster at its minimum size starts a node when asked (autoloader asks for one CPU); "
              "start CPU nodes (`ray start --address=HEAD:PORT --num-cpus=N`), set the cluster's min_workers >= 1, "
              "or pass timeout=<seconds> to make_loader to wait longer")
STARTUP = Limit("STARTUP", 300.0, "the first batch of a run of Ray tasks (workers starting, importing torch and the "
                                  "dataset)",
                "the cluster may have no CPU free for the pool (`ray status` shows what holds them), or a task is "
                "stuck in the dataset's __getitem__; pass timeout=<seconds> to make_loader to wait longer")
BATCH = Limit("BATCH", 120.0, "the next batch from Ray",
              "the cluster may have no CPU free for the pool (`ray status` shows what holds them), or a task is stuck "
              "in the dataset's __getitem__; pass timeout=<seconds> to make_loader to wait longer")
CLOSE = Limit("CLOSE", 30.0, "the loaders' reading threads ending before autoloader shuts Ray down",
              "a thread still blocked in Ray when Ray shuts down can end the whole process: let the running epochs "
              "end (or close their iterators) before autoloader.ray.shutdown()")
PER_BATCH_FACTOR = 20.0
"""A batch's wait also grows by this many times the block's own load time (measured in the driver), so that a slow
dataset is not cut off."""


def bounded(limit: Limit, call: Callable[[], T], *, detail: str = "",
            late: Optional[Callable[[Any], None]] = None) -> T:
    """``call()`` in a daemon thread, waited for at most ``limit.seconds``: its result, or its exception raised here,
    or ``limit.error(detail)`` when it did not return in time. ``late``: called (in that thread) with the result of a
    call that returned after the caller gave up (to undo it: a ``ray.init`` that connected too late is shut down)."""
    done = threading.Event()
    lock = threading.Lock()
    outcome: List[Any] = []
    gave_up: List[bool] = []

    def run() -> None:
        try:
            result: Any = ("ok", call())
        except BaseException as err:  # handed to the caller, raised there
            result = ("error", err)
        with lock:
            outcome.append(result)
            done.set()
            undo = bool(gave_up) and result[0] == "ok" and late is not None
        if undo and late is not None:
            late(result[1])

    thread = threading.Thread(target=run, name=f"autoloader-ray-{limit.name.lower()}", daemon=True)
    thread.start()
    if not done.wait(limit.seconds):
        with lock:
            if not done.is_set():
                gave_up.append(True)
                raise limit.error(detail)
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value
