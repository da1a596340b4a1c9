"""Where a trial's timed window opens (autoloader._window): after the prefetch burst has drained."""
import pytest

from autoloader._window import window_open


@pytest.mark.parametrize("count, skip, n, expected", [
    (20, 7, 2, 6),      # past the burst (2 x 2 prefetched + 2): the window opens after batch index 6
    (5, 7, 2, 2),       # the burst never drained: open after the first wave of 2
    (3, 7, 2, 0),       # not even that: after the first batch
    (2, 7, 2, None),    # fewer than two batches after anything: no rate
    (10, 1, 0, 0),      # no workers: only the first batch is skipped
])
def test_window_open(count, skip, n, expected):
    assert window_open(count, skip, n) == expected
