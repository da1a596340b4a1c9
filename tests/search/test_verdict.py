"""What a search reports of its choice (search/verdict.py): the bottleneck, the disk's ceiling, whether workers stay
alive between epochs, why it was chosen, and the ``TuneResult`` itself (chosen, or the fallback); tables of fake
trials, no trial runs here."""
import dataclasses

import pytest

from autoloader import AutoloaderWarning
from autoloader.config import LoaderConfig
from autoloader.probe._pools import NativePool
from autoloader.request import Request
from autoloader.results import TrialResult, TuneResult
from autoloader.search import verdict
from autoloader.search.bounds import worker_bounds
from autoloader.search.settings import Findings, Settings
from helpers import full_profile
from workloads import LatencyBound

MIB, GIB = 2**20, 2**30


def trial(n, rate, *, prefetch=2, status="ok", util=None, main=None, stall=None, fetch=None, cpu=None, pin=False):
    config = LoaderConfig(n, prefetch if n else None, pin, False)
    return TrialResult(config=config, status=status, samples_per_s=rate if status == "ok" else None,
                       worker_cpu_util=util, main_cpu_util=main, stall_fraction=stall,
                       fetch_s_per_batch=fetch, fetch_cpu_s_per_batch=cpu)


def pooled(n, rate, *, found, kept=None, limit=None):
    """A worker trial whose workers reported their BLAS pool: ``found`` threads, ``kept`` under ``limit``."""
    pool = NativePool("libscipy_openblas", "blas", "openblas", found,
                      None if limit is None else (kept if kept is not None else min(found, limit)))
    return dataclasses.replace(trial(n, rate), config=LoaderConfig(n, 2, False, False, native_threads=limit),
                               native_pools=(pool,))


def test_keep_workers_alive():
    assert verdict.keep_workers_alive(0, per_worker_bytes=None, budget_bytes=None) is False
    assert verdict.keep_workers_alive(4, per_worker_bytes=None, budget_bytes=None) is True
    assert verdict.keep_workers_alive(4, per_worker_bytes=2**30, budget_bytes=16 * 2**30) is True
    assert verdict.keep_workers_alive(16, per_worker_bytes=2**30, budget_bytes=16 * 2**30) is False


@pytest.mark.parametrize("chosen, others, consumer, memory_limited, expected", [
    (trial(4, 990, stall=0.02, util=0.3), [], 1000.0, False, "consumer"),
    (trial(0, 10000, fetch=0.001, cpu=0.001), [trial(2, 900)], None, False, "ipc"),
    (trial(0, 100, fetch=0.1, cpu=0.1), [], None, False, "cpu"),
    (trial(0, 100, fetch=0.1, cpu=0.005), [], None, False, "io"),
    (trial(2, 170, util=0.9, main=0.2, stall=0.5), [], None, False, "cpu"),
    (trial(32, 1500, util=0.02, main=0.3, stall=0.6), [], None, False, "io"),
    (trial(4, 3000, util=0.1, main=0.95, stall=0.6), [], None, False, "ipc"),
    (trial(8, 1500, util=0.02, main=0.3, stall=0.6), [], None, True, "memory"),
    # serial loading ran native threads (CPU 1.8x its wall time) and workers were slower:
    (trial(0, 200, fetch=0.05, cpu=0.09), [trial(2, 120)], None, False, "oversubscription"),  # their pools unknown
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(2, 120, found=2)], None, False, "oversubscription"),  # 2 x 2 > 2
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(2, 120, found=2, limit=1)], None, False, "cpu"),  # held to 1
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(4, 120, found=2, limit=1)], None, False, "cpu"),  # 4 x 1 thread
    (trial(0, 200, fetch=0.05, cpu=0.09), [pooled(2, 120, found=8, kept=4, limit=1)], None, False,
     "oversubscription"),                                                                        # a pool kept 4
    (trial(0, 200, fetch=0.05, cpu=0.05), [trial(2, 120)], None, False, "ipc"),  # one thread: the transfer lost
])
def test_bottleneck(chosen, others, consumer, memory_limited, expected):
    assert verdict.bottleneck(chosen, [chosen, *others], consumer_samples_per_s=consumer, usable_cpus=2,
                             memory_limited=memory_limited) == expected


