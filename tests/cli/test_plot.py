"""PNGs (autoloader.cli.plot), when matplotlib is installed: ``--plot``'s trials, and an epoch that tuned online."""
from __future__ import annotations

import time

import pytest

from autoloader import make_loader
from autoloader.results import EpochTrace
from helpers import tuned_result
from online_data import Indexed

PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from autoloader.cli.plot import plot_tune_result

    path = plot_tune_result(tuned_result(), tmp_path / "t.png")
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def test_rolling_rate_counts_the_samples_around_each_instant():
    from autoloader.cli.plot import rolling_rate

    batches = [(0.01 * i, 10) for i in range(1, 201)]  # 1,000 samples/s for 2 s
    times, rates, width = rolling_rate(batches, points=21, width_s=0.2)
    assert times[0] == 0.0 and times[-1] == pytest.approx(2.0) and width == 0.2
    assert all(r == pytest.approx(1000, rel=0.06) for r in rates[1:-1])
    assert rolling_rate([]) == ([], [], 0.0)


def test_plot_online_epoch_of_a_synthetic_trace(tmp_path):
    """Every kind of slice: measured, failed, the choice for the rest of the epoch, one cut by the epoch's end."""
    pytest.importorskip("matplotlib")
    from autoloader.cli.plot import plot_online_epoch

    trace = EpochTrace(0, 0.0)
    trace.batches = [(0.05 * i, 8) for i in range(1, 20)] + [(1.5 + 0.01 * i, 8) for i in range(100)] + \
        [(3.0 + 0.01 * i, 8) for i in range(100)]
    trace.spans = [(0.0, 1.0, "workers=0", 160.0), (1.0, 1.4, "workers=4 prefetch=2", None),
                   (1.4, 2.6, "workers=2 prefetch=2", 800.0), (2.6, 4.0, "workers=2 prefetch=2", None)]
    path = plot_online_epoch(trace, tmp_path / "synthetic.png", title="synthetic")
    assert path.read_bytes()[:8] == PNG
    trace.spans[-1] = (2.6, 4.0, "workers=8 prefetch=2", None)  # the epoch ended before it was measured
    assert plot_online_epoch(trace, tmp_path / "cut.png").read_bytes()[:8] == PNG


def test_plot_online_epoch_of_a_real_first_epoch(tmp_path):
    pytest.importorskip("matplotlib")
    from autoloader.cli.plot import plot_online_epoch

    loader = make_loader(Indexed(1600, latency_s=0.001), 8, shuffle=True, cache=False, tuning="online",
                         max_workers=2)
    assert loader.online_traces == ()
    for _ in loader:
        time.sleep(0.001)
    [trace] = loader.online_traces
    assert trace.epoch == 0 and len(trace.spans) >= 2 and sum(s for _, s in trace.batches) == 1600
    path = plot_online_epoch(trace, tmp_path / "online.png")
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 20000
    del loader
