"""Tuning the Ray pool (autoloader/ray/trials.py) without Ray: the trials' private random order (reproducible, the
user's RNG untouched, epochs repeated as needed), the driver's measure of one batch (at most ``SERIAL_S`` of it, the
CPU share, the step's seconds), a cluster with no CPU for a pool refused naming the fix, and a budget spent before any
trial giving the model's first candidate (not one task). Trials through a real Ray are in
tests/integrations/test_ray_engine.py."""
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader.consumer import Consumer
from autoloader.ray import plan, trials
from autoloader.ray.trials import Bench, Costs, measure_costs, private_batches, tune_pool
from autoloader.ray.waits import BATCH, STARTUP
from autoloader.ray.work import fetch


class Counted(Dataset):
    def __init__(self, n=10, sleep_s=0.0, spin_s=0.0):
        self.n, self.sleep_s, self.spin_s, self.calls = n, sleep_s, spin_s, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        time.sleep(self.sleep_s)
        end = time.process_time() + self.spin_s
        while time.process_time() < end:
            pass
        return torch.tensor([i])


def test_the_private_order_is_reproducible_per_seed_and_leaves_the_users_rng_alone():
    template = DataLoader(Counted(10), batch_size=3)
    state = torch.random.get_rng_state()
    one = private_batches(template, 9, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert one == private_batches(template, 9, seed=4) and one != private_batches(template, 9, seed=5)
    assert len(one) == 9 and [len(b) for b in one[:4]] == [3, 3, 3, 1], "the last batch of an epoch is kept"
    epochs = [one[:4], one[4:8]]  # 9 batches: more than one epoch of 4, each epoch a permutation of the dataset
    assert all(sorted(i for b in epoch for i in b) == list(range(10)) for epoch in epochs)


def test_without_a_batch_sampler_the_private_order_is_of_single_indices():
    got = private_batches(DataLoader(Counted(5), batch_size=None), 12, seed=0)
    assert len(got) == 12 and all(isinstance(i, int) for i in got)
    assert sorted(got[:5]) == list(range(5)) and sorted(got[5:10]) == list(range(5))


def test_the_driver_times_batches_after_an_untimed_first_for_at_most_serial_s(monkeypatch):
    monkeypatch.setattr(trials, "SERIAL_S", 0.1)
    dataset = Counted(20, sleep_s=0.06)
    template = DataLoader(dataset, batch_size=1)
    costs, batch = measure_costs(template, Consumer(0.02, torch.device("cpu")), torch.device("cpu"))
    assert dataset.calls == 3, "the first batch and two timed ones: 0.12 s of batches passes SERIAL_S"
    assert 0.05 < costs.serial_s < 0.5 and costs.step_s == 0.02
    assert costs.cpu_share is not None and costs.cpu_share < 0.2, "sleeping is not CPU time"
    first = private_batches(template, 6, seed=1)[0]
    assert torch.equal(batch, fetch(dataset, template.collate_fn, first, True))


def test_a_batch_that_computes_has_a_cpu_share_near_one():
    template = DataLoader(Counted(20, spin_s=0.01), batch_size=2)
    costs, _ = measure_costs(template, Consumer(0.0, torch.device("cpu")), torch.device("cpu"))
    assert costs.cpu_share is not None and 0.1 < costs.cpu_share <= 1.0 and costs.step_s == 0.0  # ~1/load when busy


def _bench(batch_size=4):
    return Bench(ray=None, payload=None, template=DataLoader(Counted(40), batch_size=batch_size),
                 consumer=Consumer(0.01, torch.device("cpu")), startup=STARTUP, wait=BATCH)


def test_a_cluster_with_no_cpu_for_a_pool_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"has 0 CPUs, not enough for one loading task per driver \(1\); add CPU "
                                         r"nodes \(ray start --address=\.\.\. --num-cpus=N\) or use "
                                         r"engine='dataloader'"):
        tune_pool(_bench(), costs=Costs(0.01, 1.0, 0.01), cluster={"cpus": 0.0}, drivers=1, budget=5.0,
                  max_tasks=None)


def test_no_budget_for_a_trial_is_the_first_candidate_named_fixed():
    cluster = {"nodes": 1, "cpus": 8.0, "gpus": 0.0, "node_cpus": [8.0], "resources": []}
    tuning = tune_pool(_bench(), costs=Costs(0.02, 0.9, 0.01), cluster=cluster, drivers=1, budget=0.0,
                       max_tasks=None)
    assert tuning.source == "fixed" and tuning.trials == () and tuning.samples_per_s is None
    first = plan.first_pool(serial_s=0.02, step_s=0.01, cap=8)
    assert first == 3, "not one task: the model's candidate (1.2 x 0.02 / 0.01)"
    assert tuning.config == plan.config_for(first, cpus=plan.task_cpus(8.0, cpu_share=0.9, drivers=1), serial_s=0.02,
                                            epoch_batches=10)
    assert "no trial measured a rate: the first candidate" in tuning.reason and tuning.cluster == cluster
    assert tuning.startup_s is None
    assert tuning.consumer_samples_per_s == pytest.approx(4 / 0.01) and tuning.serial_s_per_batch == 0.02
