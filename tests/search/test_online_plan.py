"""The order of an online search (search/online_plan.py, NOTE [ Online convergence ]) driven with fake measurements
from models of the data on an emulated host: no trial runs, no clock. Each model says what a configuration measures;
the search must start where a good rule would, jump rather than step, and decide in few candidates."""
import dataclasses
import math

import pytest

from autoloader.config import LoaderConfig
from autoloader.probe import probe_machine
from autoloader.request import Request
from autoloader.results import TrialResult
from autoloader.search import online_policy
from autoloader.search.online_plan import online_steps
from autoloader.search.search import Search
from workloads import LatencyBound


@dataclasses.dataclass
class Host:
    """Per batch: ``fetch_s`` of loading in one process (``cpu`` of it on a CPU), a step of ``step_s`` keeping
    ``step_cpus`` CPUs busy (a step on the CPU: beside workers that take its CPUs it slows by as much, and by
    ``contention`` more, an intra-op pool waiting on its slowest thread; its first ``warm_up`` batches take twice as
    long); ``cpus`` usable CPUs; a worker hands a batch over for ``handover_s`` of the main process; a service behind
    the data admits at most ``ceiling`` requests at once (the probe cannot see it)."""

    fetch_s: float
    cpu: float
    step_s: float
    cpus: int
    batch: int = 128
    handover_s: float = 0.0005
    ceiling: int = 1 << 30
    step_cpus: float = 0.0
    contention: float = 0.0
    warm_up: bool = False

    def measure(self, config: LoaderConfig, *, probe: bool = False, early: bool = False) -> TrialResult:
        n = config.num_workers
        step_cpu = self.step_s * self.step_cpus
        if n == 0:
            step = self.step_s * (2.0 if probe and self.warm_up else 1.0)
            per_batch = self.fetch_s + step
            fields = dict(fetch_s_per_batch=self.fetch_s, fetch_cpu_s_per_batch=self.fetch_s * self.cpu,
                          consumer_s_per_batch=None if early else step,
                          consumer_cpu_s_per_batch=None if early else step * self.step_cpus, steady=not probe)
            rate = None if early else self.batch / per_batch
            return TrialResult(config=config, samples_per_s=rate, batches=2 if probe else 30,
                               stall_fraction=self.fetch_s / per_batch, **fields)
        busy = min(n, self.cpus / self.cpu, self.ceiling)    # workers that find a CPU, and a slot of the service
        demand = self.step_cpus + busy * self.cpu
        slowed = max(1.0, demand / self.cpus) * (1.0 + (self.contention if demand > self.cpus else 0.0))
        step = self.step_s * (slowed if self.step_cpus else 1.0)
        production = busy / (self.fetch_s * (slowed if self.step_cpus else 1.0))  # batches per second
        consumer = 1.0 / (step + self.handover_s)
        rate = min(production, consumer)
        return TrialResult(config=config, samples_per_s=rate * self.batch, batches=30,
                           stall_fraction=max(0.0, 1.0 - rate / consumer), consumer_s_per_batch=step,
                           consumer_cpu_s_per_batch=step_cpu, worker_cpu_util=self.cpu * busy / n,
                           main_cpu_util=0.1 + self.step_cpus * step * rate)


def online_search(host: Host, *, start=None, serial=None, down=False, samples=100000, context=None):
    """The online search's generator on ``host``'s emulated CPUs, no memory budget, over epochs of ``samples``,
    its workers started by ``context`` (None: this process's default, fork here)."""
    request = Request.checked(LatencyBound(n=samples), host.batch, device="cpu",
                              dataloader_kwargs={"multiprocessing_context": context} if context else {})
    profile = probe_machine(disk=False, gpus=False)
    profile = dataclasses.replace(profile, cpu=dataclasses.replace(profile.cpu, usable=host.cpus),
                                  memory=dataclasses.replace(profile.memory, budget_bytes=None))
    return online_steps(Search(request, profile, budget=math.inf, start=start, descend=down), serial=serial)


