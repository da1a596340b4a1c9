"""Tuning the Ray pool against the step (NOTE [ Sizing the Ray pool ] in plan.py): the cost of one batch measured in
the driver, then short trials of candidate pools through the step, each over a private random order (the user's RNG
is never touched), until the search says done or the budget runs out.

Before the trials, a warm-up run starts the largest pool the search may try, one batch per task (``warm_up``): on a
cluster, its workers start and import torch and the dataset's module on every node, which a trial must not take for
the pool's rate. It waits within ``waits.STARTUP``, its seconds are kept as ``RayTuning.startup_s``, and it does not
count in the budget, nor does a trial's wait for its first batch (Ray may still start a worker for it); a warm-up
that gets no batch within its limit is an error naming it (nothing can be tuned on a pool that does not start). A
trial's rate is measured once Ray Data's read-ahead is used up: Ray Data runs its tasks ahead of the loop as far as
its object store budget lets it, so the first batches of a trial may come from that buffer faster than the pool
loads (``run_trial``)."""
from __future__ import annotations

import logging
import numbers
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from ..consumer import Consumer
from ..loader.epochs import stall_fraction
from . import plan
from .failures import raised
from .order import chunk_of
from .pipeline import Feed
from .records import RayConfig, RayTrial, RayTuning
from .transport import Failure
from .waits import CLOSE, Limit
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
    """What every trial runs on: Ray, the payload's reference, the template (the user's plain DataLoader), the step,
    and the limits on a run's first batch and on each batch after it; ``runs``: the runs started on it."""

    ray: Any
    payload: Any
    template: DataLoader
    consumer: Consumer
    startup: Limit
    wait: Limit
    runs: List[Feed] = field(default_factory=list, init=False)

    def feed(self, chunk: Any, config: RayConfig, *, first: Limit) -> Feed:
        run = Feed(self.ray, self.payload, chunk, config, first=first, wait=self.wait)
        self.runs.append(run)
        return run

    def ended(self) -> None:
        """Wait (within ``waits.CLOSE``) for every run's threads to end, so that none is still in Ray when the
        caller gets its decision (``Feed.ended``); a warning naming the limit when some did not."""
        deadline = time.monotonic() + CLOSE.seconds
        left = [run for run in self.runs if not run.ended(deadline)]
        if left:
            log.warning("%s", CLOSE.error(f"{len(left)} trial run(s) still in Ray"))


@dataclass
class _Window:
    """A trial's timed window: when it opened, the seconds the loop waited in it, its batches and samples."""

    opened: Optional[float] = None
    waited: float = 0.0
    batches: int = 0
    samples: int = 0

    def add(self, waited: float, samples: int) -> None:
        self.waited += waited
        self.batches += 1
        self.samples += samples


def warm_up(bench: Bench, config: RayConfig) -> float:
    """Start ``config``'s pool, one batch per task, and wait for every batch (within ``bench.startup`` for the first,
    ``bench.wait`` for the others): the seconds it took. A batch that raised is raised (the dataset's own exception)."""
    template = bench.template
    chunk = chunk_of(private_batches(template, config.tasks, seed=3), start=0,
                     batched=template.batch_sampler is not None)
    started = time.perf_counter()
    feed = bench.feed(chunk, config, first=bench.startup)
    try:
        while True:
            try:
                position, batch = feed.next()
            except StopIteration:
                break
            if isinstance(batch, Failure):
                raise raised(batch, position)
    finally:
        feed.close()
    return time.perf_counter() - started


def drained_after(step_s: float) -> float:
    """Seconds a batch must keep the loop waiting for the read-ahead to count as used up: the trial's window opens
    after it (``run_trial``)."""
    return max(0.005, step_s)


