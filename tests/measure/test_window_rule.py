"""When a window opens and closes (measure/window_rule.py), on tables of batch times; and the candidate and probe
windows of measure/window.py built on them."""
import pytest

from autoloader.config import LoaderConfig
from autoloader.measure import window_rule as rule
from autoloader.measure.window import PROBE_MARKS, PROBE_ONE_S, Window, WindowSpec


class _Sync:
    def synchronize(self):
        pass


@pytest.mark.parametrize("waits, first_wave, opened", [
    ([0.3, 0.0, 0.0, 0.0, 0.01, 0.0], 2, 4),   # the burst drained at batch 4: the loop waited for it
    ([0.3, 0.0, 0.01, 0.0], 4, None),          # a wait inside the first wave does not count
    ([0.0] * 10, 1, None),                     # never waited: a step-paced loop
    ([0.5, 0.003], 1, 1),
])
def test_the_window_opens_once_the_loop_waited_after_the_first_wave(waits, first_wave, opened):
    assert rule.drained(waits, first_wave=first_wave) == opened


def test_steady_batches_are_confident_jittery_ones_are_not():
    steady = [0.01 * i for i in range(31)]
    assert rule.relative_error(steady, chunk=1) == pytest.approx(0.0, abs=1e-9)
    assert rule.confident(steady, chunk=1, tolerance=0.05)
    jitter = [0.0]
    for i in range(30):
        jitter.append(jitter[-1] + (0.001 if i % 2 else 0.05))
    assert not rule.confident(jitter, chunk=1, tolerance=0.05), "each other batch 50x slower: not known within 2.5 %"
    assert rule.confident(jitter, chunk=2, tolerance=0.05), "in chunks of its period it is exact"


def test_too_few_batches_or_seconds_are_never_confident():
    assert not rule.confident([0.01 * i for i in range(rule.CONFIDENT_BATCHES)], chunk=1, tolerance=0.05)
    assert not rule.confident([0.0001 * i for i in range(40)], chunk=1, tolerance=0.05), "40 batches in 4 ms"
    assert rule.relative_error([0.0, 1.0, 2.0], chunk=1) is None, "fewer than 3 chunks"


def test_a_candidate_window_opens_at_the_first_wait_and_closes_after_whole_waves(monkeypatch):
    window = Window(LoaderConfig(4, 2), started=0.0, batch_size=8, spec=WindowSpec("candidate", 0.5))
    times = {"now": 0.0}
    monkeypatch.setattr("autoloader.measure.window.time.perf_counter", lambda: times["now"])
    burst = window.skip
    assert burst == 12
    # the first 8 batches (4 workers x prefetch 2) come at once after 0.3 s of start-up, then every batch waits 20 ms
    completed = None
    for i in range(40):
        wait = 0.3 if i == 0 else (0.0 if i < 8 else (0.02 if i > 8 else 0.0015))
        t_ask = times["now"]
        times["now"] += wait
        window.add(i, t_ask=t_ask, c_ask=(0.0, None), t_got=times["now"], c_got=(0.0, None), consumer=_Sync())
        times["now"] += 0.001
        if completed is None and window.complete(deadline=float("inf"), patient=True):
            completed = len(window.marks)
    assert window.skip == 10, "opened at the first batch the loop waited for after those in flight (index 9)"
    assert completed is not None, "20 ms batches, exact: confident"
    assert (completed - window.skip) % 4 == 0, "the loop waits for 4 workers: whole waves of 4 batches"


