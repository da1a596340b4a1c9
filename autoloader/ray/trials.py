"""Tuning the Ray pool against the step (NOTE [ Sizing the Ray pool ] in plan.py): the cost of one batch measured in
the driver, then short trials of candidate pools through the step, each over a private random order (the user's RNG
is never touched), until the search says done or the budget runs out."""
from __future__ import annotations

import logging
import numbers
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from ..consumer import Consumer
from . import plan
from .pipeline import Feed
from .records import RayConfig, RayTrial, RayTuning
from .work import fetch

log = logging.getLogger("autoloader.ray")

MAX_TRIAL_BATCHES = 240
SERIAL_S = 0.5


@dataclass(frozen=True)
class Costs:
    """What the driver measured before any trial: one batch's load (``serial_s`` seconds, ``cpu_share`` of it on a
    CPU) and the step's seconds per batch."""

    serial_s: float
    cpu_share: Optional[float]
    step_s: float


def private_batches(template: DataLoader, count: int, *, seed: int = 0) -> List[Any]:
    """``count`` index batches in a random order of the template's dataset, from a generator of their own."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    size = template.batch_size or 1
    length = len(template.dataset)  # type: ignore[arg-type]  # map-style: make_loader checked its len()
    sampler = BatchSampler(RandomSampler(range(length), generator=generator), size, drop_last=False)
    out: List[Any] = []
    while len(out) < count:
        out.extend(batch if template.batch_sampler is not None else batch[0] for batch in sampler)
    return out[:count]


def measure_costs(template: DataLoader, consumer: Consumer, device: torch.device) -> Tuple[Costs, Any]:
    """One batch's cost in this process (wall and CPU time, over ``SERIAL_S`` at most, a first one not timed) and the
    step's on it; returns the costs and a batch."""
    batched = template.batch_sampler is not None
    batches = private_batches(template, 6, seed=1)
    batch = fetch(template.dataset, template.collate_fn, batches[0], batched)
    wall = cpu = 0.0
    done = 0
    for index in batches[1:]:
        start, start_cpu = time.perf_counter(), time.process_time()
        fetch(template.dataset, template.collate_fn, index, batched)
        wall += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
        done += 1
        if wall >= SERIAL_S:
            break
    step = consumer.step
    step_s = float(step) if isinstance(step, numbers.Real) else consumer.seconds_per_batch(_to(batch, device))
    serial_s = wall / done
    return Costs(serial_s, min(1.0, cpu / wall) if wall > 0 else None, step_s), batch


def _to(batch: Any, device: torch.device) -> Any:
    from ..loader.batch import map_tensors

    return map_tensors(lambda t: t.to(device), batch) if device.type != "cpu" else batch


@dataclass(frozen=True)
class Bench:
    """What every trial runs on: Ray, the payload's reference, the template (the user's plain DataLoader), the step
    and the most seconds to wait for one batch."""

    ray: Any
    payload: Any
    template: DataLoader
    consumer: Consumer
    wait_s: float


def run_trial(bench: Bench, config: RayConfig, *, deadline: float) -> RayTrial:
    """One candidate through the step: its first batch's delay, then the rate over the batches after its start-up
    burst (the blocks in flight), the step waiting for data ``stall_fraction`` of that window."""
    template, consumer = bench.template, bench.consumer
    burst = config.batches_per_task * (config.tasks + config.prefetch)
    total = min(MAX_TRIAL_BATCHES, burst + max(8, 3 * config.tasks * config.batches_per_task))
    feed = Feed(bench.ray, bench.payload, private_batches(template, total, seed=2), config,
                batched=template.batch_sampler is not None, wait_s=bench.wait_s)
    start = time.perf_counter()
    first: Optional[float] = None
    opened = waited = 0.0
    window = samples = 0
    try:
        for k in range(total):
            asked = time.perf_counter()
            _, batch = feed.next()
            got = time.perf_counter()
            first = got - start if first is None else first
            if k == burst:
                opened = got
            elif k > burst:
                waited += got - asked
                window += 1
                samples += template.batch_size or 1
            consumer(batch)
            if got > deadline and window >= 3:
                break
    except (TimeoutError, RuntimeError, ConnectionError) as err:
        return RayTrial(config, first_batch_s=first, reason=f"{type(err).__name__}: {err}"[:300])
    finally:
        feed.close()
    span = time.perf_counter() - opened if window else 0.0
    if window < 3 or span <= 0:
        return RayTrial(config, first_batch_s=first, batches=window, reason="too few batches in the window")
    return RayTrial(config, samples_per_s=samples / span, first_batch_s=first, stall_fraction=min(1.0, waited / span),
                    batches=window)


def tune_pool(bench: Bench, *, costs: Costs, cluster: Dict[str, Any], drivers: int, budget: float,
              max_tasks: Optional[int]) -> RayTuning:
    """The search (``plan.next_pool``) over task counts within ``budget`` seconds, and its choice (``plan.choose``);
    a ``RayTuning`` with ``source="fixed"`` (the guard's smallest pool) when no trial measured."""
    started = time.perf_counter()
    cpus = plan.task_cpus(cluster["cpus"], cpu_share=costs.cpu_share, drivers=drivers)
    cap = plan.pool_cap(cluster["cpus"], cpus=cpus, drivers=drivers, max_tasks=max_tasks)
    if cap < 1:
        raise ValueError(f"engine='ray': the Ray cluster has {cluster['cpus']:g} CPUs, none left for a pool of "
                         f"loading tasks after the {plan.RESERVE_CPUS:g} kept for Ray Data's own stages; add CPU "
                         f"nodes (ray start --address=... --num-cpus=N) or use engine='dataloader'")
    template = bench.template
    epoch = len(template)
    trials: List[RayTrial] = []
    rates: Dict[int, Optional[float]] = {}
    count: Optional[int] = plan.first_pool(serial_s=costs.serial_s, step_s=costs.step_s, cap=cap)
    while count is not None and time.perf_counter() - started < budget:
        config = plan.config_for(count, cpus=cpus, serial_s=costs.serial_s, epoch_batches=epoch)
        trial = run_trial(bench, config, deadline=started + budget)
        log.info("ray trial %s: %s samples/s, first batch %s s%s", config.label(), trial.samples_per_s,
                 trial.first_batch_s, f" ({trial.reason})" if trial.reason else "")
        trials.append(trial)
        rates[count] = trial.samples_per_s
        count = plan.next_pool(rates, cap=cap)
    chosen = plan.choose(trials)
    size = template.batch_size or 1
    step_rate = size / costs.step_s if costs.step_s > 0 else None
    if chosen is None:
        config = plan.config_for(1, cpus=cpus, serial_s=costs.serial_s, epoch_batches=epoch)
        return RayTuning(config, None, "fixed", cluster, tuple(trials), "no trial measured a rate: the smallest pool",
                         time.perf_counter() - started, step_rate, costs.serial_s)
    why = (f"fewest CPUs ({chosen.config.cluster_cpus:g} of {cluster['cpus']:g}) within 5% of the best measured "
           f"rate; block of {chosen.config.batches_per_task} batches for a first batch in "
           f"{chosen.first_batch_s or 0:.2f} s")
    return RayTuning(chosen.config, chosen.samples_per_s, "tuned", cluster, tuple(trials), why,
                     time.perf_counter() - started, step_rate, costs.serial_s)