def drive(host: Host, *, early: bool = False, start=None, serial=None, down=False, samples=100000, context=None):
    steps = online_search(host, start=start, serial=serial, down=down, samples=samples, context=context)
    asked, candidate = [], next(steps)
    try:
        while True:
            asked.append(candidate.config.num_workers)
            outcome = host.measure(candidate.config, probe=candidate.probe, early=early and candidate.probe)
            candidate = steps.send(outcome)
    except StopIteration as done:
        return asked, done.value


def test_cpu_bound_decoding_on_16_cores_starts_at_the_cores_rule_and_keeps_it():
    asked, result = drive(Host(fetch_s=0.33, cpu=1.0, step_s=0.02, cpus=16))
    assert asked == [0, 16], asked
    assert result.config.num_workers == 16


@pytest.mark.parametrize("cpus", [8, 64])
def test_many_cores_start_at_the_cores_rule_too(cpus):
    asked, result = drive(Host(fetch_s=0.33, cpu=1.0, step_s=0.001, cpus=cpus))
    assert asked[:2] == [0, cpus] and result.config.num_workers == cpus, asked


def test_an_early_start_knows_no_step_and_cuts_down_once_the_step_shows_slow():
    asked, result = drive(Host(fetch_s=0.33, cpu=1.0, step_s=0.1, cpus=16), early=True)
    assert asked == [0, 16, 4], "the cores rule first, then the fewest that meet a 100 ms step (1.2 x 3.3)"
    assert result.config.num_workers == 4


def test_data_in_memory_stays_serial_and_is_measured():
    asked, result = drive(Host(fetch_s=0.0005, cpu=1.0, step_s=0.002, cpus=16, batch=64))
    assert asked == [0, 0], "the probe, then serial measured on (the same run)"
    assert result.config.num_workers == 0
    chosen = [t for t in result.trials if t.config == result.config]
    assert result.samples_per_s == chosen[-1].samples_per_s and chosen[-1].steady, "the measurement, not the probe"


def test_waiting_data_jumps_to_what_meets_the_step():
    asked, result = drive(Host(fetch_s=0.064, cpu=0.05, step_s=0.005, cpus=2, batch=16))
    assert asked == [0, 16], "the probe timed the step: Little's law, 1.2 x 64 / 5 = 15.4, at once (CPUs allow 40)"
    assert result.config.num_workers == 16


@pytest.mark.parametrize("ceiling, step_s", [(16, 0.001), (6, 0.001), (24, 0.002)])
def test_a_hidden_concurrency_ceiling_is_found_by_measurement(ceiling, step_s):
    """Issue 59: waiting-bound data behind a service that admits K requests at once, short steps: the prior (what the
    CPUs allow) is far past K; the knee of the measured curve is found, and the fewest workers within the tolerance of
    its plateau decided, whatever the probe predicted."""
    asked, result = drive(Host(fetch_s=0.064, cpu=0.05, step_s=step_s, cpus=2, batch=16, ceiling=ceiling))
    assert asked[1] > ceiling, asked
    assert ceiling <= result.config.num_workers <= math.ceil(1.1 * ceiling), asked
    assert len(asked) <= 4, "the prior, the knee, the decision"


@pytest.mark.parametrize("samples, most", [(960, 2), (96_000, 64)])
def test_spawned_workers_start_only_as_many_as_a_quarter_of_a_serial_epoch_pays_for(samples, most):
    """Found under spawn (macOS's default) on Linux: 960 samples of 3 ms waiting, batch 8 (a 3 s epoch served
    serially): a prior of 30 spawned workers, each a fresh interpreter importing torch, took 32 s of the loop. Spawned,
    an online candidate starts no more workers than a quarter of a serial epoch pays for (a second of CPU each), and
    never fewer than two (one worker beside an empty step makes what serial serving does)."""
    host = Host(fetch_s=0.024, cpu=0.01, step_s=0.0001, cpus=2, batch=8)
    asked, _ = drive(host, samples=samples, context="spawn")
    assert max(asked) <= most, asked
    forked, _ = drive(host, samples=samples)
    assert max(forked) > most or most == 64, forked


