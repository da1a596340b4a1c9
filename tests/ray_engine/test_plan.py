"""The Ray engine's decisions (autoloader/ray/plan.py) on tables: the guard, the first pool, the block, the runs of an
epoch, the search and the choice. No Ray needed."""
import pytest

from autoloader.ray import plan
from autoloader.ray.records import RayConfig, RayTrial


@pytest.mark.parametrize("cluster, drivers, cpus, max_tasks, cap", [
    (2, 1, 1.0, None, 2),      # this VM: both CPUs (a run has one stage; nothing of it waits for a CPU the pool holds)
    (2, 1, 0.5, None, 4),
    (8, 1, 1.0, None, 8),
    (8, 3, 1.0, None, 2),      # three torchrun ranks share the cluster: 2.67 CPUs each
    (8, 1, 1.0, 4, 4),         # max_workers caps the tasks
    (1, 2, 1.0, None, 1),      # half a CPU each: one task asking less
    (0, 1, 1.0, None, 0),      # no CPU: nothing fits (the caller names the fix)
    (64, 4, 0.5, None, 32),
])
def test_the_guard_holds_each_driver_to_its_share_of_the_cluster(cluster, drivers, cpus, max_tasks, cap):
    assert plan.pool_cap(cluster, cpus=cpus, drivers=drivers, max_tasks=max_tasks) == cap
    if cap and cpus <= cluster / drivers:
        assert cap * cpus <= cluster / drivers + 1e-9


@pytest.mark.parametrize("cluster, share, drivers, cpus", [
    (8, 0.9, 1, 1.0), (8, 0.2, 1, 0.5), (8, None, 1, 1.0), (2, 0.9, 4, 0.5), (1, 0.9, 4, 0.2), (1, 0.9, 1, 1.0)])
def test_cpus_per_task_halve_for_waiting_batches_and_fit_the_room(cluster, share, drivers, cpus):
    assert plan.task_cpus(cluster, cpu_share=share, drivers=drivers) == cpus


@pytest.mark.parametrize("serial_s, step_s, cap, first", [
    (0.1, 0.05, 16, 3),   # 1.2 x 0.1 / 0.05 = 2.4 -> 3
    (0.1, 0.0, 16, 16),   # a free step: every task that fits
    (0.01, 0.1, 16, 1),
    (1.0, 0.01, 7, 7),
    (0.1, 0.05, 0, 0),
])
def test_first_pool_meets_the_step_with_headroom(serial_s, step_s, cap, first):
    assert plan.first_pool(serial_s=serial_s, step_s=step_s, cap=cap) == first


@pytest.mark.parametrize("serial_s, epoch, tasks, block", [
    (0.002, 10000, 4, 100),  # 0.01 / (0.05 x 0.002) = 100 batches: overhead 5 %; loads in 0.2 s
    (0.0001, 1000, 4, 62),   # cheap batches: 4 blocks per task and epoch cap it
    (0.05, 1000, 4, 4),
    (0.002, 1000, 4, 62),
    (0.02, 10000, 1, 10),    # 0.01 / (0.05 x 0.02)
    (0.0005, 100000, 1, 400),
    (0.004, 100000, 1, 50),
    (0.5, 1000, 4, 1),       # 0.01 / 0.025 = 0.4: one batch already dwarfs the overhead
    (0.003, 100000, 1, 67),
    (0.0001, 100000, 1, 2000),
    (0.00001, 10 ** 7, 1, 20000),
    (0.0002, 10 ** 7, 1, 1000),
    (0.00005, 10 ** 7, 1, 4000),
    (0.0011, 10 ** 7, 1, 182),
    (0.01, 10 ** 7, 1, 20),
    (0.6, 10 ** 7, 1, 1),
    (2.0, 1000, 4, 1),
    (0.002, 3, 4, 1),
])
def test_the_block_dwarfs_the_task_overhead_and_keeps_the_first_batch_early(serial_s, epoch, tasks, block):
    assert plan.batches_per_task(serial_s=serial_s, epoch_batches=epoch, tasks=tasks) == block


@pytest.mark.parametrize("rates, cap, nxt", [
    ({}, 8, None),
    ({4: None}, 8, None),
    ({2: 100.0}, 8, 4),                       # the largest is the best: climb
    ({2: 100.0, 4: 190.0}, 8, 8),
    ({2: 100.0, 4: 190.0, 8: 195.0}, 8, 3),   # 4 within 5 % of 8: bisect 2..4
    ({2: 100.0, 4: 101.0}, 8, 1),             # 4 no better: descend from 2
    ({1: 50.0, 2: 100.0, 4: 101.0}, 8, None),
    ({7: 100.0}, 7, 3),                       # at the cap: only down
    ({3: 100.0, 1: 99.0}, 8, None),           # 1 within tolerance of the best, nothing below it
    ({1: 100.0}, 1, None),
])
def test_next_pool_climbs_then_bisects_to_the_fewest(rates, cap, nxt):
    assert plan.next_pool(rates, cap=cap) == nxt


def _trial(tasks, rate, block=1, prefetch=1, cpus=1.0):
    return RayTrial(RayConfig(tasks, cpus=cpus, batches_per_task=block, prefetch=prefetch), samples_per_s=rate)


def test_choose_keeps_the_fewest_cpus_within_tolerance_then_the_smaller_block():
    assert plan.choose([]) is None and plan.choose([RayTrial(RayConfig(1), reason="failed")]) is None
    trials = [_trial(4, 200.0), _trial(2, 194.0), _trial(1, 120.0)]
    assert plan.choose(trials).config.tasks == 2
    assert plan.choose([_trial(2, 100.0, block=8), _trial(2, 99.0, block=2)]).config.batches_per_task == 2
    assert plan.choose([_trial(4, 100.0, cpus=0.5), _trial(3, 100.0)]).config.tasks == 4  # 2 CPUs < 3


def test_config_for_derives_block_and_prefetch():
    config = plan.config_for(4, cpus=0.5, serial_s=0.002, epoch_batches=10000)
    assert config == RayConfig(4, cpus=0.5, batches_per_task=100, prefetch=4)
    assert config.cluster_cpus == 2.0 and config.label() == "ray tasks=4 cpus=0.5 block=100 prefetch=4"


@pytest.mark.parametrize("tasks, prefetch, sizes", [
    (1, 1, [8, 32, 128, 512, 512]),      # at least FIRST_RUN_BLOCKS, then x4 up to MAX_RUN_BLOCKS
    (4, 4, [16, 64, 256, 512, 512]),     # two waves of the pool and its read-ahead first
    (300, 300, [1200, 1200, 1200, 1200, 1200]),  # a first run larger than the cap stays as it is
])
def test_an_epochs_runs_start_small_and_grow_to_a_cap(tasks, prefetch, sizes):
    config = RayConfig(tasks, prefetch=prefetch)
    assert [plan.run_blocks(k, config) for k in range(5)] == sizes
    assert plan.run_blocks(10 ** 6, config) == sizes[-1]
    assert plan.next_run_at(config) == tasks + prefetch
