"""This process's connection to Ray, and what autoloader must clean up of it.

# NOTE [ Who owns Ray ]
# autoloader shuts down only what it started, and only once, at ``shutdown()`` or at the interpreter's exit:
# - Ray already initialised by the user (``ray.init`` before ``make_loader``): used as it is, never shut down.
# - ``address=`` (or ``RAY_ADDRESS``) names a running cluster: this process connects as one more driver; at the end
#   it disconnects (``ray.shutdown()`` in a driver that joined a cluster stops no node of it). The cluster is the
#   user's: ``ray stop`` on its machines stops it.
# - Neither: a local Ray is started with the usable CPUs, in a temporary directory of autoloader's own, and at the
#   end it is shut down (its processes with it) and its files removed: that directory, and the session directory
#   Ray reports (``ray.init(...).address_info``), which Ray 2.60 sometimes puts under ``/tmp/ray`` anyway.
# - A Ray the user initialised at another address than ``address=`` names, or a session of autoloader's the user
#   replaced (shut down, then ``ray.init`` of their own): each session remembers which Ray it is (its session name and
#   job), so the first is a ValueError naming both addresses, and the second is taken for the user's Ray (used, never
#   shut down), its files of autoloader's own removed. ``shutdown()`` stops a Ray only while it is still autoloader's.
# - ``runtime_env=`` (``make_loader``'s, e.g. ``{"working_dir": ".", "py_modules": [...]}``): passed to the
#   ``ray.init`` autoloader makes (a local Ray also gets the driver's import path), so that the workers import the
#   dataset's modules; a Ray the user initialised has theirs (passing one then is a ValueError naming the fix).
# Under torchrun every rank is its own driver (its own session): a rank's batches never pass through another's.
# Every wait on Ray has a limit (waits.py): the address is tried with a socket first (``CONNECT``), so a cluster that
# is not there is a ``ConnectionError`` naming the fix, and joining it runs within ``INIT``. A local Ray is started on
# the calling thread (Ray's processes die with the thread that started them), within Ray's own start-up checks.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .waits import CLOSE, CONNECT, INIT, bounded

log = logging.getLogger("autoloader.ray")

INSTALL_HINT = 'pip install "ray[data,train]==2.60.0" (the ray extra: pip install ".[ray]" in autoloader\'s checkout)'


def import_ray() -> Any:
    """The ``ray`` module (with Ray Data), or an ImportError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as err:
        raise ImportError(f"engine='ray' needs Ray Data: {INSTALL_HINT} ({err})") from err
    return ray


@dataclass
class Session:
    """One process's use of Ray: ``owned``: autoloader called ``ray.init`` (and so calls ``ray.shutdown``);
    ``local``: that ``ray.init`` started the Ray processes (in ``temp_dir``)."""

    address: Optional[str]
    owned: bool
    local: bool
    temp_dir: Optional[str] = None
    session_dir: Optional[str] = None
    """Where Ray put this local session's files: under ``temp_dir``, or (measured with ray 2.60.0: in a process
    whose parent ran Ray) under ``/tmp/ray`` anyway."""
    identity: Optional[Tuple[str, str]] = None
    """Which Ray this is: its session name and this driver's job id (``identity_of``)."""
    runtime_env: Optional[Dict[str, Any]] = None

    def current(self, ray: Any) -> bool:
        """This process's Ray is still this session's."""
        return ray.is_initialized() and (self.identity is None or identity_of(ray) == self.identity)

    def close(self) -> None:
        """Shut down what autoloader started (NOTE [ Who owns Ray ]); nothing for a Ray the user initialised or
        started in its place."""
        if self.owned:
            ray = import_ray()
            if self.current(ray):
                ray.shutdown()
            self.owned = False
        if self.session_dir is not None:
            _remove_session(self.session_dir)
            self.session_dir = None
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


_LOCK = threading.Lock()
_SESSION: Optional[Session] = None
_READERS: "weakref.WeakKeyDictionary[threading.Thread, threading.Event]" = weakref.WeakKeyDictionary()


def reading(thread: threading.Thread, stop: threading.Event) -> None:
    """Count ``thread`` (a run's reading thread, pipeline.py, which ends once ``stop`` is set and Ray hands it its
    current block) among those ``shutdown`` stops and lets end before Ray goes: a thread still blocked in Ray when Ray
    shuts down ended the whole process in 2 runs of the tests. A run never closed (an iterator kept to the end of
    the program) is stopped too: at exit its thread waits for a loop that will not come."""
    _READERS[thread] = stop


EXECUTOR_PREFIX = "StreamingExecutor-"
"""The name Ray Data gives the thread that runs a dataset's execution (``StreamingExecutor-<dataset id>``): a run
that left early leaves it cancelling its tasks for a while after its reading thread ended, and Ray shut down under
it ended the process ("The core worker has already been shutdown ... The process will exit", 1 run of the
integration tests in 2)."""


