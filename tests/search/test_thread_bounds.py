"""How far a thread search may go (search/thread_bounds.py) on tables: the most threads per process, the processes
thread candidates may use after the process-only search and threads first, and the process-only reference."""
import pytest

from autoloader.config import LoaderConfig
from autoloader.results import TrialResult
from autoloader.search import thread_bounds
from search_fakes import tt


@pytest.mark.parametrize("chosen, fixed, cap, usable, max_threads, expected", [
    (64, None, 64, 2, 64, (1, 2)),      # few processes: up to the usable CPUs
    (64, None, 64, 2, 16, (1, 4)),      # batch 16: 16 threads a process, 4 processes keep 64 samples in flight
    (64, None, 16, 2, 4, (1, 16)),      # ... never more than the cap
    (3, None, 64, 8, 64, (1, 3)),       # never more than the process-only choice
    (8, None, 4, 8, 64, (1, 4)),        # nor the cap
    (0, None, 64, 2, 64, (0, 0)),       # no workers chosen: threads in the main process
    (4, None, 0, 2, 64, (0, 0)),        # max_workers=0
    (4, 3, 64, 2, 64, (3, 3)),          # the user's num_workers
])
def test_thread_processes(chosen, fixed, cap, usable, max_threads, expected):
    assert thread_bounds.thread_processes(chosen, fixed_workers=fixed, cap=cap, usable_cpus=usable,
                                           max_threads=max_threads) == expected


@pytest.mark.parametrize("cap, usable, max_threads, expected", [
    (64, 2, 32, (1, 8)),       # 4 x the usable CPUs
    (64, 2, 4, (1, 16)),       # batch 4: 16 processes keep cap=64 samples in flight
    (3, 2, 32, (1, 3)),        # never more than the cap
    (1, 8, 32, (1, 1)),
    (0, 2, 32, (0, 0)),        # max_workers=0: no threads-first search
])
def test_threads_first_processes(cap, usable, max_threads, expected):
    assert thread_bounds.threads_first_processes(cap=cap, usable_cpus=usable, max_threads=max_threads) == expected


@pytest.mark.parametrize("chosen, cap, expected", [
    (tt(2, 32, 12000), 64, 64),      # the same samples in flight in single-threaded workers
    (tt(4, 32, 12000), 64, 64),      # ... at most the cap
    (tt(1, 4, 900), 64, 4),
    (tt(2, 32, 12000), 2, None),     # no more processes than the choice: nothing to compare
])
def test_process_reference(chosen, cap, expected):
    assert thread_bounds.process_reference(chosen, cap=cap) == expected


def test_max_threads_per_process_is_a_batch_measured():
    measured = TrialResult(config=LoaderConfig(4, 2), samples_per_s=1000.0, batches=50, window_s=1.6)  # 32 a batch
    assert thread_bounds.max_threads_per_process(measured, batch_size=1) == 32  # a batch_sampler decided the batches
    assert thread_bounds.max_threads_per_process(tt(4, 1, 1000.0), batch_size=16) == 16
    assert thread_bounds.max_threads_per_process(tt(4, 1, 1000.0), batch_size=512) == thread_bounds.MAX_THREADS