def test_bottleneck_is_the_consumer_when_it_is_busy_most_of_the_window():
    # every count gave ~82 % of the step's own rate (the rest is hand-over overhead): the step still dominates
    busy = TrialResult(config=LoaderConfig(2, 2), samples_per_s=330, batches=40, window_s=2.0,
                       consumer_s_per_batch=0.04, stall_fraction=0.2, worker_cpu_util=0.3, main_cpu_util=0.3)
    assert verdict.bottleneck(busy, [busy], consumer_samples_per_s=400, usable_cpus=2, memory_limited=False) \
        == "consumer"
    idle = TrialResult(config=LoaderConfig(2, 2), samples_per_s=330, batches=40, window_s=2.0,
                       consumer_s_per_batch=0.01, stall_fraction=0.7, worker_cpu_util=0.95, main_cpu_util=0.2)
    assert verdict.bottleneck(idle, [idle], consumer_samples_per_s=1600, usable_cpus=2, memory_limited=False) == "cpu"


def test_a_step_that_keeps_the_cpus_busy_itself_is_named_consumer_cpu():
    """Issue 59: a CNN trained on 2 CPUs keeps 1.9 of them busy; workers only took them from it."""
    def cpu_step(n, rate, cpu_s):
        return TrialResult(config=LoaderConfig(n, 2) if n else LoaderConfig(0), samples_per_s=rate, batches=40,
                           window_s=40 * 32 / rate, consumer_s_per_batch=0.2, consumer_cpu_s_per_batch=cpu_s,
                           stall_fraction=0.05, fetch_s_per_batch=0.01, fetch_cpu_s_per_batch=0.01)
    serial, one = cpu_step(0, 123.0, 0.38), cpu_step(1, 110.0, 0.38)
    assert verdict.bottleneck(serial, [serial, one], consumer_samples_per_s=150, usable_cpus=2,
                              memory_limited=False) == "consumer-cpu"
    assert verdict.bottleneck(one, [one], consumer_samples_per_s=115, usable_cpus=2, memory_limited=False) \
        == "consumer-cpu"
    light = cpu_step(1, 110.0, 0.02)  # a GPU step's host work: a tenth of a CPU
    assert verdict.bottleneck(light, [light], consumer_samples_per_s=115, usable_cpus=2, memory_limited=False) \
        == "consumer"
    assert "consumer (cpu)" in str(TuneResult(LoaderConfig(0), 123.0, "consumer-cpu", "tuned"))


def test_disk_ceiling():
    # 500 MB/s and 100 KB read per sample: 5,000 samples/s
    assert verdict.disk_ceiling(read_bytes_per_sample=100e3, seq_read_mb_s=500.0) == pytest.approx(5000.0)
    assert verdict.disk_ceiling(read_bytes_per_sample=0.0, seq_read_mb_s=500.0) is None
    assert verdict.disk_ceiling(read_bytes_per_sample=100e3, seq_read_mb_s=None) is None


@pytest.mark.parametrize("n, per_worker, budget, lasting, expected, why", [
    (4, 12 * MIB, 700 * MIB, 800 * MIB, False, "copy-on-read would take them past the budget in time"),
    (4, 12 * MIB, GIB, 800 * MIB, True, "... under a budget that holds them"),
    (4, None, 700 * MIB, 800 * MIB, False, "the lasting footprint decides even before a worker was sized"),
    (4, 12 * MIB, None, 800 * MIB, True, "no budget: nothing to be past"),
])
def test_workers_that_last_past_the_budget_are_not_kept_alive(n, per_worker, budget, lasting, expected, why):
    assert verdict.keep_workers_alive(n, per_worker_bytes=per_worker, budget_bytes=budget,
                                      lasting_bytes=lasting) is expected, why