ITERATOR_THREAD = "iter_threaded"
"""The name of the threads Ray Data's ``iter_batches`` reads blocks in (ray 2.60): closed, each still asks Ray for
the block it was fetching, and one asking after Ray was shut down starts Ray again on that thread (a Ray whose
processes die with the thread: the process ended 60 s later, 1 CI run in 5)."""


def _readers_ended() -> None:
    """Wait for the reading threads still running (each ends once Ray hands it its current block), then for Ray
    Data's threads still ending the runs that left early (executions cancelling their tasks, the iterators' threads),
    within ``waits.CLOSE``; a warning naming the limit when some did not end."""
    deadline = time.monotonic() + CLOSE.seconds
    for stop in list(_READERS.values()):
        stop.set()
    executors = [t for t in threading.enumerate() if t.name.startswith(EXECUTOR_PREFIX) or t.name == ITERATOR_THREAD]
    for thread in [*list(_READERS), *executors]:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in [*list(_READERS), *executors] if t.is_alive()]
    if left:
        log.warning("%s", CLOSE.error(f"{len(left)} reading thread(s) still in Ray"))


def identity_of(ray: Any) -> Tuple[str, str]:
    """The initialised Ray's session name and this driver's job id: another ``ray.init`` changes one of them."""
    context = ray.get_runtime_context()
    return str(context.get_session_name()), str(context.get_job_id())


def _same_address(given: str, gcs: Optional[str]) -> bool:
    """Whether ``given`` (``host:port``) names the cluster whose GCS is at ``gcs``; True when it cannot tell
    (``auto``, ``ray://``)."""
    host, _, port = given.rpartition(":")
    if not gcs or not host or not port.isdigit() or "://" in given:
        return True
    gcs_host, _, gcs_port = gcs.rpartition(":")
    try:
        return port == gcs_port and socket.gethostbyname(host) == socket.gethostbyname(gcs_host)
    except OSError:
        return given == gcs


def open_session(address: Optional[str], *, num_cpus: Optional[int],
                 runtime_env: Optional[Dict[str, Any]] = None) -> Session:
    """This process's session: the user's Ray, a connection to ``address`` (else ``RAY_ADDRESS``), or a local Ray of
    ``num_cpus`` CPUs (NOTE [ Who owns Ray ]), with ``runtime_env`` for the Ray autoloader starts or joins. Raises
    ConnectionError (naming the fix) when the cluster does not answer, TimeoutError when ``ray.init`` does not return
    within ``waits.INIT``, ValueError when this process's Ray is another than ``address`` names, ImportError without
    Ray."""
    global _SESSION
    ray = import_ray()
    with _LOCK:
        if _SESSION is not None and _SESSION.current(ray):
            if not _SESSION.owned:  # the user's Ray
                _check_users(ray, address, runtime_env)
                return _SESSION
            if address is not None and address != _SESSION.address:
                raise ValueError(f"this process already uses the Ray at {_SESSION.address or 'a local Ray'}, and one "
                                 f"process is one Ray driver: call autoloader.ray.shutdown() before address="
                                 f"{address!r}, or pass the same address")
            if runtime_env is not None and runtime_env != _SESSION.runtime_env:
                raise ValueError(f"this process's Ray was started with runtime_env={_SESSION.runtime_env!r}: call "
                                 f"autoloader.ray.shutdown() before runtime_env={runtime_env!r}, or pass the same one")
            return _SESSION
        if _SESSION is not None:  # the Ray it used was shut down, or replaced, by someone else: only its files are left
            _SESSION.owned = False
            _SESSION.close()
            _SESSION = None
        target = address or os.environ.get("RAY_ADDRESS") or None
        if ray.is_initialized():
            _SESSION = _users(ray, address, runtime_env)
            return _SESSION
        if target is None:
            _SESSION = _start_local(ray, num_cpus, runtime_env)
        else:
            check_reachable(target)
            _connect(ray, target, runtime_env)
            _SESSION = Session(target, owned=True, local=False, identity=identity_of(ray), runtime_env=runtime_env)
        atexit.register(shutdown)
        return _SESSION


def _users(ray: Any, address: Optional[str], runtime_env: Optional[Dict[str, Any]]) -> Session:
    """The Ray the user initialised, checked against ``address`` and ``runtime_env``."""
    gcs = _check_users(ray, address, runtime_env)
    log.info("autoloader uses the Ray this process initialised (%s); it never shuts it down", gcs)
    return Session(address or gcs, owned=False, local=False, identity=identity_of(ray))


