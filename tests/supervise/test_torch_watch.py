"""What autoloader does with torch's SIGCHLD handler (autoloader.supervise.torch_watch): ``install_first`` installs it
before any DataLoader iterator would (checked in a fresh interpreter, where nothing installed it yet), and
``unwatch`` takes an iterator's workers out of what it watches, once."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.data._utils import signal_handling

from autoloader.supervise.torch_watch import unwatch
from helpers import wait_no_children

ROOT = Path(__file__).resolve().parents[2]

_FRESH = """
import signal
from torch.utils.data._utils import signal_handling
from autoloader.supervise.torch_watch import install_first
before = signal.getsignal(signal.SIGCHLD)
install_first()
after = signal.getsignal(signal.SIGCHLD)
install_first()
print(before is signal.SIG_DFL, callable(after), signal_handling._SIGCHLD_handler_set,
      signal.getsignal(signal.SIGCHLD) is after)
"""


def test_install_first_installs_torchs_handler_once_in_a_fresh_process():
    if not callable(getattr(signal_handling, "_set_SIGCHLD_handler", None)):
        pytest.skip("this torch has no _set_SIGCHLD_handler: install_first does nothing")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _FRESH], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True", "True"], "installed once, kept by a second call"
    assert wait_no_children() == []


class Iterator:
    """An iterator as ``unwatch`` reads it: torch keys its workers by ``id``, ``_worker_pids_set`` says they are."""

    _worker_pids_set = False


def test_unwatch_removes_the_workers_torch_watches_once():
    it = Iterator()
    signal_handling._set_worker_pids(id(it), (os.getpid(),))
    it._worker_pids_set = True
    unwatch(it)
    assert it._worker_pids_set is False
    with pytest.raises(ValueError):
        signal_handling._remove_worker_pids(id(it))  # torch no longer knows them
    unwatch(it)  # the iterator's own shutdown, later: nothing left to remove, no error


def test_unwatch_leaves_an_iterator_without_workers_alone():
    unwatch(Iterator())
    unwatch(object())
