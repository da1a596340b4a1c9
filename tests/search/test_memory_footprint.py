"""What one configuration adds to memory (NOTE [ Memory budget ] in search/memory.py): the one
formula every memory check and forecast uses, on tables."""
import pytest

from autoloader.config import LoaderConfig
from autoloader.search import memory
from autoloader.search.memory import Footprint

MIB = 2**20


def config(n, *, prefetch=2, pin=False, threads=1):
    return LoaderConfig(n, prefetch if n else None, pin, False, threads=threads)


@pytest.mark.parametrize("cfg, per_worker, batch, expected", [
    # workers, (n x prefetch + 2) batches in /dev/shm, pinned copies, thread buffers
    (config(4), 100 * MIB, MIB, (400 * MIB, 10 * MIB, 0, 0)),
    (config(4, pin=True), 100 * MIB, MIB, (400 * MIB, 10 * MIB, 10 * MIB, 0)),
    (config(2, prefetch=4, threads=4), 10 * MIB, 4 * MIB, (20 * MIB, 40 * MIB, 0, 2 * 4 * MIB)),
    (config(0), None, MIB, (0, 0, 0, 0)),
    (config(0, pin=True, threads=8), None, 8 * MIB, (0, 0, 16 * MIB, 8 * MIB)),
    (config(4), None, MIB, (None, 10 * MIB, 0, 0)),  # one worker's memory not known yet
    (config(4), 100 * MIB, None, (400 * MIB, 0, 0, 0)),  # the batch not known yet
])
def test_footprint(cfg, per_worker, batch, expected):
    got = memory.footprint(cfg, per_worker_bytes=per_worker, batch_bytes=batch)
    assert (got.workers_bytes, got.shm_bytes, got.pinned_bytes, got.threads_bytes) == expected
    assert got.total_bytes == (None if expected[0] is None else sum(expected))


@pytest.mark.parametrize("cfg, batch, expected, why", [
    (config(4), MIB, 10 * MIB, "4 workers x prefetch 2 in flight, plus the one pinned and the one the loop holds"),
    (config(4, prefetch=4), MIB, 18 * MIB, "a deeper queue: 16 in flight + 2"),
    (config(0), 8 * MIB, 0, "no workers: batches are made in the main process, none in /dev/shm"),
    (config(2), 0, 0, "a batch of no bytes takes none"),
])
def test_shm_need_bytes(cfg, batch, expected, why):
    assert memory.shm_need_bytes(cfg, batch) == expected, why


@pytest.mark.parametrize("parts, expected, why", [
    (Footprint(400 * MIB, 10 * MIB, 0, 0), "400 MiB workers + 10 MiB batches in /dev/shm", "only the parts it has"),
    (Footprint(0, 0, 16 * MIB, 32 * MIB), "16 MiB pinned copies + 32 MiB thread buffers", "no workers: no such part"),
    (Footprint(None, 10 * MIB, 0, 0), "10 MiB batches in /dev/shm", "a worker's size not known yet"),
])
def test_a_footprint_describes_its_parts(parts, expected, why):
    assert parts.describe() == expected, why