def run_trial(bench: Bench, config: RayConfig, *, seconds: float, step_s: float = 0.0) -> RayTrial:
    """One candidate through the step: its first batch's delay, then its rate over a window that opens once the loop
    has waited ``drained_after(step_s)`` for a batch (Ray Data's read-ahead used up; the pool's own rate from there) or,
    when it never waits, after the blocks of the first wave (the step is the bottleneck), the step waiting for data
    ``stall_fraction`` of that window. It stops once its window holds enough batches, or ``seconds`` have passed since
    its first batch and it holds 3."""
    template, consumer = bench.template, bench.consumer
    burst = config.batches_per_task * (config.tasks + config.prefetch)
    target = max(8, 3 * config.tasks * config.batches_per_task)
    chunk = chunk_of(private_batches(template, MAX_TRIAL_BATCHES, seed=2), start=0,
                     batched=template.batch_sampler is not None)
    start = time.perf_counter()
    feed = bench.feed(chunk, config, first=bench.wait)
    deadline, drained = start + seconds, drained_after(step_s)  # from the first batch on, below
    first: Optional[float] = None
    size = template.batch_size or 1
    windows = {"drained": _Window(), "burst": _Window()}
    failed: Optional[BaseException] = None
    try:
        for k in range(MAX_TRIAL_BATCHES):
            asked = time.perf_counter()
            position, batch = feed.next()
            if isinstance(batch, Failure):  # the dataset's own exception reaches the user unchanged, below
                failed = raised(batch, position)
                break
            got = time.perf_counter()
            if first is None:
                first = got - start
                deadline += first
            for name, window in windows.items():
                if window.opened is not None:
                    window.add(got - asked, size)
                elif (name == "drained" and k > 0 and got - asked > drained) or (name == "burst" and k >= burst):
                    window.opened = got
            consumer(batch)
            best = windows["drained"] if windows["drained"].opened is not None else windows["burst"]
            if best.batches >= target or (got > deadline and best.batches >= 3):
                break
    except (TimeoutError, RuntimeError, ConnectionError) as err:
        return RayTrial(config, first_batch_s=first, reason=f"{type(err).__name__}: {err}"[:300])
    finally:
        feed.close()
    if failed is not None:
        raise failed
    end = time.perf_counter()
    window = windows["drained"] if windows["drained"].batches >= 3 else windows["burst"]
    span = end - window.opened if window.opened is not None else 0.0
    if window.batches < 3 or span <= 0:
        return RayTrial(config, first_batch_s=first, batches=window.batches, reason="too few batches in the window")
    return RayTrial(config, samples_per_s=window.samples / span, first_batch_s=first,
                    stall_fraction=stall_fraction(window.waited, span), batches=window.batches)


def tune_pool(bench: Bench, *, costs: Costs, cluster: Dict[str, Any], drivers: int, budget: float,
              max_tasks: Optional[int]) -> RayTuning:
    """The warm-up (``warm_up``), then the search (``plan.next_pool``) over task counts within ``budget`` seconds of
    loading (neither the warm-up nor a trial's wait for its first batch counted: a worker starting is not the pool's
    rate), and its choice (``plan.choose``); when no trial measured a rate, the first candidate, ``source="fixed"``."""
    started = time.perf_counter()
    cpus = plan.task_cpus(cluster["cpus"], cpu_share=costs.cpu_share, drivers=drivers)
    cap = plan.pool_cap(cluster["cpus"], cpus=cpus, drivers=drivers, max_tasks=max_tasks)
    if cap < 1:
        raise ValueError(f"engine='ray': the Ray cluster has {cluster['cpus']:g} CPUs, not enough for one loading task "
                         f"per driver ({drivers}); add CPU nodes (ray start --address=... --num-cpus=N) or use "
                         f"engine='dataloader'")
    template = bench.template
    epoch = len(template)
    trials: List[RayTrial] = []
    rates: Dict[int, Optional[float]] = {}
    first = plan.first_pool(serial_s=costs.serial_s, step_s=costs.step_s, cap=cap)
    count: Optional[int] = first
    startup = warm_up(bench, RayConfig(cap, cpus=cpus, batches_per_task=1, prefetch=cap)) if budget > 0 else None
    spent = 0.0
    while count is not None and spent < budget:
        config = plan.config_for(count, cpus=cpus, serial_s=costs.serial_s, epoch_batches=epoch)
        began = time.perf_counter()
        trial = run_trial(bench, config, seconds=budget - spent, step_s=costs.step_s)
        spent += time.perf_counter() - began - (trial.first_batch_s or 0.0)  # its start-up is not the pool's
        log.info("ray trial %s: %s samples/s, first batch %s s%s", config.label(), trial.samples_per_s,
                 trial.first_batch_s, f" ({trial.reason})" if trial.reason else "")
        trials.append(trial)
        rates[count] = trial.samples_per_s
        count = plan.next_pool(rates, cap=cap)
    chosen = plan.choose(trials)
    size = template.batch_size or 1
    step_rate = size / costs.step_s if costs.step_s > 0 else None
    if chosen is None:
        config = plan.config_for(first, cpus=cpus, serial_s=costs.serial_s, epoch_batches=epoch)
        return RayTuning(config, None, "fixed", cluster, tuple(trials),
                         "no trial measured a rate: the first candidate, from one batch's cost and the step's",
                         time.perf_counter() - started, step_rate, costs.serial_s, startup)
    why = (f"fewest CPUs ({chosen.config.cluster_cpus:g} of {cluster['cpus']:g}) within 5% of the best measured "
           f"rate; block of {chosen.config.batches_per_task} batches for a first batch in "
           f"{chosen.first_batch_s or 0:.2f} s")
    return RayTuning(chosen.config, chosen.samples_per_s, "tuned", cluster, tuple(trials), why,
                     time.perf_counter() - started, step_rate, costs.serial_s, startup)
