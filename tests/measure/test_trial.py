"""run_trial: the steady-state window, what it measures, and that the user's state is untouched."""
import time

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler

from autoloader.config import LoaderConfig
from autoloader.consumer import Consumer
from autoloader.measure.trial import _Cycle, run_trial, trial_loader
from autoloader.measure.window import MIN_WINDOW_S
from autoloader.request import Request
from autoloader.search.memory import MemoryCheck
from helpers import wait_no_children
from workloads import CpuBound, InMemory, LatencyBound

CPU = Consumer(None, torch.device("cpu"))


def _trial(dataset, batch_size, config, *, consumer=CPU, limit_s=3.0, shuffle=False, measure_consumer=False,
           **dataloader_kwargs):
    request = Request.checked(dataset, batch_size, shuffle=shuffle, dataloader_kwargs=dataloader_kwargs)
    return run_trial(request, config, consumer=consumer, limit_s=limit_s, measure_consumer=measure_consumer)


def test_cycle_repeats_forever_and_stops_on_an_empty_base():
    it = iter(_Cycle([1, 2, 3]))
    assert [next(it) for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    assert list(_Cycle([])) == []


def test_trial_loader_keeps_user_arguments_and_never_ends(tmp_path):
    def collate(samples):
        return torch.stack(samples)

    data = InMemory(n=10)
    request = Request.checked(data, 4, dataloader_kwargs={"collate_fn": collate, "sampler": SequentialSampler(data)})
    loader = trial_loader(request, LoaderConfig(0), limit_s=1)
    assert isinstance(loader, DataLoader) and loader.collate_fn is collate
    it = iter(loader)
    batches = [next(it) for _ in range(6)]  # 60 samples from a dataset of 10
    assert torch.equal(batches[0], data.data[:4])


def test_serial_trial_measures_the_steady_state():
    data = CpuBound(cost_s=0.001)
    started = time.perf_counter()
    for i in range(64):  # the same work in a plain loop, side by side: what a steady rate must come close to
        data[i]
    plain_rate = 64 / (time.perf_counter() - started)
    result = _trial(data, 8, LoaderConfig(0), limit_s=3)
    assert result.ok and result.steady and result.config.num_workers == 0
    assert result.batches >= 6 and result.window_s >= MIN_WINDOW_S
    assert 0.5 * plain_rate < result.samples_per_s < 2 * plain_rate, (result.samples_per_s, plain_rate)
    assert result.stall_fraction > 0.8, "nothing else happens but loading"
    assert result.batch_bytes == 8 * 16 * 4 and result.startup_s is not None
    assert result.worker_cpu_util is None
    waiting = _trial(LatencyBound(latency_s=0.001), 8, LoaderConfig(0), limit_s=3)

    def cpu_share(trial):
        return trial.fetch_cpu_s_per_batch / trial.fetch_s_per_batch

    assert cpu_share(result) > 4 * cpu_share(waiting), "a CPU-bound fetch uses the CPU, a waiting one does not"


def test_worker_trial_measures_workers():
    result = _trial(LatencyBound(latency_s=0.002), 8, LoaderConfig(2, 2), limit_s=4)
    assert result.ok and result.config.num_workers == 2
    assert result.worker_cpu_util is not None and result.worker_cpu_util < 0.5, "sleeping workers are idle"
    assert result.worker_rss_bytes and result.worker_uss_bytes
    # each worker waits ~16 ms per batch: two can never exceed ~1000 samples/s, and they overlap their waits
    serial = _trial(LatencyBound(latency_s=0.002), 8, LoaderConfig(0), limit_s=4)
    assert 1.3 * serial.samples_per_s < result.samples_per_s < 1500, (result.samples_per_s, serial.samples_per_s)


def test_slow_consumer_is_measured_and_the_step_dominates():
    result = _trial(InMemory(n=512), 16, LoaderConfig(0), consumer=Consumer(0.02, torch.device("cpu")), limit_s=3,
                    measure_consumer=True)
    assert result.consumer_s_per_batch == pytest.approx(0.02, rel=0.5)
    assert result.stall_fraction < 0.3
    assert result.samples_per_s < 16 / 0.02 * 1.1


def test_user_generator_state_is_untouched():
    generator = torch.Generator().manual_seed(11)
    before = generator.get_state().clone()
    _trial(InMemory(n=256), 8, LoaderConfig(1, 2), shuffle=True, limit_s=2, generator=generator)
    assert torch.equal(generator.get_state(), before)


def test_step_exception_surfaces_unchanged():
    class StepFailed(Exception):
        pass

    def step(batch):
        raise StepFailed("loss is nan")

    with pytest.raises(StepFailed, match="loss is nan"):
        _trial(InMemory(n=64), 8, LoaderConfig(2, 2), consumer=Consumer(step, torch.device("cpu")), limit_s=2)


def test_a_trial_over_the_memory_budget_stops_at_its_first_batch():
    """NOTE [ Memory budget ]: a forked candidate admitted before its workers were measured stops at its first batch
    when their measured footprint is over the budget: skipped, with the figures, its workers reaped at once."""
    request = Request.checked(LatencyBound(n=1000, latency_s=0.001), 8)
    started = time.perf_counter()
    result = run_trial(request, LoaderConfig(2, 2), consumer=CPU, limit_s=3.0,
                       memory=MemoryCheck(budget_bytes=2**20))
    assert result.status == "skipped" and result.reason.startswith("memory: stopped at its first batch"), result
    assert "2 workers of" in result.reason and "memory budget of 1.0 MiB" in result.reason
    assert result.worker_uss_bytes > 0 and result.startup_s is not None and result.batches == 0
    assert time.perf_counter() - started < 2.5, "stopped at once, not at its limit"
    assert wait_no_children() == []
    fits = run_trial(request, LoaderConfig(2, 2), consumer=CPU, limit_s=3.0, memory=MemoryCheck(budget_bytes=2**40))
    assert fits.ok and fits.worker_uss_bytes is not None


def _burn(_batch) -> None:
    started = time.thread_time()
    while time.thread_time() - started < 0.01:
        pass


def test_a_step_on_the_cpu_is_measured_as_cpu_the_step_takes():
    """Issue 59: the step's own CPU time (``consumer_cpu_s_per_batch``) beside its wall time: a step that burns 10 ms of
    one thread keeps about one CPU busy; one that sleeps keeps none (generous margins: a loaded machine)."""
    request = Request.checked(InMemory(n=2000), 16, device="cpu")
    burning = run_trial(request, LoaderConfig(0), consumer=Consumer(_burn, torch.device("cpu")), limit_s=10.0,
                        measure_consumer=True)
    assert burning.ok and burning.consumer_cpu_s_per_batch is not None
    assert 0.008 <= burning.consumer_cpu_s_per_batch <= 0.05, burning  # 10 ms of CPU, whatever the wall time
    sleeping = run_trial(request, LoaderConfig(0), consumer=Consumer(0.01, torch.device("cpu")), limit_s=10.0)
    assert sleeping.ok and sleeping.consumer_cpu_s_per_batch < 0.3 * sleeping.consumer_s_per_batch, sleeping
    assert sleeping.other_cpus is None or sleeping.other_cpus >= 0.0


class _Objects(torch.utils.data.Dataset):
    """Samples read from a list of 100,000 Python objects at random (a page of them copied per sample: copy-on-read)."""

    def __init__(self):
        self.items = [bytes([i % 251]) * 512 for i in range(100_000)]

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.tensor([len(self.items[(i * 7919) % 100_000])])


def test_a_trial_under_a_memory_budget_reads_which_pages_its_workers_copy():
    """The census (measure/cow.py) at the first batch and at the window's end: a trial of workers reading a list of
    objects under a budget they could not fit copying all of this process reports what one worker copied and the span
    it fell in (NOTE [ Copy-on-read forecast ]); the window that drops that second reading forecasts nothing."""
    request = Request.checked(_Objects(), 16, device="cpu")
    trial = run_trial(request, LoaderConfig(2, 2), consumer=Consumer(None, torch.device("cpu")), limit_s=10.0,
                      memory=MemoryCheck(1 << 40, census=True))
    assert trial.ok, trial.reason
    assert trial.worker_copied_bytes is not None and trial.worker_copy_span_bytes is not None, trial
    assert trial.worker_copied_bytes > 0 and trial.worker_shared_bytes > trial.worker_copy_span_bytes > 0, trial
