"""The drawn benchmark's workload generator (tests/benchmarks/drawn_workloads.py): a seed is one spec on any machine,
consecutive seeds cover every family, the drawn parameters stay in their ranges, and the dataset's hidden costs (the
ceiling, the fork and set-up costs, the object reads) are what the spec says. No timing upper bounds: only lower ones,
which a slow machine keeps."""
from __future__ import annotations

import collections
import multiprocessing
import time

import pytest
import torch
from torch.utils.data import DataLoader

from benchmarks.drawn_workloads import (FAMILIES, MAX_BATCHES, MEMORY_FAMILIES, MIN_BATCHES, KIB, Spec, Step, draw,
                                        parse_seeds)

FORK = multiprocessing.get_context("fork")


def small(**kw) -> Spec:
    """A hand-made spec of a few samples (the benchmark's own are seconds long)."""
    base = dict(seed=0, family="mix", n=64, batch_size=8, sample_bytes=100, cpu_s=0.0, wait_s=0.0)
    base.update(kw)
    return Spec(**base)


# ---------------------------------------------------------------- the draw

def test_a_seed_is_one_spec_wherever_it_is_drawn():
    assert draw(7) == draw(7) and draw(7) != draw(15)
    # pinned: the fixed seeds are the benchmark's regressions, and must stay the same workloads
    assert draw(0).line() == (
        "seed 0 ceiling: 3,400 samples, batch 34 (100 batches), 1.2 KiB/sample, cpu 0.00 ms + wait 7.24 ms "
        "(ceiling 12); no step; estimate 2.2 s (~13 workers, 2 cores)")
    assert draw(2).line() == (
        "seed 2 copy-on-read: 28,638 samples, batch 111 (258 batches), 94 B/sample, cpu 0.00 ms + wait 2.20 ms; "
        "no step; 261,552 objects of 385 B (46 objects spread per sample, 106 MiB a worker copies at most); "
        "budget at 0.36 of the way from 1 worker's peak to the largest pool's; estimate 2.3 s (~32 workers, 2 cores)")


@pytest.mark.parametrize("start", [0, 1, 5, 100, 12345])
def test_any_24_consecutive_seeds_draw_every_family_at_least_twice(start):
    counts = collections.Counter(draw(s).family for s in range(start, start + 24))
    assert set(counts) == set(FAMILIES) and min(counts.values()) >= 2


def test_the_drawn_parameters_stay_in_their_ranges():
    spreads = set()
    for seed in range(600):
        spec = draw(seed)
        assert spec.seed == seed and spec.family == FAMILIES[seed % len(FAMILIES)]
        assert MIN_BATCHES <= spec.batches <= MAX_BATCHES and spec.n == spec.batches * spec.batch_size
        assert 8 <= spec.batch_size <= 128 and 64 <= spec.sample_bytes <= 512 * KIB
        assert 0 <= spec.cpu_s <= 3e-3 and 0 <= spec.wait_s <= 8e-3
        assert (3 <= spec.ceiling <= 24) if spec.family == "ceiling" else spec.ceiling == 0
        assert spec.memory == (spec.family in MEMORY_FAMILIES)
        if spec.memory:
            assert 0.25 <= spec.budget_share <= 0.75
        if spec.family.endswith("-step"):
            assert 1e-3 <= spec.step_s <= 20e-3
        if spec.family == "copy-on-read":
            assert 100_000 <= spec.objects <= 400_000 and 1 <= spec.touches <= 64
            spreads.add(spec.touches > 1)
        else:
            assert spec.objects == 0
        if spec.family == "start-cost":
            assert 0.01 <= spec.fork_s <= 0.06 and 0.05 <= spec.init_s <= 0.3
        else:
            assert spec.fork_s == spec.init_s == 0
        # sized for the benchmark: about 1-2.4 s, more where 100 batches take longer, a start-cost workload's start
        assert 0.9 <= spec.estimate_s <= (7.0 if spec.family == "start-cost" else 4.0), spec.line()
    assert spreads == {True, False}, "copy-on-read draws both one object and objects spread per sample"


def test_seeds_are_read_as_ranges_and_lists():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("3,7, 12,7") == [3, 7, 12]
    assert parse_seeds("0-2,9,1") == [0, 1, 2, 9]
    for bad in ("a", "3-", "5-3", "-1"):
        with pytest.raises(ValueError, match="AUTOLOADER_BENCH_DRAWN_SEEDS"):
            parse_seeds(bad)
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="seed"):
            draw(bad)


