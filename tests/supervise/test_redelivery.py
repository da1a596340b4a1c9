"""Which of nested guards delivers, and how a kept exception comes back (autoloader.supervise.redelivery), with a
plain keeper in place of ``SignalGuard`` (the guard's own behaviour is in test_signals.py): ``active`` and
``delivering`` pick the guard entered last of this process, ``TakeBack`` owns ``sys.unraisablehook`` while one is
active and takes back what a keeper claims, ``LineTrap`` raises at the next line its keeper finds safe."""
from __future__ import annotations

import os
import sys

import pytest

from autoloader.supervise.redelivery import TAKE_BACK, LineTrap, active, delivering


class Kept(Exception):
    pass


class Keeper:
    """A guard as these helpers see it: ``signals`` it wrapped, what it claims back, ``kept`` raised where safe."""

    def __init__(self, *signals: int, claims: type = KeyboardInterrupt) -> None:
        self.active, self.pid, self.signals, self.claims = True, os.getpid(), set(signals), claims
        self.taken = []
        self.kept = None
        self.checked = 0

    def wraps(self, signum):
        return signum in self.signals

    def raise_if_safe(self, frame):
        self.checked += 1
        if self.kept is not None:
            kept, self.kept = self.kept, None
            raise kept

    def take_back(self, exc, frame):
        if not isinstance(exc, self.claims):
            return False
        self.taken.append(exc)
        return True

    def give_up_kept(self):
        return None


@pytest.fixture
def entered():
    """Keepers entered in TAKE_BACK, all exited after the test whatever happens."""
    keepers = []

    def enter(keeper):
        keepers.append(keeper)
        TAKE_BACK.enter(keeper)
        return keeper

    yield enter
    for keeper in reversed(keepers):
        keeper.active = False
        TAKE_BACK.exit(keeper)
    assert active() == [] and sys.unraisablehook is not TAKE_BACK


def test_the_keeper_entered_last_that_wrapped_the_signal_delivers(entered):
    outer = entered(Keeper(1, 2))
    inner = entered(Keeper(2))
    assert active() == [outer, inner]
    assert delivering(2) is inner and delivering(1) is outer and delivering(3) is None
    inner.active = False
    assert active() == [outer] and delivering(2) is outer


def test_a_keeper_of_another_process_never_delivers(entered):
    inherited = entered(Keeper(2))
    inherited.pid = os.getpid() + 1  # as a forked worker sees its parent's guards
    assert active() == [] and delivering(2) is None


def test_take_back_keeps_what_a_keeper_claims_and_passes_on_the_rest(entered):
    previous = sys.unraisablehook
    passed_on = []
    sys.unraisablehook = passed_on.append
    try:
        keeper = entered(Keeper(2))
        assert sys.unraisablehook is TAKE_BACK

        class RaisesInDel:
            def __init__(self, exc):
                self.exc = exc

            def __del__(self):
                raise self.exc

        ctrl_c, other = KeyboardInterrupt(), ValueError("not the keeper's")
        RaisesInDel(ctrl_c)
        RaisesInDel(other)
        assert keeper.taken == [ctrl_c], "the Ctrl-C Python dropped in __del__ was taken back"
        assert [u.exc_value for u in passed_on] == [other]
        keeper.active = False
        TAKE_BACK.exit(keeper)
        assert sys.unraisablehook == passed_on.append, "the hook it replaced is back once the last keeper exits"
    finally:
        sys.unraisablehook = previous


def _victim(trap, keeper):
    trap.arm(sys._getframe())
    keeper.kept = Kept("raised at the next line")
    return "the line after arming ran"


def test_the_line_trap_raises_at_the_next_safe_line():
    if sys.gettrace() is not None:
        pytest.skip("another tracer (a debugger, coverage) is installed: the trap stands aside")
    keeper = Keeper()
    trap = LineTrap(keeper)
    try:
        with pytest.raises(Kept):
            _victim(trap, keeper)
        assert keeper.checked >= 1 and trap.armed
    finally:
        trap.disarm()
    assert not trap.armed and trap.frames == [] and sys.gettrace() is None


def test_the_line_trap_stands_aside_beside_another_tracer():
    keeper = Keeper()
    trap = LineTrap(keeper)
    theirs = lambda frame, event, arg: None  # noqa: E731 - a tracer of someone else's
    previous = sys.gettrace()
    sys.settrace(theirs)
    try:
        trap.arm(sys._getframe())
        assert not trap.armed and sys.gettrace() is theirs
    finally:
        sys.settrace(previous)
    trap.arm(None)
    assert not trap.armed