def _check_users(ray: Any, address: Optional[str], runtime_env: Optional[Dict[str, Any]]) -> str:
    """The GCS address of the Ray the user initialised; a ValueError naming the fix when ``address`` names another
    cluster or a ``runtime_env`` is given (the user's ``ray.init`` had its own)."""
    gcs = ray.get_runtime_context().gcs_address
    if address is not None and not _same_address(address, gcs):
        raise ValueError(f"this process's Ray, which you initialised, is the cluster at {gcs}, not address="
                         f"{address!r}: pass address=None to use it, or call ray.shutdown() before make_loader to "
                         f"join {address!r}")
    if runtime_env is not None:
        raise ValueError("runtime_env= applies to the Ray autoloader starts or joins, but you initialised Ray "
                         "yourself: pass runtime_env to your ray.init(), and leave it out of make_loader")
    return gcs


def _late(ray: Any) -> Any:
    """Undo a ``ray.init`` that returned after its caller gave up waiting (``waits.bounded``)."""
    return lambda _context: ray.shutdown()


def _local_env(runtime_env: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``runtime_env`` with the driver's import path added to the workers' ``PYTHONPATH``."""
    env = dict(runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    paths = [p for p in (env_vars.get("PYTHONPATH"), _driver_path()) if p]
    env_vars["PYTHONPATH"] = os.pathsep.join(paths)
    env["env_vars"] = env_vars
    return env


def _start_local(ray: Any, num_cpus: Optional[int], runtime_env: Optional[Dict[str, Any]] = None) -> Session:
    temp_dir = tempfile.mkdtemp(prefix="al-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short: sockets
    try:
        # on this thread, not bounded(): Ray's processes die with the thread that started them (measured: a local Ray
        # started in a helper thread lost its GCS when that thread ended); a local start has no network to wait on
        context = ray.init(address="local", num_cpus=num_cpus, _temp_dir=temp_dir, include_dashboard=False,
                           logging_level=logging.WARNING, runtime_env=_local_env(runtime_env))
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    session_dir = getattr(context, "address_info", {}).get("session_dir")
    log.info("autoloader started a local Ray (%s CPUs) in %s", num_cpus, session_dir or temp_dir)
    return Session(None, owned=True, local=True, temp_dir=temp_dir, session_dir=session_dir,
                   identity=identity_of(ray), runtime_env=runtime_env)


def _remove_session(session_dir: str) -> None:
    """A local session's directory, and Ray's ``session_latest`` link beside it when it points there."""
    shutil.rmtree(session_dir, ignore_errors=True)
    latest = os.path.join(os.path.dirname(session_dir), "session_latest")
    if os.path.islink(latest) and os.path.realpath(latest) == os.path.realpath(session_dir):
        os.unlink(latest)


def _driver_path() -> str:
    """This process's import path, for the workers of a local Ray: they import the dataset's module as the driver
    does (a forked DataLoader worker inherits it)."""
    return os.pathsep.join(p for p in (os.path.abspath(entry or os.curdir) for entry in sys.path) if os.path.isdir(p))


def _connect(ray: Any, address: str, runtime_env: Optional[Dict[str, Any]] = None) -> None:
    extra = {} if runtime_env is None else {"runtime_env": runtime_env}
    try:
        bounded(INIT, lambda: ray.init(address=address, logging_level=logging.WARNING, **extra),
                detail=f"joining address={address!r}", late=_late(ray))
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ConnectionError(f"autoloader could not join the Ray cluster at address={address!r} ({err}). Start it "
                              f"with `ray start --head --port=6379` on its head machine, pass that machine's "
                              f"address (host:6379), set RAY_AUTH_MODE=token here too if the cluster uses token "
                              f"auth, or pass address=None to start a local Ray") from err


def check_reachable(address: str) -> None:
    """A ``host:port`` address must accept a TCP connection within ``waits.CONNECT``; other forms (``auto``,
    ``ray://...``) are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT.seconds).close()
    except OSError as err:
        raise ConnectionError(f"no Ray cluster answers at address={address!r} ({err}): start one with `ray start "
                              f"--head --port={port}` on {host}, check the address (or RAY_ADDRESS), or pass "
                              f"address=None to start a local Ray (autoloader.ray.waits.CONNECT: "
                              f"{CONNECT.seconds:g} s)") from None


def shutdown() -> None:
    """Shut down the Ray autoloader started or joined in this process (NOTE [ Who owns Ray ]); a Ray you initialised
    yourself is left alone. Loaders of ``engine="ray"`` start it again when iterated after it. Called at exit
    anyway."""
    global _SESSION
    with _LOCK:
        session, _SESSION = _SESSION, None
    if session is not None:
        if session.owned:
            _readers_ended()
        session.close()
