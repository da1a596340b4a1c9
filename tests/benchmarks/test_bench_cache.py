"""A cache hit costs no trial and no worker start (run with ``pytest tests/benchmarks --benchmarks``).

The run is added to tests/benchmarks/results/cache.md (``bench_results``)."""
import time

import pytest

from autoloader import make_loader
from bench_results import Run
from helpers import emit_table, live_children
from workloads import LatencyBound

ROWS = []


def test_cache_hit_is_fast(benchmark, tmp_path):
    data = LatencyBound(n=5000, latency_s=0.003)
    started = time.perf_counter()
    first = make_loader(data, 16, cache=tmp_path, budget=10, tuning="trials")  # tuning before the first batch
    tuning_s = time.perf_counter() - started
    assert first.tuning.source == "tuned"

    hit = benchmark(lambda: make_loader(data, 16, cache=tmp_path, budget=10, tuning="trials"))
    assert hit.tuning.source == "cache"
    assert not live_children()
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(tuning_s=tuning_s, hit_median_s=median, speedup=tuning_s / median)
    print(f"\ncache: tuning took {tuning_s:.2f} s, a hit {median * 1000:.2f} ms ({tuning_s / median:,.0f}x)")
    ROWS.append((tuning_s, median, benchmark.stats.stats.rounds))
    assert median < 0.05


@pytest.fixture(scope="module", autouse=True)
def table():
    run = Run.start("cache", "A cache hit against tuning")
    yield
    if not ROWS:
        return
    lines = ["Latency-bound dataset (5,000 samples, 3 ms each), batch 16, `budget=10`: the first `make_loader` tunes "
             "and stores; every later call is a hit.", "",
             "| tuning s | cache hit: median ms | calls timed | tuning / hit |", "|---|---|---|---|"]
    lines += [f"| {tuning_s:.2f} | {median * 1000:.2f} | {rounds} | {tuning_s / median:,.0f}x |"
              for tuning_s, median, rounds in ROWS]
    emit_table("\n".join(lines))
    run.write("\n".join(lines))
