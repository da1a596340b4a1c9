"""Which of a forked worker's pages it still shares with this process, read twice (Linux ``/proc/<pid>/pagemap``): the
pages it copied in between, and where they lie (NOTE [ Copy-on-read forecast ] in search/memory.py).

A forked worker's private writable mappings start out shared with this process page by page; a page it writes (an
object's reference count, read by ``__getitem__``) becomes its own. ``pagemap`` says, per page, whether it is present
and whether this process alone maps it (bit 56, "exclusively mapped", since Linux 4.2): a present page that is not
exclusive is still shared. A ``Census`` holds that for every private writable mapping holding anonymous pages;
``copied`` compares two of one worker, taken at its first batch and at the window's end. Facts or None: a platform or
a sandbox that does not let us read the files gives None, never a guess.
A page this process writes meanwhile leaves its other holders holding the old one; when that is a lone worker, the
worker now maps it alone, a copy it never made (measured: 1.6-6.3 MiB in trials of one worker reading nothing, 0.2-0.8
MiB per worker with two or more, whose siblings still share the page). So a measuring window takes the census only
with two workers or more.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

MAX_MAPPING_BYTES = 16 * 2**30
"""A mapping larger than this is skipped (a reservation such as CUDA's: reading its pagemap would take seconds)."""
MIN_COPIES_FOR_SPAN = 32
"""A mapping with fewer copied pages has no span of its own in ``Copies.span_bytes`` (too few to tell where its copies
lie): see ``copied``."""
RUN_PAGES = 3
"""Copied pages in runs this long or longer were written, not read: reads at random copy pages apart (at a density d
of the span, a page lies in such a run by chance about 3 d^2 of the time: under 0.1 % in a trial)."""
TRIM = 0.025
"""The share of a mapping's copies left out at each end of its span: the interpreter's own objects, touched once, lie
anywhere in the heap (measured: 9 of 390 copies far below the dataset's objects, 14 in a worker that reads none)."""
_PRESENT, _EXCLUSIVE = np.uint64(1 << 63), np.uint64(1 << 56)


@dataclass(frozen=True)
class Mapping:
    """One private writable mapping at one instant: per page, present and shared with another process, and present
    and exclusively this one's."""

    start: int
    shared: np.ndarray
    exclusive: np.ndarray


@dataclass(frozen=True)
class Census:
    """A worker's private writable mappings holding anonymous pages (``take``), and the page size."""

    mappings: Dict[int, Mapping]
    page: int

    @property
    def shared_bytes(self) -> int:
        """What the worker shares: the most it can still copy."""
        return self.page * sum(int(m.shared.sum()) for m in self.mappings.values())


@dataclass(frozen=True)
class Copies:
    """What a worker copied between two censuses: ``copied_bytes``; of those, ``run_bytes`` in runs of ``RUN_PAGES``
    neighbouring pages or more (what it wrote, such as new objects in inherited free space, or objects read in order;
    reads at random copy pages apart); ``span_bytes``, what it shared at the first within the address span its copies fell in (the
    objects its reads copy from); ``shared_bytes``, what it shared at the first (the most it could copy)."""

    copied_bytes: int
    run_bytes: int
    span_bytes: int
    shared_bytes: int


def _mappings(pid: int) -> List[Tuple[int, int]]:
    """(start, end) of ``pid``'s private writable mappings that hold anonymous pages, from ``/proc/<pid>/smaps``."""
    found: List[Tuple[int, int]] = []
    current: Optional[Tuple[int, int]] = None
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            head = line.split(None, 2)
            if "-" in head[0] and len(head) > 1 and len(head[1]) == 4:
                start, end = (int(x, 16) for x in head[0].split("-"))
                private_writable = head[1][1] == "w" and head[1][3] == "p" and "[stack]" not in line
                current = (start, end) if private_writable and end - start <= MAX_MAPPING_BYTES else None
            elif head[0] == "Anonymous:" and current is not None and int(head[1]) > 0:
                found.append(current)
                current = None
    return found


def take(pid: int) -> Optional[Census]:
    """The census of worker ``pid`` now; None where ``/proc`` cannot be read (not Linux, a sandbox, a worker gone)."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        spans = _mappings(pid)
        mappings: Dict[int, Mapping] = {}
        with open(f"/proc/{pid}/pagemap", "rb") as fh:
            for start, end in spans:
                fh.seek(start // page * 8)
                flags = np.frombuffer(fh.read((end - start) // page * 8), dtype=np.uint64)
                present = (flags & _PRESENT) != 0
                exclusive = (flags & _EXCLUSIVE) != 0
                mappings[start] = Mapping(start, present & ~exclusive, present & exclusive)
    except (OSError, ValueError):
        return None
    return Census(mappings, page)


def copied(first: Census, last: Census) -> Copies:
    """What the worker copied between ``first`` and ``last`` (pages shared then, its own now), where (``Copies``).
    The span: per mapping with ``MIN_COPIES_FOR_SPAN`` copies or more, ``_span_pages``; a mapping with fewer counts
    whole where its copies are as dense as in those (the objects' pages split over small mappings), else only its
    copies (the interpreter's own objects, touched in passing)."""
    copies = runs = span = 0
    sparse: List[Tuple[int, int]] = []
    dense_copies = dense_span = 0
    for start, before in first.mappings.items():
        after = last.mappings.get(start)
        if after is None:  # unmapped since: nothing of it is held any more
            continue
        m = min(len(before.shared), len(after.exclusive))
        flipped = np.flatnonzero(before.shared[:m] & after.exclusive[:m])
        if not len(flipped):
            continue
        copies += len(flipped)
        runs += _in_runs(flipped)
        if len(flipped) < MIN_COPIES_FOR_SPAN:
            sparse.append((len(flipped), int(before.shared.sum())))
            continue
        pages = _span_pages(before.shared, flipped)
        dense_copies, dense_span, span = dense_copies + len(flipped), dense_span + pages, span + pages
    density = dense_copies / dense_span if dense_span else 0.0
    span += sum(shared if count >= 0.5 * density * shared else count for count, shared in sparse)
    return Copies(copies * first.page, runs * first.page, span * first.page, first.shared_bytes)


def _in_runs(flipped: np.ndarray) -> int:
    """How many of the sorted page indices ``flipped`` lie in runs of ``RUN_PAGES`` neighbouring pages or more."""
    if len(flipped) < RUN_PAGES:
        return 0
    breaks = np.flatnonzero(np.diff(flipped) != 1)
    starts = np.concatenate(([0], breaks + 1))
    lengths = np.diff(np.concatenate((starts, [len(flipped)])))
    return int(lengths[lengths >= RUN_PAGES].sum())


def _span_pages(shared: np.ndarray, flipped: np.ndarray) -> int:
    """The shared pages of one mapping within the span its copies (page indices ``flipped``, ``MIN_COPIES_FOR_SPAN``
    or more) fell in: between their ``TRIM`` and 1 - ``TRIM`` quantiles, widened to the whole range uniform copies
    would cover, plus one standard error (1/sqrt(copies))."""
    m = len(flipped)
    low_q, high_q = np.quantile(flipped, [TRIM, 1.0 - TRIM])
    width = (high_q - low_q) / (1.0 - 2 * TRIM) * (1.0 + 1.0 / np.sqrt(m))
    middle = (low_q + high_q) / 2
    low, high = max(0, int(middle - width / 2)), min(len(shared), int(np.ceil(middle + width / 2)) + 1)
    return int(shared[low:high].sum())
