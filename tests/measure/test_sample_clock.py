"""The first samples of an online epoch timed as the main process loads them (measure/sample_clock.py): the
estimate comes a few samples into the first batch, once, and the DataLoader's batches are untouched."""
import time

import torch
from torch.utils.data import DataLoader, Dataset

from autoloader.loader.slices import EpochSlicer
from autoloader.measure.sample_clock import MIN_SAMPLES, SampleClock, times_samples


class Sleepy(Dataset):
    def __init__(self, n=64, sleep_s=0.004):
        self.n, self.sleep_s, self.asked = n, sleep_s, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.asked.append(i)
        time.sleep(self.sleep_s)
        return torch.tensor([i])


def serial_over_a_slice(dataset, estimates, *, batch_size=8):
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(3))
    source = EpochSlicer(plain).epoch()
    part = source.take(None)
    part.through = SampleClock(estimates.append).wrap
    loader = DataLoader(dataset, **part.sampling(), generator=part.private_generator())
    reference = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(3))
    return loader, reference, part


def test_the_estimate_comes_inside_the_first_batch_once_and_the_batches_are_untouched():
    dataset, estimates, seen = Sleepy(), [], []
    loader, reference, part = serial_over_a_slice(dataset, estimates)
    it = iter(loader)
    first = next(it)
    [estimate] = estimates
    assert len(dataset.asked) == 8, "the first batch only"
    assert estimate.samples == 8
    assert 8 * 0.004 * 0.8 <= estimate.fetch_s <= 8 * 0.004 * 10, estimate
    assert estimate.fetch_cpu_s < estimate.fetch_s / 2, "sleeping: little CPU"
    seen = [first] + list(it)
    assert len(estimates) == 1, "once"
    assert [b.tolist() for b in seen] == [b.tolist() for b in reference]
    part.delivered(len(seen))


def test_only_a_loader_fetching_in_this_process_is_timed():
    assert times_samples(DataLoader(Sleepy(), batch_size=8))
    assert not times_samples(DataLoader(Sleepy(), batch_size=8, num_workers=2)), "in its workers"


def test_a_subset_walks_its_indices_in_getitems_and_is_timed_as_well():
    dataset, estimates = torch.utils.data.Subset(Sleepy(), list(range(64))), []
    loader, reference, part = serial_over_a_slice(dataset, estimates)
    got = list(loader)
    [estimate] = estimates
    assert estimate.fetch_s >= 8 * 0.004 * 0.8
    assert [b.tolist() for b in got] == [b.tolist() for b in reference]
    part.delivered(len(got))


def test_a_batch_too_small_to_time_is_passed_through():
    clock = SampleClock(lambda estimate: None)
    small = list(range(MIN_SAMPLES - 1))
    assert clock.wrap(small) is small
    assert clock.wrap(7) == 7, "batch_size=None: single indices"
