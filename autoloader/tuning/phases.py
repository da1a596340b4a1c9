"""The phases of a stage of an online epoch and the moves between them: the table ``EpochScheduler`` (scheduler.py)
follows, and ``transition``, which refuses any other move.

# NOTE [ Online epoch scheduler ]
# An epoch is served by a sequence of stages (``handover.Stage``: a slice of the epoch's batch order and the run over
# it, NOTE [ Exact epochs across candidates ] in loader/slices.py). A stage is in one of three phases; each event
# moves it to the phase ``TRANSITIONS`` names, and the table alone says where it goes (``transition`` refuses any
# other move; a stage ends in "next" or "done"):
#   phase      event         next       what happens
#   measuring  batch         measuring  hand it out; the run's window observes it (measure/run.py)
#   measuring  keep          serving    the search chose this very configuration: it serves the rest of the epoch
#   measuring  again         measuring  the search names this very configuration again (serial, after its probe): a
#                                       new window on the same run, no restart
#   measuring  switch        tail       the search moved on: cap the slice, start the next stage now (NOTE [ Hidden
#                                       switch ] in handover.py); this one serves what it holds in flight
#   measuring  early-switch  tail       the probe's first samples said the prior's workers should start now: they
#                                       started inside the first batch's fetch; it serves that batch as its tail
#   measuring  defer         serving    the next candidate would not repay its switch before the epoch ends
#                                       (``switching.repays``): this one serves on, the candidate goes first next
#                                       epoch
#   measuring  plain-switch  next       the ranks' tails differ: stop now, its in-flight batches re-issued
#   measuring  ended         done       the epoch ended first: the search is told what the window holds, or the
#                                       candidate goes on next epoch when its window never opened
#                                       (online_search.MAX_ATTEMPTS)
#   measuring  failed        next       the candidate's failure (failures.classify) told to the search; its
#                                       undelivered batches re-issued to the next stage
#   tail       batch         tail       hand it out, measured by nobody
#   tail       tail-served   next       stop it (its workers reaped in a helper thread); the next stage serves on
#   tail       ended         done       the tail ran to the epoch's end (nothing was started after it)
#   tail       failed        next       a worker of the measured candidate died: logged, the next stage restarts
#   serving    batch         serving    hand it out
#   serving    ended         done
#   serving    failed        (raised)   the configuration in force fails as a DataLoader does
# "next" builds the next stage over the next slice: the one a switch started, else the search's candidate, else the
# decision. A candidate is measured in ``measuring`` only; the search is told once per window. A window's bound is a
# share of the epoch, predicted from the batches served so far (``switching.window_bound_s``). Ranks: after every
# batch of a ``measuring`` stage they agree (``Coordinator.batch``) whether to stop (every window complete, or a
# failure anywhere), whether their tails match and whether the window opened, so every rank makes the same move at
# the same batch; a probe's early switch and a deferred switch are a single process's only (each rank's clock would
# say otherwise). A single process makes the same moves without the exchange, and makes them as soon as the window is
# complete: when the loop asks for the next batch, before loading it, so that batch is the tail's first (a serial
# probe's switch forks the next workers a batch sooner; the ranks agree only once that batch came).
# Signals: each stage's run guards its own batches (NOTE [ Asynchronous exceptions ] in supervise/signals.py); a guard
# spanning the epoch, worker deaths held, covers the moves between two stages, when the stage a switch started runs
# its workers before its own guard is entered: a death there is taken over by that guard and raised as its failure.
"""
from __future__ import annotations

from typing import Dict, Tuple

__all__ = ["TRANSITIONS", "transition"]

TRANSITIONS: Dict[Tuple[str, str], str] = {
    ("measuring", "batch"): "measuring", ("measuring", "keep"): "serving", ("measuring", "again"): "measuring",
    ("measuring", "switch"): "tail", ("measuring", "early-switch"): "tail", ("measuring", "defer"): "serving",
    ("measuring", "plain-switch"): "next", ("measuring", "ended"): "done", ("measuring", "failed"): "next",
    ("tail", "batch"): "tail", ("tail", "tail-served"): "next", ("tail", "ended"): "done", ("tail", "failed"): "next",
    ("serving", "batch"): "serving", ("serving", "ended"): "done",
}
"""NOTE [ Online epoch scheduler ]: (phase, event) -> the next phase ("next": the next stage's)."""


def transition(phase: str, event: str) -> str:
    """The phase after ``event`` in ``phase`` (``TRANSITIONS``); a RuntimeError for a move the scheduler must never
    make. Pure."""
    try:
        return TRANSITIONS[(phase, event)]
    except KeyError:
        raise RuntimeError(f"online epoch: no move from phase {phase!r} on {event!r}") from None
