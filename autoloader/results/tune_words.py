"""A tuning's facts in words, from their values alone (``tune_result.format_tune_result`` puts them in its text): the
bottleneck, the disk's ceiling against the rate reached, and the native thread pools' limit as far as it was seen held.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from .._text import rate
from ..probe._pools import NativePool

BOTTLENECK_WORDS = {
    "consumer": "the training step: loading keeps up, more workers would not help",
    "consumer-cpu": "consumer (cpu): the training step runs on the CPUs the workers would use, so more workers only "
                    "take them from it",
    "cpu": "CPU: the usable cores are busy decoding/augmenting samples",
    "io": "waiting: workers mostly sleep on storage or network reads",
    "ipc": "inter-process transfer: handing batches between processes costs more than loading them",
    "memory": "memory: more workers would not fit in RAM or /dev/shm",
    "oversubscription": "oversubscription: the workers' native thread pools (BLAS, OpenMP) together ran more threads "
                        "than there are CPUs, so workers lost to loading in the main process",
}
OTHER_LOAD_FLOOR = 0.5
"""Other processes keeping at least this many CPUs busy while candidates were measured are named in a tuning's text
(``load_words``); less is daemons, and what a window cannot tell apart from them (a previous pool's workers exiting)."""
DISK_LIMITED = 0.8
"""A rate within this share of the disk's ceiling (or above it) is limited by the storage, not the configuration."""


def bottleneck_words(bottleneck: Optional[str]) -> str:
    """The bottleneck in plain words ("unknown" when not measured)."""
    if bottleneck is None:
        return "unknown (nothing was measured)"
    return BOTTLENECK_WORDS.get(bottleneck, bottleneck)


def limit_words(limit: Optional[int], pools: Optional[Tuple[NativePool, ...]], held: Optional[bool]) -> str:
    """The native limit ``limit`` as far as it was seen applied (``held``, over the ``pools`` a worker found; None
    when not measured): never "limited to N" unless every pool a worker reported kept <= N."""
    if limit is None:
        return "not limited"
    if held:
        return f"limited to {limit} thread(s) each"
    if pools is None:
        return (f"a limit of {limit} thread(s) each was asked for, not seen applied (without threadpoolctl the BLAS "
                f"and OpenMP pools keep their size; \"{limit}?\" in the table)")
    return (f"a limit of {limit} thread(s) each was asked for, not applied: a pool above kept more threads "
            f"(\"{limit}?\" in the table)")


def disk_words(ceiling: Optional[float], per_sample: Optional[float], reached: Optional[float]) -> Optional[str]:
    """The disk's ``ceiling`` (samples/s at ``per_sample`` bytes read per sample) next to the rate ``reached``; None
    without a ceiling (a result not bound by I/O, or no disk figure)."""
    if ceiling is None or per_sample is None:
        return None
    text = f"the disk allows ~{rate(ceiling)} samples/s at the measured {per_sample / 1024:,.1f} KiB read per sample"
    reached = reached or 0.0
    if reached > 1.2 * ceiling:
        return text + ": faster than the disk, so the reads came from the page cache"
    if reached >= DISK_LIMITED * ceiling:
        return text + ": the storage, not the configuration, is the limit"
    return text + f" ({100 * reached / ceiling:.0f}% of it reached)"


def load_words(other_cpus: Sequence[Optional[float]]) -> Optional[str]:
    """The machine's other load while the candidates were measured (each one's ``TrialResult.other_cpus``), when it
    reached ``OTHER_LOAD_FLOOR`` of a CPU on average: the figures are a busy machine's, and a later run may decide
    otherwise. None otherwise, or when not measured."""
    known = [c for c in other_cpus if c is not None]
    if not known or sum(known) / len(known) < OTHER_LOAD_FLOOR:
        return None
    return (f"the machine's other processes kept {sum(known) / len(known):.1f} CPUs busy on average while the "
            f"candidates were measured: figures of a busy machine (refresh=True tunes again)")
