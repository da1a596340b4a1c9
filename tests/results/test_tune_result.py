"""A tuning's text (``print(result)``, autoloader.results.tune_result): its table and reasons."""
from __future__ import annotations

from dataclasses import replace

from autoloader.config import LoaderConfig
from autoloader.probe._pools import NativePool
from autoloader.results import TuneResult
from autoloader.results.tune_result import format_tune_result
from autoloader.results.tune_words import BOTTLENECK_WORDS
from helpers import trial, tuned_result


def test_format_tune_result_table_marks_the_choice_and_shows_reasons():
    text = format_tune_result(tuned_result())
    assert str(tuned_result()) == text
    lines = text.splitlines()
    assert "num_workers=2, prefetch_factor=2" in lines[0] and "persistent_workers=True" in lines[0]
    assert "980 samples/s" in text and BOTTLENECK_WORDS["cpu"] in text and "tuned in 6.5 s (5 trials)" in text
    assert "2,000 samples/s" in text                                       # the consumer's own rate
    header = next(line for line in lines if "workers" in line and "vs best" in line)
    for column in ("prefetch", "pin", "samples/s", "startup s", "stall %", "worker CPU %", "status"):
        assert column in header
    chosen = [line for line in lines if line.lstrip().startswith("*")]
    assert len(chosen) == 1 and " 2 " in chosen[0] and "98%" in chosen[0]
    assert "skipped: memory: 8 workers" in text and "failed: worker died" in text


def test_format_tune_result_without_trials():
    cached = tuned_result(source="cache", trials=())
    assert "from the cache" in format_tune_result(cached) and "no trials recorded" in format_tune_result(cached)
    fallback = TuneResult(LoaderConfig(0), None, None, "fallback", reason="could not tune: boom")
    text = format_tune_result(fallback)
    assert "fallback, not tuned: could not tune: boom" in text and "unknown" in text


def test_the_chosen_row_is_the_candidate_with_the_same_pin_memory():
    # The same workers and prefetch measured with and without pinned memory (the CUDA pin trial): only the
    # configuration chosen is marked, whatever persistent_workers the decision set afterwards.
    trials = (trial(2, 1000.0), replace(trial(2, 990.0), config=LoaderConfig(2, 2, pin_memory=True)))
    result = tuned_result(num_workers=2, prefetch_factor=2, pin_memory=True, persistent_workers=True,
                          samples_per_s=990.0, trials=trials)
    chosen = [line for line in format_tune_result(result).splitlines() if line.lstrip().startswith("*")]
    assert len(chosen) == 1 and " yes " in chosen[0]


def test_a_candidate_is_the_same_whatever_persistent_workers_and_only_then():
    config = LoaderConfig(4, 2, pin_memory=True, threads=8)
    assert config.same_candidate(LoaderConfig(4, 2, pin_memory=True, persistent_workers=True, threads=8))
    for other in (LoaderConfig(4, 2, pin_memory=False, threads=8), LoaderConfig(4, 2, pin_memory=True, threads=1),
                  LoaderConfig(4, 4, pin_memory=True, threads=8), LoaderConfig(2, 2, pin_memory=True, threads=8)):
        assert not config.same_candidate(other)


def test_the_table_shows_each_footprint_and_the_budget_line():
    mib = 2**20
    trials = (trial(0, 500.0, footprint_bytes=0), trial(2, 980.0, footprint_bytes=210 * mib),
              trial(8, None, status="skipped", reason="memory: 8 workers need 1,700 MiB", footprint_bytes=1700 * mib))
    result = tuned_result(trials=trials, memory_budget_bytes=1024 * mib,
                          memory_budget_from="1,024 MiB (memory_budget=1073741824, set by the user)")
    lines = format_tune_result(result).splitlines()
    assert any(line.strip().startswith("memory budget 1,024 MiB (memory_budget=1073741824, set by the user); the "
                                       "chosen configuration takes 210 MiB of it") for line in lines), lines
    header = next(line for line in lines if "vs best" in line)
    assert "footprint MiB" in header
    skipped = next(line for line in lines if "skipped" in line)
    assert "1,700" in skipped
    plain = format_tune_result(tuned_result())
    assert "footprint MiB" not in plain and "memory budget" not in plain
    assert TuneResult.from_dict(result.to_dict()) == result


def test_the_native_pools_a_worker_found_and_the_limit_chosen_are_shown():
    pools = (NativePool("libscipy_openblas", "blas", "openblas", 8, 7), NativePool("libgomp", "openmp", "openmp", 1, 1))
    limited = trial(2, 1000.0, native_pools=pools)
    limited = replace(limited, config=replace(limited.config, native_threads=7))
    without = replace(trial(2, 700.0), native_pools=tuple(replace(p, limited_to=None) for p in pools))
    result = tuned_result(trials=(trial(0, 500.0), limited, without), native_threads=7, samples_per_s=1000.0)
    text = format_tune_result(result)
    assert "native_threads=7 per worker" in text.splitlines()[0] and result.native_pools == pools
    assert "native thread pools per worker: libscipy_openblas (blas) 8 -> 7, libgomp (openmp) 1; limited to 7" in text
    assert "measured without a limit: 700 samples/s, with it: 1,000" in text
    header = next(line for line in text.splitlines() if "vs best" in line)
    assert header.split()[:4] == ["workers", "prefetch", "pin", "native"]
    rows = [line.split() for line in text.splitlines()[text.splitlines().index(header) + 1:]]
    assert [r[4 if r[0] == "*" else 3] for r in rows] == ["-", "7", "off"], rows  # no workers, the limit, none
    unknown = format_tune_result(tuned_result(native_threads=1))
    assert "native thread pools per worker: unknown" in unknown and "limited to 1" not in unknown
    assert "a limit of 1 thread(s) each was asked for, not seen applied" in unknown


def test_a_limit_not_seen_applied_is_never_claimed():
    # as without threadpoolctl: the candidates' workers reported no pools, so the BLAS pool kept its size
    unseen = replace(trial(2, 1000.0), config=LoaderConfig(2, 2, native_threads=1))
    result = tuned_result(trials=(trial(0, 500.0), unseen), native_threads=1, samples_per_s=1000.0)
    assert result.native_limit_held is False
    text = format_tune_result(result)
    assert "native_threads=1 per worker (not seen applied)" in text.splitlines()[0] and "limited to" not in text
    header = next(line for line in text.splitlines() if "vs best" in line)
    rows = [line.split() for line in text.splitlines()[text.splitlines().index(header) + 1:]]
    assert [r[4 if r[0] == "*" else 3] for r in rows] == ["-", "1?"], rows
    refused = (NativePool("libscipy_openblas", "blas", "openblas", 8, 4),)  # a library that kept 4 of its 8
    kept = tuned_result(trials=(replace(unseen, native_pools=refused),), native_threads=1, samples_per_s=1000.0)
    assert "not applied: a pool above kept more threads" in format_tune_result(kept)
    held = replace(unseen, native_pools=(NativePool("libscipy_openblas", "blas", "openblas", 8, 1),))
    text = format_tune_result(tuned_result(trials=(held,), native_threads=1, samples_per_s=1000.0))
    assert "limited to 1 thread(s) each" in text and "?" not in text and "not seen" not in text


def test_oversubscription_is_named_in_words():
    assert "oversubscription" in format_tune_result(tuned_result(bottleneck="oversubscription"))
    assert "native thread pools" not in format_tune_result(tuned_result(num_workers=0, prefetch_factor=None,
                                                                        persistent_workers=False))
