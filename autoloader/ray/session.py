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
# Under torchrun every rank is its own driver (its own session): a rank's batches never pass through another's.
# Every wait on Ray has a limit: the address is tried with a socket first (``CONNECT_S``), so a cluster that is not
# there is a ``ConnectionError`` naming the fix, not a wait in ``ray.init``.
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
from dataclasses import dataclass
from typing import Any, Optional

log = logging.getLogger("autoloader.ray")

CONNECT_S = 5.0
INSTALL_HINT = 'pip install "autoloader[ray]" (ray[data,train]==2.60.0)'


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

    def close(self) -> None:
        """Shut down what autoloader started (NOTE [ Who owns Ray ]); nothing for a Ray the user initialised."""
        if self.owned:
            ray = import_ray()
            if ray.is_initialized():
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


def open_session(address: Optional[str], *, num_cpus: Optional[int]) -> Session:
    """This process's session: the user's Ray, a connection to ``address`` (else ``RAY_ADDRESS``), or a local Ray of
    ``num_cpus`` CPUs (NOTE [ Who owns Ray ]). Raises ConnectionError (naming the fix) when the cluster does not
    answer, ImportError without Ray."""
    global _SESSION
    ray = import_ray()
    with _LOCK:
        if _SESSION is not None and ray.is_initialized():
            if address is not None and address != _SESSION.address:
                raise ValueError(f"this process already uses the Ray at {_SESSION.address or 'a local Ray'}, and one "
                                 f"process is one Ray driver: call autoloader.ray.shutdown() before address="
                                 f"{address!r}, or pass the same address")
            return _SESSION
        if _SESSION is not None:  # the Ray it used was shut down by someone else: only its directory is left
            _SESSION.close()
        target = address or os.environ.get("RAY_ADDRESS") or None
        if ray.is_initialized():
            _SESSION = Session(target, owned=False, local=False)
            return _SESSION
        if target is None:
            _SESSION = _start_local(ray, num_cpus)
        else:
            check_reachable(target)
            _connect(ray, target)
            _SESSION = Session(target, owned=True, local=False)
        atexit.register(shutdown)
        return _SESSION


def _start_local(ray: Any, num_cpus: Optional[int]) -> Session:
    temp_dir = tempfile.mkdtemp(prefix="al-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short: sockets
    try:
        context = ray.init(address="local", num_cpus=num_cpus, _temp_dir=temp_dir, include_dashboard=False,
                           logging_level=logging.WARNING, runtime_env={"env_vars": {"PYTHONPATH": _driver_path()}})
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    session_dir = getattr(context, "address_info", {}).get("session_dir")
    log.info("autoloader started a local Ray (%s CPUs) in %s", num_cpus, session_dir or temp_dir)
    return Session(None, owned=True, local=True, temp_dir=temp_dir, session_dir=session_dir)


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


def _connect(ray: Any, address: str) -> None:
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ConnectionError(f"autoloader could not join the Ray cluster at address={address!r} ({err}). Start it "
                              f"with `ray start --head --port=6379` on its head machine, pass that machine's "
                              f"address (host:6379), set RAY_AUTH_MODE=token here too if the cluster uses token "
                              f"auth, or pass address=None to start a local Ray") from err


def check_reachable(address: str) -> None:
    """A ``host:port`` address must accept a TCP connection within ``CONNECT_S``; other forms (``auto``,
    ``ray://...``) are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except OSError as err:
        raise ConnectionError(f"no Ray cluster answers at address={address!r} ({err}): start one with `ray start "
                              f"--head --port={port}` on {host}, check the address (or RAY_ADDRESS), or pass "
                              f"address=None to start a local Ray") from None


def shutdown() -> None:
    """Shut down the Ray autoloader started or joined in this process (NOTE [ Who owns Ray ]); a Ray you initialised
    yourself is left alone. Loaders of ``engine="ray"`` start it again when iterated after it. Called at exit
    anyway."""
    global _SESSION
    with _LOCK:
        session, _SESSION = _SESSION, None
    if session is not None:
        session.close()