SERIAL_NATIVE = trial(0, 200, fetch=0.05, cpu=0.09)  # CPU 1.8x its wall time: native threads


@pytest.mark.parametrize("serial, with_workers, usable, expected, why", [
    (trial(0, 200, fetch=0.05, cpu=0.05), [trial(2, 120)], 2, False, "serial ran one thread: no pool to blame"),
    (SERIAL_NATIVE, [trial(2, 120)], 2, True, "its workers' pools unknown (no threadpoolctl)"),
    (SERIAL_NATIVE, [pooled(2, 120, found=4, limit=1)], 2, False, "held to one thread each"),
    (SERIAL_NATIVE, [pooled(2, 120, found=4, kept=2, limit=1)], 8, True, "a limit not held, CPUs to spare or not"),
    (SERIAL_NATIVE, [pooled(2, 120, found=2)], 2, True, "2 workers x 2 threads on 2 CPUs"),
    (SERIAL_NATIVE, [pooled(2, 120, found=2)], 4, False, "2 x 2 threads fit 4 CPUs"),
    (SERIAL_NATIVE, [pooled(8, 120, found=1)], 2, False, "single-threaded workers beyond the CPUs: not the pools"),
    (SERIAL_NATIVE, [], 2, False, "no configuration with workers: nothing lost to them"),
])
def test_oversubscribed(serial, with_workers, usable, expected, why):
    assert verdict.oversubscribed(serial, with_workers, usable_cpus=usable) is expected, why


@pytest.mark.parametrize("trials, threads, cap_reason, expected, why", [
    ([trial(0, 100), trial(4, 1000)], False, "",
     "fewest workers within 5% of the best measured rate (1,000 samples/s) in 2 trials", "the rule and the best"),
    ([trial(4, 1000), trial(8, None, status="failed")], True, "",
     "fewest workers, then threads per process, within 5% of the best measured rate (1,000 samples/s) in 2 trials",
     "threads=True adds the second key; a failed trial counts as a trial, not as a rate"),
    ([trial(4, 1000)], False, "at most 4 workers: the dataset reads 4 shards",
     "fewest workers within 5% of the best measured rate (1,000 samples/s) in 1 trials; at most 4 workers: the "
     "dataset reads 4 shards", "the cap's reason follows"),
])
def test_why_chosen(trials, threads, cap_reason, expected, why):
    assert verdict.why_chosen(trials[-1] if trials[-1].ok else trials[0], trials, tolerance=0.05, threads=threads,
                              cap_reason=cap_reason) == expected, why


def test_why_chosen_says_what_was_decided_of_the_native_limit():
    limited, unlimited = pooled(4, 1000, found=8, limit=1), pooled(4, 700, found=8)
    words = verdict.why_chosen(limited, [limited, unlimited], tolerance=0.05, threads=False, cap_reason="")
    assert words.endswith("; native pools limited to 1 thread(s) per worker: measured at least as fast as without "
                          "(within 5%)")


def settings(**kwargs) -> Settings:
    request = Request.checked(LatencyBound(n=1000), 32, device="cpu", **kwargs)
    bounds = worker_bounds(full_profile(), max_workers=request.max_workers, dataset=request.dataset)
    return Settings.of(request, full_profile(), bounds=bounds, budget=12.0, trial_limit=2.4, tolerance=0.05,
                       start=None, descend=False)


def found(*trials, per_worker=None) -> Findings:
    return Findings(trials=list(trials), per_worker_bytes=per_worker)


def measured(n, rate, *, uss=50 * MIB, util=0.9, read=None):
    return dataclasses.replace(trial(n, rate, util=util, main=0.5 if n else None, stall=0.5),
                               worker_uss_bytes=uss if n else None, read_bytes_per_batch=read)


