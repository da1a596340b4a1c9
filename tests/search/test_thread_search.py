"""``threads=`` end to end: the (processes, threads) search on real small datasets, fixed threads, the cache, online
tuning, and the arguments. Margins are generous and relative (rates measured side by side in one run), never absolute
throughput: the machine is shared. The search's choices themselves are tested on tables in test_threads_policy.py."""
from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader import make_loader, tune
from autoloader.probe import DiskInfo, probe_machine, save_profile
from autoloader.results.tune_result import format_tune_result
from autoloader.config import LoaderConfig
from autoloader.results import TrialResult, TuneResult
from autoloader.loader.threads import ThreadedDataset, threads_of, unwrap
from autoloader.search.thread_bounds import THREADS_FIRST_PROCESSES_PER_CPU
from autoloader.search.threads_policy import THREADS_FIRST_TRIALS, WAITING_BUSY, busy_fraction
from online_data import Indexed
from thread_data import Stream
from workloads import GilBound, LatencyBound

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning")

USABLE = len(os.sched_getaffinity(0))


def process_only(result):
    return [t for t in result.trials if t.ok and t.config.threads == 1]


@pytest.mark.slow
def test_waiting_samples_get_threads_first_in_few_processes_at_the_process_only_rate():
    # 4 ms of waiting per sample, no CPU: threads first (issue 23), right after the serial trial; a process-only
    # search on the same data climbs to many workers, each mostly asleep
    data = LatencyBound(latency_s=0.004)
    result = tune(data, 32, budget=16, max_workers=16, threads=True)
    first_threads = next(i for i, t in enumerate(result.trials) if t.config.threads > 1)
    assert [t.config.num_workers for t in result.trials[:first_threads]] == [0], "no process-only climb first"
    assert result.threads > 1 and 1 <= result.num_workers <= THREADS_FIRST_PROCESSES_PER_CPU * USABLE, result
    threaded = [t for t in result.trials if t.config.threads > 1]
    assert 1 <= len(threaded) <= THREADS_FIRST_TRIALS, "a few thread candidates, not a sweep"
    controls = [t for t in result.trials if t.ok and t.config.threads == 1 and t.config.num_workers ==
                result.num_workers]
    assert controls and result.samples_per_s > max(t.samples_per_s for t in controls), "checked beside its control"
    processes = tune(data, 32, budget=16, max_workers=16)
    best = max(process_only(processes), key=lambda t: t.samples_per_s)
    assert best.config.num_workers >= 8, "the process-only search needs many waiting workers"
    assert result.samples_per_s >= 0.8 * best.samples_per_s, (result, processes)
    chosen = next(t for t in result.trials if t.ok and (t.config.num_workers, t.config.threads) ==
                  (result.num_workers, result.threads) and t.config.prefetch_factor == result.prefetch_factor)
    if chosen.worker_memory_bytes is not None and best.worker_memory_bytes is not None:
        assert chosen.worker_memory_bytes < best.worker_memory_bytes, "fewer processes hold less memory"
    assert "threads" in str(result) and "worker MiB" in str(result)


def test_a_gil_bound_transform_keeps_one_thread():
    # a Python loop per sample holds the GIL: threads of one process cannot run it in parallel. Whether threads are
    # tried first depends on the serial trial getting its CPU (on a busy machine it waits for one, and cannot tell
    # that from waiting for data); either way threads are kept only as measured: faster than their one-thread
    # control beside them and within the tolerance of every process-only candidate. Timing decides which branch
    # runs, never whether the test passes (on this machine, quiet, it keeps one thread).
    result = tune(GilBound(cost_s=0.001), 16, budget=8, max_workers=4, threads=True)
    serial = result.trials[0]
    assert serial.config.num_workers == 0 and serial.ok, result
    busy = busy_fraction(serial)
    if busy is None or busy < WAITING_BUSY:
        assert result.trials[1].config.threads > 1, "threads first"
    if result.threads > 1:
        controls = [t for t in result.trials if t.ok and t.config.threads == 1 and t.config.num_workers > 0]
        same = [t for t in controls if t.config.num_workers == result.num_workers]
        assert same and result.samples_per_s > max(t.samples_per_s for t in same), result
        assert result.samples_per_s >= 0.95 * max(t.samples_per_s for t in controls), result


