"""The hidden switch between two online candidates: the next one starts while the measured one serves its tail.

# NOTE [ Hidden switch ]
# A plain switch from one candidate (A) to the next (B) costs the loop B's start-up (forking its workers, then their
# first batch: 0.1-0.5 s), and A's in-flight batches, loaded and thrown away (re-issued to B). So when A's window
# closes and the search names B (or decides on a configuration other than A's), the scheduler:
# 1. caps A's slice (``BatchSlice.cap``) at the batches its DataLoader pulled (in flight: up to num_workers x
#    prefetch_factor) and ``tail_extra`` more: A's tail, which A serves on, measured by nobody;
# 2. takes B's slice right after the tail and starts B's iterator (``Run.start``: its workers fork and prefetch)
#    while A serves its tail, so that B's first batches are ready, or nearly, when the loop asks for them;
# 3. A's run stops once the loop got its tail (orderly: its workers are reaped in a helper thread), and B serves on.
# The scheduler makes these moves (``EpochScheduler._start_next``; the phases ``tail`` and ``next`` of NOTE [ Online
# epoch scheduler ] in phases.py); this module holds what they act on. A probe whose first samples started B early
# (NOTE [ Online convergence ] in search/online_policy.py) has a tail of the batch it is loading, and no more.
# Measurement. A's window closed before B started: B's start-up takes no CPU from A's figures (the overlap falls in
# A's tail, which nobody measures). B's window opens after its burst (NOTE [ Trial timing ], 2.: the batches it
# prefetched during A's tail are part of that burst) and only once A's workers are reaped (5.). ``Decision.switch_s``
# counts what the loop still waited for: forking B's workers (on the loop's thread: a fork from a helper thread could
# copy a lock another thread holds), B's first batch after the tail, and stopping A.
# The tail's length. With workers, A's in-flight batches take about prefetch_factor of a worker's batch times to
# serve: about what B's first worker needs for its first batch. Without workers (the serial candidate) nothing is in
# flight, so A loads ``SERIAL_TAIL`` more batches itself while B's workers start. (B's forks run on the loop's thread
# before the tail, but torch hands B's workers their first indices only once all of them forked: B's first batch
# comes a worker's start and a batch's load after that, 150 ms for 16 workers of 66 ms batches, about A's two.)
# Failures while both are open (a worker of A dies in its tail, the dataset raises, Ctrl-C, the loop breaks): B is
# stopped first and its slice closed with nothing delivered, then A as without a hidden switch (its undelivered
# batches go back in front of B's: NOTE [ Exact epochs across candidates ] in loader/slices.py). A worker failure in
# A's tail does not reach the loop (A was measured and the search moved on): it is logged, and B starts again,
# plainly.
# Memory. Under a memory budget both pools at once must fit it (``Plan.fits_beside``, ``search/memory.py
# overlap_guard``: A's footprint as measured plus B's with a worker sized as measured); otherwise A stops first, as
# when the ranks' tails differ below (a waiting-bound tuning had peaked at 502 MiB under 380 MiB, 12 workers' tail
# beside 13 starting). One process only: the ranks agree their tails, not their memory.
# Ranks. Every rank's window ends at the same batch with the same search decision (NOTE [ Online switching ]); they
# hide the switch only when their tails are as long (agreed with each batch: ``Coordinator.batch``), so that B starts
# at the same batch everywhere and
# the per-batch agreements of B's window pair up across ranks. Otherwise A stops at once, as before (its in-flight
# batches re-issued). When no batch is left after the tail, A serves it to the epoch's end and B starts next epoch.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Optional

from ..config import DEFAULT_PREFETCH, LoaderConfig
from ..loader.native import worker_pools
from ..loader.slices import BatchSlice
from ..results import TrialResult
from ..search.candidates import Candidate

log = logging.getLogger("autoloader.online")

SERIAL_TAIL = DEFAULT_PREFETCH
"""Batches a measured candidate without workers loads after its window closed, while the next one's workers start
(the default ``prefetch_factor``: what a worker candidate's tail holds per worker)."""


@dataclass
class Stage:
    """One slice of an epoch and the run that serves it: a candidate's (``candidate``), or the decision's (None)."""

    batch_slice: BatchSlice
    run: Any
    """The ``measure.run.Run`` serving the slice."""
    candidate: Optional[Candidate]
    pools: Any = None
    """Its DataLoader's ``worker_init_fn``, through which its workers report their native pools (``with_pools``)."""
    reported: bool = False
    """The search got this candidate's measurement (it serves on unmeasured: its tail, or as the decision)."""
    early: bool = False
    """A probe whose first samples started the next stage inside its first batch (NOTE [ Online convergence ])."""

    def with_pools(self, result: TrialResult) -> TrialResult:
        """``result`` with the native pools the workers found (``native.worker_pools``)."""
        return dataclasses.replace(result, native_pools=worker_pools(self.pools))

    @property
    def config(self) -> LoaderConfig:
        return self.run.config

    def abort(self, error: BaseException) -> None:
        """Stop a stage that handed out nothing (its workers at once), and give its batches back: a later slice
        closes before an earlier one gives batches back (NOTE [ Hidden switch ])."""
        self.run.stop(error)
        self.batch_slice.delivered(0)


def tail_extra(config: LoaderConfig) -> int:
    """Batches a measured candidate loads after its window closed, beyond those in flight (NOTE [ Hidden switch ]):
    none with workers, ``SERIAL_TAIL`` without. Pure."""
    return 0 if config.num_workers else SERIAL_TAIL