def skipped(n):
    return TrialResult(config=LoaderConfig(n, 2), status="skipped", reason=f"memory: {n} workers need ...")


@pytest.mark.parametrize("kwargs, per_worker, expected, why", [
    ({"memory_budget": GIB}, 50 * MIB, True, "4 x 50 MiB: under half the budget"),
    ({"memory_budget": 300 * MIB}, 50 * MIB, False, "4 x 50 MiB: over half of 300 MiB between epochs"),
    ({"memory_budget": 300 * MIB, "dataloader_kwargs": {"persistent_workers": True}}, 50 * MIB, True,
     "the user's persistent_workers stands"),
])
def test_conclude_decides_persistent_workers(kwargs, per_worker, expected, why):
    chosen = measured(4, 400.0)
    result = verdict.conclude(chosen, settings(**kwargs), found(measured(0, 100.0), chosen, per_worker=per_worker),
                              consumer_rate=None, seconds=3.0, refits=lambda t: False)
    assert result.config.persistent_workers is expected, why
    assert (result.num_workers, result.samples_per_s, result.source, result.seconds) == (4, 400.0, "tuned", 3.0)
    assert result.reason.startswith("fewest workers within 5%") and len(result.trials) == 2


@pytest.mark.parametrize("refits, expected, why", [
    (False, "memory", "8 workers were skipped for memory and still would not fit: memory bounds the choice"),
    (True, "cpu", "8 would fit now that a worker was measured: no longer a ceiling"),
])
def test_conclude_names_memory_only_for_counts_that_still_do_not_fit(refits, expected, why):
    chosen = measured(4, 400.0)
    result = verdict.conclude(chosen, settings(memory_budget=GIB), found(chosen, skipped(8)), consumer_rate=None,
                              seconds=1.0, refits=lambda t: refits)
    assert result.bottleneck == expected, why


def test_conclude_reports_the_disk_ceiling_when_io_bound():
    chosen = measured(8, 500.0, util=0.1, read=32 * 100_000)  # idle workers reading 100 KB a sample
    result = verdict.conclude(chosen, settings(), found(chosen), consumer_rate=None, seconds=1.0,
                              refits=lambda t: False)
    assert result.bottleneck == "io"
    assert result.disk_ceiling_samples_per_s == pytest.approx(640e6 / 100_000), "the saved profile's 640 MB/s"
    assert result.read_bytes_per_sample == pytest.approx(100_000)


def test_conclude_warns_when_every_worker_count_failed():
    serial, failed = measured(0, 100.0), dataclasses.replace(trial(2, None, status="failed"), reason="boom")
    with pytest.warns(AutoloaderWarning, match=r"every worker count failed \(boom\); using num_workers=0"):
        result = verdict.conclude(serial, settings(), found(serial, failed), consumer_rate=None, seconds=1.0,
                                  refits=lambda t: False)
    assert result.num_workers == 0 and not result.config.persistent_workers


def test_unmeasured_falls_back_and_names_why():
    trials = [dataclasses.replace(trial(0, None, status="failed"), reason="boom"), skipped(4)]
    with pytest.warns(AutoloaderWarning, match=r"could not measure any configuration \(boom; memory: 4 workers"):
        result = verdict.unmeasured(settings(memory_budget=GIB), trials, consumer_rate=50.0, seconds=2.0,
                                    native_threads=None)
    assert result.num_workers == 0 and result.trials == tuple(trials)
    assert (result.consumer_samples_per_s, result.seconds, result.memory_budget_bytes) == (50.0, 2.0, GIB)
    assert "set by the user" in result.memory_budget_from


def test_unmeasured_keeps_the_users_workers():
    with pytest.warns(AutoloaderWarning, match="no trial ran"):
        result = verdict.unmeasured(settings(dataloader_kwargs={"num_workers": 3}), [], consumer_rate=None,
                                    seconds=0.0, native_threads=1)
    assert result.num_workers == 3 and result.config.native_threads == 1
