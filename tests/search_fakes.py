"""Fake trials the search's test tables are written in (tests/search/): one definition each, imported by the test
modules that split the search's decisions between them."""
import dataclasses

from autoloader.config import LoaderConfig
from autoloader.results import TrialResult
from autoloader.search import memory

MIB, GIB = 2**20, 2**30


def config(n, *, prefetch=2, pin=False, threads=1):
    return LoaderConfig(n, prefetch if n else None, pin, False, threads=threads)


def fake(n, rate, *, uss=100 * MIB, growth=0, batch_bytes=MIB, threads=1, status="ok", batches=40, batch=32):
    """A measured trial: ``batches`` of ``batch`` samples in its window."""
    return TrialResult(config=config(n, threads=threads), status=status,
                       samples_per_s=rate if status == "ok" else None, batches=batches,
                       window_s=batches * batch / rate if rate else 0.0, batch_bytes=batch_bytes,
                       worker_uss_bytes=uss if n else None, worker_uss_growth_bytes=growth if n else None)


def growth_for(n, slope, *, batches=40, batch=32, prefetch=2):
    """The growth a worker of ``n`` shows in a trial when it grows ``slope`` bytes per sample it makes (plus the
    noise any worker shows: these trials' batches are 1 MiB)."""
    return int(slope * (batches + n * prefetch + n) * batch / n) + max(memory.GROWTH_NOISE_BYTES, 2 * prefetch * MIB)


def copying(n, rate=1000.0, *, uss=10 * MIB, per_sample=4096, span=181 * MIB, shared=260 * MIB, batches=None,
            batch=64, other=0):
    """A trial whose worker copied ``per_sample`` bytes per sample it made (the census), out of ``span``; its window
    holds 3 waves of batches, as measure/window.py's. ``uss``: one worker's size at its first batch; at the window's
    end (``worker_uss_bytes``, as measured) it holds what it copied and grew since."""
    batches = batches or max(24, 3 * n)
    made = (batches + config(n).burst_batches()) * batch / n
    copied = int(per_sample * made)
    trial = fake(n, rate, uss=uss + copied + other, growth=copied + other, batch_bytes=4096, batches=batches,
                 batch=batch)
    return dataclasses.replace(trial, worker_copied_bytes=copied, worker_copy_span_bytes=span,
                               worker_shared_bytes=shared)


def tt(n, threads, rate, *, util=None, memory=None, prefetch=2, status="ok", fetch=None, cpu=None):
    """A trial of ``n`` processes x ``threads`` threads; ``memory``: the workers' summed USS in MiB."""
    config = LoaderConfig(n, prefetch if n else None, False, False, threads)
    return TrialResult(config=config, status=status, samples_per_s=rate if status == "ok" else None,
                       worker_cpu_util=util, fetch_s_per_batch=fetch, fetch_cpu_s_per_batch=cpu,
                       worker_uss_total_bytes=None if memory is None else memory * MIB)
