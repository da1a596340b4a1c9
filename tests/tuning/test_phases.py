"""The online epoch's phases and the one table of their moves (autoloader/tuning/phases.py): the NOTE's table is the
code's, and no other move is made."""
import re

import pytest

from autoloader.tuning import phases
from autoloader.tuning.phases import TRANSITIONS, transition


def test_the_transition_table_is_the_notes():
    """Every row of the NOTE's table (phase, event, next) is a move ``transition`` makes, and there is no other."""
    rows = re.findall(r"^#\s+(measuring|tail|serving)\s+([a-z-]+)\s+([a-z]+)\s", phases.__doc__, re.M)
    assert {(phase, event): nxt for phase, event, nxt in rows} == TRANSITIONS
    for (phase, event), nxt in TRANSITIONS.items():
        assert transition(phase, event) == nxt
    with pytest.raises(RuntimeError, match="no move from phase 'serving' on 'switch'"):
        transition("serving", "switch")


def test_every_stage_ends_in_next_or_done_and_every_phase_is_reachable():
    """Each phase a move leads to has moves of its own, or ends the stage; a stage starts measuring or serving."""
    phases_with_moves = {phase for phase, _ in TRANSITIONS}
    assert phases_with_moves == {"measuring", "tail", "serving"}
    assert set(TRANSITIONS.values()) - phases_with_moves == {"next", "done"}
    for phase in phases_with_moves:
        assert any(nxt in ("next", "done") for (p, _), nxt in TRANSITIONS.items() if p == phase), phase
