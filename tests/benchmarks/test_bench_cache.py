"""A cache hit costs no trial and no worker start (run with ``pytest tests/benchmarks --benchmarks``)."""
import time

from autoloader import make_loader
from helpers import live_children
from workloads import LatencyBound


def test_cache_hit_is_fast(benchmark, tmp_path):
    data = LatencyBound(n=5000, latency_s=0.003)
    started = time.perf_counter()
    first = make_loader(data, 16, cache=tmp_path, budget=10)
    tuning_s = time.perf_counter() - started
    assert first.tuning.source == "tuned"

    hit = benchmark(lambda: make_loader(data, 16, cache=tmp_path, budget=10))
    assert hit.tuning.source == "cache"
    assert not live_children()
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(tuning_s=tuning_s, hit_median_s=median, speedup=tuning_s / median)
    print(f"\ncache: tuning took {tuning_s:.2f} s, a hit {median * 1000:.2f} ms ({tuning_s / median:,.0f}x)")
    assert median < 0.05