def test_no_candidate_holds_most_of_a_short_epoch_in_flight():
    """A 100-batch epoch: 53 workers (what the CPUs allowed) would hold 106 batches in flight and serve the window from
    their queue; at most 16 (a third of the epoch at prefetch 2) are measured, and the knee of the service's 12 is
    found."""
    host = Host(fetch_s=0.246, cpu=0.004, step_s=0.0001, cpus=2, batch=34, ceiling=12)
    asked, result = drive(host, samples=3400, early=True)
    assert max(asked) <= 16, asked
    assert 12 <= result.config.num_workers <= 14, asked


@pytest.mark.parametrize("epoch_batches, prefetch, cap", [(100, 2, 16), (32, 2, 5), (10, 4, 1), (None, 2, None),
                                                        (100_000, 2, 16_666)])
def test_the_measurable_cap(epoch_batches, prefetch, cap):
    assert online_policy.measurable_cap(epoch_batches=epoch_batches, prefetch_factor=prefetch) == cap


@pytest.mark.parametrize("step_cpus, contention, expected", [
    (1.9, 0.5, 0), (1.9, 0.0, 0), (1.0, 0.0, 1), (0.0, 0.0, 1)])
def test_a_step_on_the_cpu_is_counted_against_the_workers_cpus(step_cpus, contention, expected):
    """Issue 59: a CNN trained on 2 CPUs (its step keeps 1.9 of them busy) over JPEG decoding ran 1.33x slower with the
    one worker chosen than with none: the step's CPUs are the workers' too. The prior fills only what the step leaves,
    and serial serving, warming up in the probe, is measured before workers are decided."""
    host = Host(fetch_s=0.06, cpu=1.0, step_s=0.2, cpus=2, batch=32, step_cpus=step_cpus, contention=contention,
                warm_up=True)
    asked, result = drive(host)
    assert asked[:2] == [0, 0 if step_cpus > 1.5 else 1], "beside a step holding the CPUs, no worker is worth trying"
    assert asked.count(0) >= 2, "serial serving measured, not only probed"
    assert result.config.num_workers == expected, [(t.config.num_workers, t.samples_per_s) for t in result.trials]


def test_a_re_tune_measures_the_configuration_in_force_first_and_only_goes_down_when_told():
    host = Host(fetch_s=0.33, cpu=1.0, step_s=0.1, cpus=16)
    serial = host.measure(LoaderConfig(0), probe=True)
    asked, result = drive(host, start=LoaderConfig(16, 2), serial=serial, down=True)
    assert asked == [16, 4] and result.config.num_workers == 4


def test_a_re_tune_measures_the_configuration_in_force_with_its_own_prefetch():
    """The first search chose a deeper prefetch (4); the re-tune's first candidate is that configuration, not its
    worker count at the default prefetch (a switch to a pool that is not the one in force, and a decision that
    dropped the deeper prefetch when it kept the count)."""
    host = Host(fetch_s=0.33, cpu=1.0, step_s=0.1, cpus=16)
    serial = host.measure(LoaderConfig(0), probe=True)
    start = LoaderConfig(16, prefetch_factor=4)
    steps = online_search(host, start=start, serial=serial, down=True)
    first = next(steps)
    assert first.config.same_candidate(start), first.config.label()
    second = steps.send(host.measure(first.config))
    assert second.config.num_workers == 4 and second.config.prefetch_factor == 4, second.config.label()


def test_a_prior_over_the_memory_budget_starts_at_the_most_that_fit(monkeypatch):
    host = Host(fetch_s=0.33, cpu=1.0, step_s=0.001, cpus=64)
    monkeypatch.setattr(Search, "guard", lambda self, config, per_worker: "memory: too many" if
                        config.num_workers > 21 else None)
    asked, result = drive(host)
    assert asked == [0, 21], "64 would not fit: the most that do, not a half (32) nor a quarter (16)"
    assert result.config.num_workers == 21, "no jump past what the budget admits"


