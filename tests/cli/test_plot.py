"""``--plot`` (autoloader.cli.plot): a PNG of the trials, when matplotlib is installed."""
from __future__ import annotations

import pytest

from helpers import tuned_result


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from autoloader.cli.plot import plot_tune_result

    path = plot_tune_result(tuned_result(), tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