def test_a_wait_among_the_batches_in_flight_at_the_start_does_not_open_the_window(monkeypatch):
    """4 workers, prefetch 2: one worker's batch lags (the loop waits 10 ms for batch 5) while the others' prefetched
    batches are ready, then every batch takes 20 ms. Opened at that wait, the window counted batches 6 and 7 at memory
    speed (drawn seed 17: 6 workers read 771 samples/s where they ran 620); it opens at the first wait past the 8 in
    flight, and reads the workers' pace."""
    window = Window(LoaderConfig(4, 2), started=0.0, batch_size=8, spec=WindowSpec("candidate", 10.0))
    times = {"now": 0.0}
    monkeypatch.setattr("autoloader.measure.window.time.perf_counter", lambda: times["now"])
    for i in range(40):
        wait = 0.3 if i == 0 else 0.01 if i == 5 else 0.02 if i >= 8 else 0.0
        t_ask = times["now"]
        times["now"] += wait
        window.add([0] * 8, t_ask=t_ask, c_ask=(0.0, None), t_got=times["now"], c_got=(0.0, None), consumer=_Sync())
        times["now"] += 0.001
    window.close()
    assert window.skip == 9, "opened at batch 8, the first the loop waited for past those in flight"
    assert window.result(1.0).samples_per_s == pytest.approx(8 / 0.021, rel=0.02)


