"""A tuning's facts in words (autoloader.results.tune_words), from their values alone: each bottleneck named, the
disk's ceiling against the rate reached (page cache, storage-bound, a share of it), and a native limit never claimed
beyond what was seen held. Their place in ``print(result)`` is in test_tune_result.py."""
from __future__ import annotations

import pytest

from autoloader.probe._pools import NativePool
from autoloader.results import BOTTLENECKS
from autoloader.results import tune_words
from autoloader.results.tune_words import BOTTLENECK_WORDS, DISK_LIMITED, bottleneck_words, disk_words, limit_words


def test_every_bottleneck_has_its_words_and_none_is_unknown():
    assert set(BOTTLENECK_WORDS) == set(BOTTLENECKS)
    assert bottleneck_words("io") == BOTTLENECK_WORDS["io"]
    assert bottleneck_words(None).startswith("unknown")
    assert bottleneck_words("gremlins") == "gremlins", "a word this version does not know is shown as it is"


def test_disk_words_need_a_ceiling_and_a_read_size():
    assert disk_words(None, 4096.0, 100.0) is None
    assert disk_words(1000.0, None, 100.0) is None


@pytest.mark.parametrize("reached, ending", [
    (1300.0, "faster than the disk, so the reads came from the page cache"),
    (1000.0, "the storage, not the configuration, is the limit"),
    (DISK_LIMITED * 1000.0, "the storage, not the configuration, is the limit"),
    (500.0, "(50% of it reached)"),
    (None, "(0% of it reached)"),
])
def test_disk_words_place_the_rate_against_the_ceiling(reached, ending):
    text = disk_words(1000.0, 2048.0, reached)
    assert text.startswith("the disk allows ~1,000 samples/s at the measured 2.0 KiB read per sample")
    assert text.endswith(ending)


def test_limit_words_claim_a_limit_only_when_seen_held():
    pools = (NativePool("libgomp", "openmp", "openmp", 4, 4),)
    assert limit_words(None, pools, None) == "not limited"
    assert limit_words(2, pools, True) == "limited to 2 thread(s) each"
    not_seen = limit_words(2, None, None)
    assert "not seen applied" in not_seen and "threadpoolctl" in not_seen and '"2?"' in not_seen
    kept_more = limit_words(2, pools, False)
    assert "not applied: a pool above kept more threads" in kept_more and "limited to" not in kept_more


@pytest.mark.parametrize("other, named", [([0.1, 0.2], False), ([1.9, 2.3], True), ([None], False), ([], False),
                                          ([0.6, None], True)])
def test_the_machines_other_load_is_named_when_it_was_heavy(other, named):
    words = tune_words.load_words(other)
    assert (words is not None) == named
    if named:
        assert "CPUs busy" in words and "refresh=True" in words
