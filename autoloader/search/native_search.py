"""The native-threads part of the search: the chosen configuration measured without its limit, then with it again
beside it, when ``native_policy.worth_comparing`` says so (the decisions are in ``native_policy.py``)."""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Protocol

from ..coordination import Coordinator
from ..config import LoaderConfig
from ..results import TrialResult
from . import native_policy
from .candidates import Steps
from .settings import Findings, Settings

log = logging.getLogger("autoloader.tuner")


class Searching(Protocol):
    """What this part reads and calls of the ``search.Search`` running it."""

    found: Findings
    settings: Settings
    coordinator: Coordinator

    def run(self, config: LoaderConfig, *, first: bool = False, again: bool = False,
            force: bool = False) -> Steps[Optional[TrialResult]]:
        ...


def compare_native(search: Searching, chosen: TrialResult) -> Steps[None]:
    """Measure ``chosen`` without its native limit, then with it again, side by side, when the serial trial ran
    native threads and the limit changes a pool of its workers (on any rank: every rank measures both or neither)."""
    if not native_policy.worth_comparing(search.found.serial, chosen, setting=search.settings.native_setting):
        return
    changes = native_policy.limit_changes(chosen.native_pools, chosen.config.native_threads)
    if not search.coordinator.native(changes):  # the pools are rank-local: any rank's
        log.info("native threads: the limit of %s changes no pool its workers found; not measured without it",
                 chosen.config.label())
        return
    serial = search.found.serial
    ratio = (serial.fetch_cpu_s_per_batch or 0.0) / (serial.fetch_s_per_batch or 1.0) if serial else 0.0
    log.info("native threads: the serial trial's loading took %.1fx its wall time in CPU; measuring %s without the "
             "limit", ratio, chosen.config.label())
    yield from search.run(dataclasses.replace(chosen.config, native_threads=None))
    yield from search.run(chosen.config, again=True)