def _drained_epoch(monkeypatch, *, drawn_at):
    """4 workers, prefetch 2, each batch 80 ms of work (a batch every 20 ms from the pool), over a 40-batch slice: the
    loader draws the last batch as it gets batch 31; the 8 batches after it were part made and come every 5 ms. The
    first batch of each wave waits 0-60 ms more (the rate is never known within the tolerance). Returns the window's
    result and the marks it held when complete."""
    window = Window(LoaderConfig(4, 2), started=0.0, batch_size=8, spec=WindowSpec("candidate", 10.0))
    times = {"now": 0.0}
    monkeypatch.setattr("autoloader.measure.window.time.perf_counter", lambda: times["now"])
    completed = None
    for i in range(40):
        wait = 0.3 if i == 0 else 0.0 if i < 8 else 0.004 if i >= 32 else 0.019 + (0.03 * (i // 4 % 3) if i % 4 == 0
                                                                                     else 0.0)
        t_ask = times["now"]
        times["now"] += wait
        if drawn_at is not None and i == drawn_at:
            window.last_drawn()
        window.add([0] * 8, t_ask=t_ask, c_ask=(0.0, None), t_got=times["now"], c_got=(0.0, None), consumer=_Sync())
        times["now"] += 0.001
        if completed is None and window.complete(deadline=float("inf"), patient=True):
            completed = len(window.marks)
    window.close()
    return window.result(1.0), completed


def test_a_candidate_window_ends_where_the_loader_drew_its_last_batch(monkeypatch):
    """NOTE [ Trial timing ], 6.: the batches after the last was drawn come from work begun before the window opened;
    counted to the epoch's end they read the pool a quarter faster than it runs (drawn seed 8: 25 workers 2,319
    samples/s where the service admits 2,040)."""
    steady = 8 / 0.0275
    counted, completed = _drained_epoch(monkeypatch, drawn_at=31)
    assert completed == 32, "complete once the batch upon which the last was drawn is marked"
    assert counted.samples_per_s == pytest.approx(steady, rel=0.1), "the waves it holds, 0-60 ms each apart"
    assert counted.batches % 4 == 0, "whole waves of the 4 workers"
    uncut, _ = _drained_epoch(monkeypatch, drawn_at=None)
    assert uncut.samples_per_s > 1.25 * steady, "without it the tail is counted (what the cut is for)"


def test_a_window_not_opened_when_the_last_batch_was_drawn_is_not_steady(monkeypatch):
    result, completed = _drained_epoch(monkeypatch, drawn_at=10)
    assert completed is None, "never complete: the window had not opened by then"
    assert not result.steady


def test_a_probe_window_is_complete_after_probe_marks_batches_and_reports_median_costs(monkeypatch):
    times = {"now": 0.0}
    monkeypatch.setattr("autoloader.measure.window.time.perf_counter", lambda: times["now"])
    window = Window(LoaderConfig(0), started=0.0, batch_size=8, spec=WindowSpec("probe"))
    assert PROBE_MARKS == 3
    # the first batch does something once (9 ms, 3x the others): the median of three leaves it out
    for i, (wait, step) in enumerate([(0.009, 0.01), (0.004, 0.01), (0.003, 0.01)]):
        assert not window.complete(deadline=float("inf"))
        t_ask = times["now"]
        times["now"] += wait
        t_got = times["now"]
        times["now"] += step
        window.add([0] * 8, t_ask=t_ask, c_ask=(0.0, None), t_got=t_got, c_got=(wait / 2, None), consumer=_Sync())
    assert len(window.marks) == PROBE_MARKS and window.complete(deadline=float("inf"))
    result = window.result(1.0)
    assert not result.steady and result.ok
    assert result.fetch_s_per_batch == pytest.approx(0.004) and result.consumer_s_per_batch == pytest.approx(0.01)
    assert result.fetch_cpu_s_per_batch == pytest.approx(0.002)
    assert result.drained is None, "a probe has no workers' queue"


def _candidate(monkeypatch, waits, *, rule="candidate"):
    """A 2-worker window fed batches that waited ``waits`` (after a 0.3 s first batch), each step 5 ms."""
    times = {"now": 0.0}
    monkeypatch.setattr("autoloader.measure.window.time.perf_counter", lambda: times["now"])
    window = Window(LoaderConfig(2, 2), started=0.0, batch_size=8, spec=WindowSpec(rule, 0.2))
    for i, wait in enumerate([0.3] + list(waits)):
        t_ask = times["now"]
        times["now"] += wait
        window.add([0] * 8, t_ask=t_ask, c_ask=(0.0, None), t_got=times["now"], c_got=(0.0, None), consumer=_Sync())
        times["now"] += 0.005
    window.close()
    return window.result(1.0)


def test_a_candidate_window_says_whether_its_workers_queue_ran_dry(monkeypatch):
    queued = _candidate(monkeypatch, [0.0003] * 40)
    assert queued.ok and queued.drained is False, "every batch came from the queue: the loop's pace"
    dry = _candidate(monkeypatch, [0.0003] * 10 + [0.004] * 30)
    assert dry.ok and dry.drained is True, "the loop waited 4 ms a batch: the workers' pace"
    assert _candidate(monkeypatch, [0.0003] * 40, rule="trial").drained is None, "a trial's window does not say"


def test_one_slow_batch_is_a_whole_probe(monkeypatch):
    """Each more serial batch of a slow loader costs as much again: one batch that took ``PROBE_ONE_S`` to load is
    the probe."""
    times = {"now": 0.0}
    monkeypatch.setattr("autoloader.measure.window.time.perf_counter", lambda: times["now"])
    window = Window(LoaderConfig(0), started=0.0, batch_size=8, spec=WindowSpec("probe"))
    t_ask, times["now"] = 0.0, PROBE_ONE_S + 0.01
    window.add([0] * 8, t_ask=t_ask, c_ask=(0.0, None), t_got=times["now"], c_got=(0.05, None), consumer=_Sync())
    times["now"] += 0.005
    assert window.complete(deadline=float("inf")) and len(window.marks) == 1
    result = window.result(1.0)
    assert result.fetch_s_per_batch == pytest.approx(PROBE_ONE_S + 0.01) and result.consumer_s_per_batch == 0.0
    fast = Window(LoaderConfig(0), started=0.0, batch_size=8, spec=WindowSpec("probe"))
    fast.add([0] * 8, t_ask=0.0, c_ask=(0.0, None), t_got=PROBE_ONE_S / 2, c_got=(0.0, None), consumer=_Sync())
    assert not fast.complete(deadline=float("inf")), "a cheap first batch may hold a one-time cost: three batches"


@pytest.mark.parametrize("count, skip, n, expected", [
    (20, 7, 2, 6),      # past the burst (2 x 2 prefetched + 2): the window opens after batch index 6
    (5, 7, 2, 2),       # the burst never drained: open after the first wave of 2
    (3, 7, 2, 0),       # not even that: after the first batch
    (2, 7, 2, None),    # fewer than two batches after anything: no rate
    (10, 1, 0, 0),      # no workers: only the first batch is skipped
])
def test_a_trials_window_opens_after_the_burst_else_the_first_wave(count, skip, n, expected):
    assert rule.window_open(count, skip, n) == expected
