"""Where a trial's timed window opens (autoloader.measure.window): after the prefetch burst has drained; and the rate
of a trial cut before it did."""
import sys

import psutil
import pytest
import torch

from autoloader.measure.marks import BatchMark
from autoloader.measure.window import Window
from autoloader.config import LoaderConfig


def _window(workers: int, gaps, *, first_at: float) -> Window:
    """A Window of ``workers`` (prefetch 2) whose batches of 64 are consumed at ``first_at``, then after ``gaps``."""
    window = Window(LoaderConfig(workers, 2 if workers else None), started=0.0, batch_size=64, min_window_s=0.2,
                    min_rounds=3, min_batches=10)
    done = first_at
    for gap in [0.0] + list(gaps):
        done += gap
        window.marks.append(BatchMark(done, 64, 0.0, 0.0, 0.0))
    window.edges.end = done
    return window


def test_a_window_cut_inside_the_burst_counts_from_the_trials_start():
    # 18 workers, 27 batches: the first after 0.6 s of start-up, the rest already made (the burst, 5 ms apart). The
    # fallback window (after the first wave) alone would read 64 / 0.005 = 12,800 samples/s.
    window = _window(18, [0.005] * 26, first_at=0.6)
    assert window.skip == 54
    result = window.result(elapsed=0.73)
    assert result.ok and not result.steady
    assert result.samples_per_s == pytest.approx(27 * 64 / 0.73)


def test_a_window_past_the_burst_is_timed_from_its_opening():
    # 2 workers (skip 6): 30 batches 10 ms apart after 0.5 s of start-up: the steady 6,400 samples/s, start-up excluded.
    window = _window(2, [0.01] * 29, first_at=0.5)
    result = window.result(elapsed=0.8)
    assert result.samples_per_s == pytest.approx(6400)
    assert result.steady


class _NoDevice:
    def synchronize(self) -> None:
        pass


def test_the_window_waits_for_the_previous_runs_workers_to_be_reaped():
    """NOTE [ Trial timing ], 5.: while ``settled`` says no, the burst grows a batch at a time, so a reaped worker's
    CPU time never lands inside the window; once it says yes the window opens and is timed from there."""
    calls = []

    def settled() -> bool:
        calls.append(len(window.marks))
        return len(calls) > 3

    window = Window(LoaderConfig(2, 2), started=0.0, batch_size=8, min_window_s=0.0, min_rounds=3, min_batches=6,
                    settled=settled)
    assert window.skip == 6
    t = 0.0
    for _ in range(20):
        t += 0.01
        window.add([0] * 8, t_ask=t - 0.005, c_ask=(0.0, None), t_got=t, c_got=(0.0, None), consumer=_NoDevice())
    assert calls == [5, 6, 7, 8], "asked as each batch would open the window, until it said yes"
    assert window.skip == 9 and window.edges.opened is not None
    result = window.result(elapsed=t)
    assert result.steady and result.batches == 20 - 9


def test_a_window_over_the_memory_budget_at_its_first_batch_is_complete_and_skipped():
    """NOTE [ Memory budget ]: the workers' USS read at the first batch is checked (``Candidate.memory``); over the
    budget, the window is complete at once and its result "skipped" with the figures (this process stands for the
    workers)."""
    me = psutil.Process()
    seen = []

    class Check:
        census = True

        def __init__(self, verdict):
            self.verdict = verdict

        def __call__(self, config, uss, batch_bytes):
            seen.append((config.num_workers, uss, batch_bytes))
            return self.verdict

    window = Window(LoaderConfig(2, 2), started=0.0, batch_size=4)
    window.memory_check = Check("memory: stopped at its first batch: ...")
    window.first_batch(torch.zeros(4, 8), 0.25, workers=[me])
    assert len(seen) == 1 and seen[0][0] == 2 and seen[0][1] > 0 and seen[0][2] == 4 * 8 * 4
    assert window.complete(deadline=1e9) and window.edges.census is None
    result = window.result(elapsed=0.3)
    assert result.status == "skipped" and result.reason == "memory: stopped at its first batch: ..."
    assert result.worker_uss_bytes == seen[0][1] and result.batch_bytes == 128 and result.startup_s == 0.25
    assert result.worker_uss_total_bytes == seen[0][1] and not result.ok

    fits = Window(LoaderConfig(2, 2), started=0.0, batch_size=4)
    fits.memory_check = Check(None)
    fits.first_batch(torch.zeros(4, 8), 0.25, workers=[me, me])
    assert fits.over_budget is None and not fits.complete(deadline=1e9)
    assert fits.edges.census is not None or not sys.platform.startswith("linux"), "the census, two workers"
    Check.census = False
    quiet = Window(LoaderConfig(2, 2), started=0.0, batch_size=4)
    quiet.memory_check = Check(None)
    quiet.first_batch(torch.zeros(4, 8), 0.25, workers=[me, me])
    assert quiet.edges.census is None, "not asked for"