@dataclasses.dataclass
class Budgeted(Host):
    """A host whose workers measure ``worker_mib`` each at their first batch, stopped there when ``workers x
    worker_mib`` passes ``budget_mib`` (``memory.first_batch_check``)."""

    worker_mib: int = 16
    budget_mib: int = 380

    def measure(self, config, *, probe=False, early=False):
        n, uss = config.num_workers, self.worker_mib * 2**20
        if n and n * self.worker_mib > self.budget_mib:
            return TrialResult(config=config, status="skipped", reason="memory: stopped at its first batch: ...",
                               worker_uss_bytes=uss, steady=False)
        measured = super().measure(config, probe=probe, early=early)
        return dataclasses.replace(measured, worker_uss_bytes=uss if n else None)


def test_the_prior_starts_as_the_pool_known_to_fit_and_grows_to_what_its_measured_workers_fit(monkeypatch):
    """Issue 59: waiting-bound 384 KiB samples under 380 MiB started a prior of 25-29 workers before any was measured
    and peaked at 1.36x the budget (stopped at their first batch, after the fact). At this process's private size
    (150 MiB here) 2 fit; they measure 16 MiB each, and the pool grows to the 23 that fit at that size."""
    host = Budgeted(fetch_s=0.07, cpu=0.07, step_s=0.0001, cpus=2, batch=16)

    def guard(self, config, per_worker):
        n = config.num_workers
        return "memory: too many" if per_worker is not None and n * per_worker > host.budget_mib * 2**20 else None

    monkeypatch.setattr(Search, "guard", guard)
    monkeypatch.setattr("autoloader.search.search.private_bytes", lambda: 150 * 2**20)
    asked, result = drive(host)
    assert asked[:3] == [0, 2, 23], asked
    assert not [t.config.num_workers for t in result.trials if t.status == "skipped"], "none over the budget"
    assert result.config.num_workers == 23


def test_a_jump_stopped_at_its_first_batch_for_memory_goes_to_the_most_its_measured_workers_fit(monkeypatch):
    """As the waiting-bound repro under 380 MiB did (7 workers, then 13 stopped, then 7 decided where 12 fit): 7
    workers measured 16 MiB each, a jump to 16 passed the check before it started (16 x 16 MiB), and its workers
    measured 20 MiB at their first batch (stopped); the search decided on 7. Now it measures the most that fit by
    what the 16 measured, 13."""
    @dataclasses.dataclass
    class Growing(Budgeted):
        def measure(self, config, *, probe=False, early=False):
            self.worker_mib = 16 if config.num_workers <= 7 else 20
            return super().measure(config, probe=probe, early=early)

    host = Growing(fetch_s=0.07, cpu=0.07, step_s=0.004, cpus=2, batch=16, budget_mib=260)

    def guard(self, config, per_worker):
        n = config.num_workers
        return "memory: too many" if per_worker is not None and n * per_worker > host.budget_mib * 2**20 else None

    monkeypatch.setattr(Search, "guard", guard)
    monkeypatch.setattr("autoloader.search.online_plan.online_policy.prior_workers", lambda **_: 7)
    monkeypatch.setattr("autoloader.search.search.private_bytes", lambda: 16 * 2**20)
    asked, result = drive(host)
    assert asked[:4] == [0, 7, 16, 13], asked
    assert [t.config.num_workers for t in result.trials if t.status == "skipped"] == [16]
    assert result.config.num_workers == 13


def test_a_jump_stops_at_what_the_memory_budget_admits(monkeypatch):
    host = Host(fetch_s=0.33, cpu=1.0, step_s=0.001, cpus=64)
    monkeypatch.setattr(Search, "guard", lambda self, config, per_worker: "memory: too many" if
                        config.num_workers > 24 else None)
    monkeypatch.setattr("autoloader.search.online_plan.online_policy.prior_workers", lambda **_: 16)
    asked, result = drive(host)
    assert asked == [0, 16, 24], "16 loading-bound on 64 CPUs jumps towards 54, and stops at 24, the most that fit"
