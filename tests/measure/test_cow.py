"""The copy-on-read census (autoloader.measure.cow): a forked child's pages shared with this process, read twice: what
it copied in between, and the span its copies fell in. A real fork reading a list of objects, and tables."""
import os
import random
import sys

import numpy as np
import pytest

from autoloader.measure import cow

MIB = 2**20
CENSUS_NOISE_BYTES = 4 * MIB
"""What a child that reads nothing still comes to hold alone while this process writes (the census's own arrays, its
allocator: the child is then the only holder of those pages): about 1 MiB in a small process (the noise
memory.COPY_NOISE_BYTES allows for), 1.1-3.7 MiB in a process that ran the whole default suite."""
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc/<pid>/pagemap")


def _forked_reader(items, reads):
    """A child that, told to, reads ``reads`` of ``items`` at random (writing their reference counts), then waits to
    be killed; returns (pid, go, done) pipe ends."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.read(go_r, 1)
            picked = random.Random(0).sample(range(len(items)), reads)
            total = 0
            for i in picked:
                total += len(items[i])
            os.write(done_w, b"x")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    return pid, go_w, done_r


def test_a_child_reading_objects_copies_a_page_each_within_their_span():
    items = [bytes([i % 251]) * 512 for i in range(100_000)]  # about 53 MiB, a 4 KiB page holds about 7
    pid, go, done = _forked_reader(items, 2000)
    try:
        first = cow.take(pid)
        if first is None:
            pytest.skip("/proc/<pid>/pagemap is not readable here")
        assert first.shared_bytes > 40 * MIB, "the child shares this process's heap, the list included"
        os.write(go, b"x")
        os.read(done, 1)
        last = cow.take(pid)
    finally:
        os.write(go, b"x")
        os.waitpid(pid, 0)
    copies = cow.copied(first, last)
    page = first.page
    assert 0.8 * 2000 * page <= copies.copied_bytes <= 2000 * page + 2 * MIB, copies
    data = 100_000 * 545
    assert 0.9 * data <= copies.span_bytes <= first.shared_bytes, (copies.span_bytes / MIB, data / MIB)
    assert copies.run_bytes < 0.2 * copies.copied_bytes, "reads at random copy pages apart"
    assert copies.shared_bytes == first.shared_bytes


def test_a_child_reading_nothing_copies_next_to_nothing():
    items = [bytes([i % 251]) * 512 for i in range(20_000)]
    pid, go, done = _forked_reader(items, 0)
    try:
        first = cow.take(pid)
        if first is None:
            pytest.skip("/proc/<pid>/pagemap is not readable here")
        os.write(go, b"x")
        os.read(done, 1)
        last = cow.take(pid)
    finally:
        os.write(go, b"x")
        os.waitpid(pid, 0)
    listed = sum(sys.getsizeof(item) for item in items)  # a child reading the list copies all of it
    assert cow.copied(first, last).copied_bytes < min(CENSUS_NOISE_BYTES + listed // 4, listed // 2), listed


def _census(*mappings):
    """A Census of mappings given as (start page, shared flags, exclusive flags) strings of 0/1."""
    page = 4096
    return cow.Census({start * page: cow.Mapping(start * page, np.array([c == "1" for c in shared]),
                                                 np.array([c == "1" for c in exclusive]))
                       for start, shared, exclusive in mappings}, page)


def test_copied_counts_pages_shared_then_exclusive_now():
    first = _census((0, "1111", "0000"), (100, "11", "00"))
    last = _census((0, "1001", "0110"), (100, "10", "00"))  # the second mapping's last page: gone, not a copy
    copies = cow.copied(first, last)
    assert copies.copied_bytes == 2 * 4096 and copies.run_bytes == 0, "two neighbours are no run"
    assert copies.shared_bytes == 6 * 4096
    assert copies.span_bytes == 4 * 4096, "few copies and nowhere denser: the whole mapping counts"
    assert cow.copied(first, _census((0, "1111", "0000"))).copied_bytes == 0, "a mapping gone holds nothing"


def test_a_child_writing_new_objects_copies_runs():
    """New objects written into the free space this process left in its heap copy runs of neighbouring pages (they
    grow linearly, not up to a span: NOTE [ Copy-on-read forecast ])."""
    junk = [bytes(128 * 1024) for _ in range(400)]  # 50 MiB of heap, then freed: free space the child inherits
    del junk
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.read(go_r, 1)
            kept = [bytes([i % 251]) * (128 * 1024) for i in range(100)]  # written: every page
            os.write(done_w, b"x" if kept else b"")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        first = cow.take(pid)
        if first is None:
            pytest.skip("/proc/<pid>/pagemap is not readable here")
        os.write(go_w, b"x")
        os.read(done_r, 1)
        last = cow.take(pid)
    finally:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
    copies = cow.copied(first, last)
    if copies.copied_bytes > 4 * MIB:  # the allocator reused the inherited free space (else: fresh pages, no copies)
        # what is not in runs is this process's own writes meanwhile (the nothing-reader's noise)
        assert copies.copied_bytes - copies.run_bytes < max(0.1 * copies.copied_bytes, CENSUS_NOISE_BYTES), copies


def test_in_runs():
    assert cow._in_runs(np.array([1, 2, 3, 10, 20, 21, 40, 41, 42, 43])) == 7, "3 and 4 in a row; not 2"
    assert cow._in_runs(np.array([5])) == 0 and cow._in_runs(np.array([], dtype=np.int64)) == 0


def test_a_mapping_of_a_few_stray_copies_counts_them_alone_beside_a_dense_one():
    rng = np.random.default_rng(1)
    data = np.zeros(4000, dtype=bool)
    data[rng.choice(4000, size=400, replace=False)] = True  # 10 % of a 4,000-page region
    first = _census((0, "1" * 4000, "0" * 4000), (10_000, "1" * 1000, "0" * 1000), (20_000, "1" * 40, "0" * 40))
    last = _census((0, "".join("0" if d else "1" for d in data), "".join("1" if d else "0" for d in data)),
                   (10_000, "0" * 3 + "1" * 997, "1" * 3 + "0" * 997),  # 3 copies in 1,000 pages: stray
                   (20_000, "0" * 4 + "1" * 36, "1" * 4 + "0" * 36))  # 4 in 40: as dense as the data
    copies = cow.copied(first, last)
    assert copies.copied_bytes == (400 + 3 + 4) * 4096
    assert (4000 + 3 + 40) * 4096 * 0.95 <= copies.span_bytes <= (4000 * 1.1 + 3 + 40) * 4096, copies.span_bytes / 4096


def test_the_span_leaves_out_stray_copies_and_covers_the_dense_ones():
    n = 10_000
    shared = np.ones(n, dtype=bool)
    rng = np.random.default_rng(0)
    dense = rng.choice(np.arange(6000, 10_000), size=400, replace=False)  # the dataset: the top 4,000 pages
    stray = np.array([10, 900, 2500])  # the interpreter's own objects, anywhere
    flipped = np.sort(np.concatenate([dense, stray]))
    span = cow._span_pages(shared, flipped)
    assert 4000 <= span <= 4600, span
