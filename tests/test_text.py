"""The text helpers every report shares (autoloader._text)."""
from __future__ import annotations

import time

from autoloader._text import UNKNOWN, grid, mib, rate, when


def test_mib_keeps_one_decimal_below_ten_and_separates_thousands():
    assert mib(1.5 * (1 << 20)) == "1.5 MiB" and mib(1024 << 20) == "1,024 MiB" and mib(0) == "0.0 MiB"


def test_rate_and_when_say_what_is_not_known():
    assert rate(None) == "-" and rate(12345.6) == "12,346"
    assert when(None) == UNKNOWN
    assert when(0.0) == time.strftime("%Y-%m-%d %H:%M", time.localtime(0.0))


def test_grid_right_aligns_but_the_left_columns_and_never_pads_the_last():
    lines = grid(["", "workers", "status"], [["*", "2", "ok"], ["", "16", "failed: worker died"]], left=(0,))
    assert lines == ["   workers  status", "*        2  ok", "        16  failed: worker died"]