def test_fixed_threads_are_used_by_every_trial_and_the_loader():
    result = tune(LatencyBound(latency_s=0.002), 16, budget=4, max_workers=4, threads=4)
    assert result.trials and {t.config.threads for t in result.trials} == {4}
    assert result.threads == 4


def test_cache_round_trip_keeps_the_threads(cache_dir):
    data = LatencyBound(n=4000, latency_s=0.002)
    first = make_loader(data, 16, tuning="trials", budget=6, max_workers=4, threads=True)
    assert first.tuning.source == "tuned"
    assert threads_of(first.dataset) == first.tuning.threads and unwrap(first.dataset) is data
    again = make_loader(data, 16, tuning="trials", budget=6, max_workers=4, threads=True)
    assert again.tuning.source == "cache" and again.tuning.config == first.tuning.config
    assert threads_of(again.dataset) == first.tuning.threads
    main = make_loader(data, 16, tuning="trials", budget=3, max_workers=0, threads=3)
    assert isinstance(main.dataset, ThreadedDataset) and main.tuning.threads == 3 and main.tuning.num_workers == 0
    assert next(iter(main)).shape == (16, 16)
    plain = make_loader(data, 16, tuning="trials", budget=3, max_workers=0)
    assert plain.cache_key != main.cache_key, "threads are part of the cache key"
    assert plain.dataset is data and plain.tuning.threads == 1
    del first, again, main, plain


def test_online_tuning_with_threads_serves_exact_epochs():
    data = Indexed(1203, latency_s=0.001)
    kwargs = dict(shuffle=True, generator=torch.Generator().manual_seed(5))
    loader = make_loader(data, 10, cache=False, tuning="online", max_workers=2, threads=True, **kwargs)
    online = []
    while not loader.decisions:
        assert len(online) < 8, "no decision after 8 epochs"
        online.append([b.view(-1).tolist() for b in loader])
    online.append([b.view(-1).tolist() for b in loader])
    data.latency_s = 0.0  # the same samples, at once
    kwargs = dict(shuffle=True, generator=torch.Generator().manual_seed(5))
    plain = DataLoader(data, 10, **kwargs)
    assert online == [[b.view(-1).tolist() for b in plain] for _ in online]
    assert threads_of(loader.dataset) == loader.tuning.threads
    assert any(t.config.threads > 1 for t in loader.tuning.trials), "1 ms of waiting per sample: threads were tried"
    del loader


@pytest.mark.parametrize("threads, error, words", [
    ("yes", TypeError, "threads must be False"),
    (2.5, TypeError, "threads must be False"),
    (0, ValueError, "threads=0 must be >= 1"),
    (-3, ValueError, "must be >= 1"),
])
def test_threads_argument_is_checked(threads, error, words):
    with pytest.raises(error, match=words):
        make_loader(Indexed(10), 2, cache=False, threads=threads)
    with pytest.raises(error, match=words):
        tune(Indexed(10), 2, threads=threads)


@pytest.mark.parametrize("threads", [True, 4])
def test_an_iterable_dataset_with_threads_is_refused(threads):
    for call in (make_loader, tune):
        with pytest.raises(ValueError, match="IterableDataset.*threads=False"):
            call(Stream(), 2, threads=threads)


def test_a_threaded_dataset_with_threads_is_refused():
    with pytest.raises(ValueError, match="already a ThreadedDataset"):
        make_loader(ThreadedDataset(Indexed(10), threads=2), 2, cache=False, threads=True)


def test_a_thread_candidate_that_raises_is_a_failed_trial_with_a_warning():
    data = NotThreadSafe(2000)
    with pytest.warns(UserWarning, match="thread-safe"):
        result = tune(data, 16, budget=8, max_workers=2, threads=True)
    assert result.threads == 1
    failed = [t for t in result.trials if t.status == "failed"]
    assert failed and all(t.config.threads > 1 and "thread-safe" in t.reason for t in failed)


def test_with_fixed_threads_the_error_surfaces_unchanged_with_a_hint():
    with pytest.raises(RuntimeError, match="two threads at once"), pytest.warns(UserWarning, match="thread-safe"):
        tune(NotThreadSafe(2000), 16, budget=4, max_workers=0, threads=4)


