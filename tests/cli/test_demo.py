"""The bare ``autotune`` command's parts (autoloader.cli.demo): the demo dataset, the baselines and the comparison."""
from __future__ import annotations

import pickle

import pytest
import torch

from autoloader.cli.demo import DemoImages, baselines, cores_rule_workers
from autoloader.config import LoaderConfig
from autoloader.request import Request
from helpers import trial, tuned_result


def test_demo_dataset_is_deterministic_picklable_and_image_like():
    data = DemoImages(length=20)
    image, label = data[3]
    again, _ = pickle.loads(pickle.dumps(data))[3]
    assert image.shape == (3, 64, 64) and image.dtype == torch.float32 and label == 3
    assert torch.equal(image, again) and not torch.equal(image, data[4][0])
    assert len(data) == 20 and data[-1][1] == 19 % 10
    with pytest.raises(IndexError):
        data[20]
    with pytest.raises(ValueError, match="size"):
        DemoImages(size=4)
    assert [cores_rule_workers(n) for n in (None, 1, 2, 8)] == [1, 1, 1, 7]


# The copy-on-read check can fire here: a worker forked from the big pytest process dirties some of its heap.
@pytest.mark.filterwarnings("ignore:each DataLoader worker's private memory grew")
def test_baselines_reuse_the_tuners_trials_and_time_the_rest():
    data = DemoImages(length=64, work=0)
    serial = trial(0, 500.0)
    result = tuned_result(trials=(serial,), num_workers=0, prefetch_factor=None, persistent_workers=False)
    request = Request.checked(data, 8, step=None, device="cpu")
    no_workers, rule = baselines(request, result, usable_cpus=3, time_limit=3.0)
    assert no_workers.trial is serial and no_workers.measured_by_tuner and no_workers.samples_per_s == 500.0
    assert rule.config == LoaderConfig(2, 2, False, False) and not rule.measured_by_tuner
    assert rule.trial is not None and rule.trial.config == rule.config and rule.trial.status in ("ok", "failed")
    capped = baselines(Request.checked(data, 8, step=None, device="cpu", max_workers=0), result, usable_cpus=3)[1]
    assert capped.trial is None and capped.samples_per_s is None
    from autoloader.cli.demo import format_comparison

    text = format_comparison(result, [no_workers, capped])
    assert "max(1, 3 usable CPUs - 1) = 2 workers" in text and "not run" in text and "tuned is 1.96x" in text