# ---------------------------------------------------------------- the dataset

def test_a_sample_is_its_index_and_its_bytes_and_a_loader_delivers_each_once():
    dataset = small(wait_s=0.001, cpu_s=0.0005).dataset()
    try:
        i, payload = dataset[5]
        assert i == 5 and payload.dtype == torch.uint8 and payload.shape == (100,)
        with pytest.raises(IndexError):
            dataset[64]
        seen = torch.cat([batch[0] for batch in DataLoader(dataset, 8, shuffle=True, num_workers=2)])
        assert sorted(seen.tolist()) == list(range(64))
    finally:
        dataset.close()


def test_the_samples_read_the_object_list_evenly():
    spread = small(n=500, objects=20_000, object_bytes=64, touches=16).dataset()
    one = small(n=500, objects=20_000, object_bytes=64, touches=1).dataset()
    try:
        read = sorted({p for i in range(500) for p in spread.positions(i)})
        assert len(read) == 500 * 16 and read[0] == 0 and max(b - a for a, b in zip(read, read[1:])) <= 3
        assert all(len(set(spread.positions(i))) == 16 for i in range(500))
        firsts = [one.positions(i) for i in range(500)]
        assert all(len(p) == 1 for p in firsts) and firsts[-1][0] >= 20_000 - 41
        assert len(spread.items) == 20_000 and all(len(x) == 64 for x in spread.items[:10])
    finally:
        spread.close()
        one.close()


def _load(dataset, index, done):
    dataset[index]
    done.put(index)


def test_the_ceiling_admits_k_samples_at_once_across_forked_workers():
    dataset = small(ceiling=3, wait_s=0.25).dataset()
    try:
        done = FORK.Queue()
        started = time.perf_counter()
        procs = [FORK.Process(target=_load, args=(dataset, i, done)) for i in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        elapsed = time.perf_counter() - started
        assert all(p.exitcode == 0 for p in procs)
        assert elapsed >= 0.48, f"6 samples of 0.25 s through 3 slots took {elapsed:.2f} s: not two waves"
    finally:
        dataset.close()


def _cpu_of_two_samples(dataset, out):
    times = []
    for i in (0, 1):
        started = time.thread_time()
        dataset[i]
        times.append(time.thread_time() - started)
    out.put(times)


def test_a_worker_pays_its_set_up_once_and_the_parent_never():
    dataset = small(init_s=0.2).dataset()
    try:
        started = time.thread_time()
        dataset[0]
        assert time.thread_time() - started < 0.1
        out = FORK.Queue()
        proc = FORK.Process(target=_cpu_of_two_samples, args=(dataset, out))
        proc.start()
        first, second = out.get(timeout=30)
        proc.join(30)
        assert first >= 0.2 and second < 0.1, (first, second)
    finally:
        dataset.close()


def _nothing():
    pass


def _fork_cpu_s() -> float:
    started = time.thread_time()
    proc = FORK.Process(target=_nothing)
    proc.start()
    spent = time.thread_time() - started
    proc.join(30)
    return spent


def test_a_fork_costs_the_parent_fork_s_only_while_the_workload_is_active():
    dataset = small(fork_s=0.3).dataset()
    try:
        with dataset.active():
            inside = _fork_cpu_s()
        after = _fork_cpu_s()
    finally:
        dataset.close()
    assert inside >= 0.3 and after < 0.15, (inside, after)


# ---------------------------------------------------------------- the step

def test_the_steps_sleep_burn_or_train():
    started = time.thread_time()
    Step("python", 0.02)(None)
    assert time.thread_time() - started >= 0.02 * 8  # 7 calls at construction (2 warm-up, 5 timed) and this one
    started = time.perf_counter()
    sleep = Step("sleep", 0.01)
    assert time.perf_counter() - started >= 0.07 and sleep.measured_s >= 0.01
    torch_step = Step("torch", 0.005)
    assert torch_step.rows == round((0.005 - 0.25e-3) / 3.9e-6) and torch_step.measured_s > 0
    torch_step(None)
    assert all(layer.weight.grad is None for layer in torch_step.layers)
    assert Step("none", 0.0).measured_s is None and "no step" == Step("none", 0.0).describe()
    with pytest.raises(ValueError, match="kind"):
        Step("gpu", 0.01)