class NotThreadSafe(LatencyBound):
    """Waits 2 ms per sample, and raises when two threads of one process read at once (a shared file handle)."""

    def __init__(self, n: int) -> None:
        super().__init__(n, latency_s=0.002)
        self.busy = False

    def __getitem__(self, i):
        if self.busy:
            raise RuntimeError("two threads at once on one file handle")
        self.busy = True
        try:
            return super().__getitem__(i)
        finally:
            self.busy = False


class FileSamples(Dataset):
    """Each sample reads one 64 KiB file and waits 3 ms (a slow disk's latency): loading is I/O-bound."""

    SIZE = 64 << 10

    def __init__(self, directory, files: int = 8) -> None:
        self.paths = []
        for i in range(files):
            path = os.path.join(directory, f"sample{i}.bin")
            with open(path, "wb") as fh:
                fh.write(os.urandom(self.SIZE))
            self.paths.append(path)

    def __len__(self) -> int:
        return 100000

    def __getitem__(self, i):
        with open(self.paths[i % len(self.paths)], "rb") as fh:
            data = fh.read()
        time.sleep(0.003)
        return torch.tensor([len(data)])


def test_an_io_bound_result_reports_the_disk_ceiling_from_the_saved_profile(cache_dir, tmp_path):
    # the saved profile (autotune probe) says the disk reads 40 MB/s; tuning never measures the disk itself
    save_profile(dataclasses.replace(probe_machine(disk=False, gpus=False),
                                     disk=DiskInfo(str(tmp_path), 40.0, 1000.0, 4000.0, "o_direct")))
    result = tune(FileSamples(tmp_path), 16, budget=5, max_workers=2)
    assert result.bottleneck == "io" and result.num_workers > 0, result
    assert result.read_bytes_per_sample == pytest.approx(FileSamples.SIZE, rel=0.3)
    assert result.disk_ceiling_samples_per_s == pytest.approx(40e6 / result.read_bytes_per_sample)
    assert "the disk allows ~" in str(result) and "KiB read per sample" in str(result)
    assert TuneResult.from_dict(result.to_dict()) == result


def test_the_trial_table_shows_threads_worker_memory_and_the_disk_ceiling():
    def row(n, threads, rate, mib):
        return TrialResult(config=LoaderConfig(n, 2 if n else None, False, False, threads), samples_per_s=rate,
                           worker_cpu_util=0.1 if n else None, worker_uss_total_bytes=mib << 20)

    trials = (row(0, 1, 200.0, 0), row(64, 1, 10000.0, 465), row(2, 32, 11000.0, 20))
    result = TuneResult(LoaderConfig(2, 2, False, True, threads=32), 11000.0, "io", "tuned", trials,
                        disk_ceiling_samples_per_s=12000.0, read_bytes_per_sample=4096.0)
    text = format_tune_result(result)
    header = next(line for line in text.splitlines() if "vs best" in line)
    assert "threads" in header and "worker MiB" in header
    chosen = next(line for line in text.splitlines() if line.lstrip().startswith("*"))
    assert chosen.split()[1:3] == ["2", "32"] and " 20 " in chosen
    assert "threads=32 per process" in text
    assert "the disk allows ~12,000 samples/s at the measured 4.0 KiB read per sample: the storage, not the " \
           "configuration, is the limit" in text
    plain = dataclasses.replace(result, trials=trials[:2], config=LoaderConfig(64, 2, False, True),
                                samples_per_s=10000.0, disk_ceiling_samples_per_s=None)
    assert "threads" not in next(line for line in str(plain).splitlines() if "vs best" in line)



def test_the_plot_draws_thread_configurations_apart(tmp_path):
    pytest.importorskip("matplotlib")
    from autoloader.cli.plot import plot_tune_result

    trials = tuple(TrialResult(config=LoaderConfig(n, 2 if n else None, False, False, t), samples_per_s=r)
                   for n, t, r in ((0, 1, 200.0), (8, 1, 1900.0), (64, 1, 10000.0), (2, 32, 11000.0), (2, 1, 450.0),
                                   (2, 16, 6800.0)))
    result = TuneResult(LoaderConfig(2, 2, False, True, threads=32), 11000.0, "io", "tuned", trials)
    path = plot_tune_result(result, tmp_path / "threads.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
