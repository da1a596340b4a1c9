"""What a window records and the plain reckoning over it (autoloader/measure/marks.py): how many samples a batch
holds, the mean run-queue wait."""
import collections

import pytest
import torch

from autoloader.measure.marks import BatchMark, mean_delay, samples_in


Pair = collections.namedtuple("Pair", "image label")


@pytest.mark.parametrize("batch, expected, why", [
    (torch.zeros(7, 3), 7, "a tensor: its leading dimension"),
    ({"image": torch.zeros(5, 2), "label": torch.zeros(5)}, 5, "a dict: its first tensor's"),
    (Pair(torch.zeros(3, 2), torch.zeros(3)), 3, "a namedtuple: its first tensor's"),
    ([[1, 2], [3, 4], [5, 6], [7, 8]], 4, "no tensor: its len()"),
    (torch.tensor(1.5), 16, "a 0-d tensor: the default"),
    (object(), 16, "neither: the default"),
])
def test_the_samples_in_a_batch(batch, expected, why):
    assert samples_in(batch, 16) == expected, why


def _mark(delay):
    return BatchMark(done=0.0, samples=8, wait_s=0.01, wait_cpu_s=0.0, step_s=0.0, wait_delay_s=delay)


def test_the_mean_run_queue_wait_is_known_only_when_every_mark_knows_it():
    assert mean_delay([_mark(0.001), _mark(0.003)]) == pytest.approx(0.002)
    assert mean_delay([_mark(0.001), _mark(None)]) is None, "one mark the kernel did not tell: unknown"
    assert mean_delay([]) is None
