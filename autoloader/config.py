"""The knobs of a DataLoader autoloader decides or records, defined once: ``KNOBS`` and the ``LoaderConfig`` they make.

Each knob says its default, the values it accepts (``check_knobs``: the one validation, for the user's arguments, a
configuration and a cache entry), whether DataLoader accepts it without workers, whether the search chooses it
(unless the user fixed it), whether it is recorded in a configuration (and so in the cache), and how it reads in a
label. Every DataLoader autoloader builds, every cache entry and every report reads these rows: a new knob is one row
here (plus, for a tuned one, the search's rule for choosing it).

What a configuration holds in flight is one formula too (``in_flight``); the start-up burst a window skips, the
batches in /dev/shm and what one worker's memory holds in batches are derived from it (``LoaderConfig`` methods).
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


def _start_method_name(value: Any) -> Optional[str]:
    """A ``multiprocessing_context`` as the start method's name (a context object or a name), for JSON and labels."""
    if value is None or isinstance(value, str):
        return value
    get = getattr(value, "get_start_method", None)
    if not callable(get):
        raise TypeError(f"multiprocessing_context must be a start method name ('fork', 'spawn', 'forkserver') or a "
                        f"multiprocessing context, got {value!r}")
    return str(get())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(low: int, *, none: bool = False) -> Callable[[Any], Optional[str]]:
    def check(value: Any) -> Optional[str]:
        ok = (none and value is None) or (_is_int(value) and value >= low)
        return None if ok else f"an int >= {low}" + (" or None" if none else "")
    return check


def _boolean(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else "True or False"


def _start_method(value: Any) -> Optional[str]:
    if value is None or callable(getattr(value, "get_start_method", None)) or (
            isinstance(value, str) and value in multiprocessing.get_all_start_methods()):
        return None
    return f"a start method name ({', '.join(map(repr, multiprocessing.get_all_start_methods()))}) or a " \
           f"multiprocessing context"


def _seconds(value: Any) -> Optional[str]:
    return None if isinstance(value, numbers.Real) and float(value) >= 0 else "a number of seconds >= 0"


@dataclass(frozen=True)
class Knob:
    """One DataLoader setting: ``worker_only``: meaningless without workers (DataLoader rejects some at
    ``num_workers=0``, so a configuration without workers holds ``off`` there and passes nothing); ``tuned``: the
    search chooses it unless the user fixed it; ``recorded``: a field of ``LoaderConfig`` (cached, reported; the
    user's value when they set it); ``loader_arg``: passed to DataLoader (``threads`` wraps the dataset instead)."""

    name: str
    default: Any
    worker_only: bool = False
    tuned: bool = False
    recorded: bool = True
    loader_arg: bool = True
    off: Any = None
    """The value without workers (worker-only knobs)."""
    normalize: Optional[Callable[[Any], Any]] = None
    """The user's value as recorded (JSON-able); None: as given."""
    label: Optional[Callable[[Any], str]] = None
    """How the value reads in ``LoaderConfig.label()`` when it is not ``off`` and not the default (``always``: when
    not ``off``); None: never shown."""
    always: bool = False
    check: Callable[[Any], Optional[str]] = lambda value: None
    """What the knob accepts: None when ``value`` is valid, else the values it takes, as words."""
    typed: Callable[[Any], bool] = lambda value: True
    """Whether ``value`` is of the knob's type: a value ``check`` refuses is then a ``ValueError`` (out of range),
    else a ``TypeError``, as DataLoader raises them."""

    def recorded_value(self, value: Any) -> Any:
        """The user's ``value`` as a configuration records it (``normalize``: JSON-able, e.g. a start method's name)."""
        return value if self.normalize is None else self.normalize(value)


KNOBS: Tuple[Knob, ...] = (
    Knob("num_workers", 0, tuned=True, label=lambda n: f"workers={n}", always=True, check=_at_least(0),
         typed=_is_int),
    Knob("prefetch_factor", 2, worker_only=True, tuned=True, label=lambda p: f"prefetch={p}", always=True,
         check=_at_least(1, none=True), typed=_is_int),
    Knob("threads", 1, tuned=True, loader_arg=False, label=lambda t: f"threads={t}", check=_at_least(1),
         typed=_is_int),
    Knob("native_threads", None, worker_only=True, tuned=True, loader_arg=False, label=lambda n: f"native={n}",
         check=_at_least(1, none=True), typed=_is_int),
    Knob("pin_memory", False, tuned=True, label=lambda _: "pin", check=_boolean, typed=lambda v: False),
    Knob("persistent_workers", False, worker_only=True, tuned=True, off=False, check=_boolean, typed=lambda v: False),
    Knob("multiprocessing_context", None, worker_only=True, normalize=_start_method_name, label=lambda m: f"start={m}",
         check=_start_method, typed=lambda v: isinstance(v, str)),
    Knob("timeout", 0, worker_only=True, recorded=False, check=_seconds, typed=lambda v: isinstance(v, numbers.Real)),
    # worker-only: the single-process iterator asserts timeout == 0
)
BY_NAME: Dict[str, Knob] = {k.name: k for k in KNOBS}
RECORDED = tuple(k.name for k in KNOBS if k.recorded)
USER_KNOBS = tuple(k.name for k in KNOBS if k.recorded and k.loader_arg)
"""The DataLoader keywords whose user value is kept apart from the user's other arguments (``Request.fixed``)."""
NOT_A_CANDIDATE = ("persistent_workers",)
"""Set on a decision after the search, never measured: two configurations differing only here are one candidate."""
DEFAULT_PREFETCH: int = BY_NAME["prefetch_factor"].default
"""torch's default ``prefetch_factor`` with workers, and the search's first."""


def check_knobs(values: Mapping[str, Any], *, hint: str = "") -> None:
    """Each knob in ``values`` holds a value it accepts (``Knob.check``), and the worker-only ones are off without
    workers; otherwise an error naming the knob, its value and, for a tuned one, ``hint`` (the fix, in the caller's
    words): a ``ValueError`` for a value of the knob's type out of its range, a ``TypeError`` for one of another type
    (a flag that is not a bool), as DataLoader raises them. The one validation of knob values."""
    for knob in (BY_NAME[name] for name in values if name in BY_NAME):
        value, expected = values[knob.name], knob.check(values[knob.name])
        if expected is not None:
            kind = ValueError if knob.typed(value) else TypeError
            raise kind(f"{knob.name}={value!r} must be {expected}{hint if knob.tuned else ''}")
    if values.get("num_workers") == 0:
        needing = [k.name for k in KNOBS if k.worker_only and k.recorded and k.name in values
                   and values[k.name] not in (None, k.off)]
        if needing:
            raise ValueError(f"{' and '.join(needing)} need num_workers > 0: drop {' and '.join(needing)} or set "
                             f"num_workers")


def default_pin(fixed: Mapping[str, Any], device_type: str) -> bool:
    """``pin_memory`` before anything is measured: the user's, else pinned for a CUDA device."""
    return bool(fixed.get("pin_memory", device_type == "cuda"))


def in_flight(num_workers: int, prefetch_factor: Optional[int]) -> int:
    """Batches a DataLoader's workers hold beyond what it returned, queued or being loaded: ``num_workers *
    prefetch_factor`` (dataloader.py's priming loop, torch 2.13), torch's default prefetch when None; 0 without
    workers. THE formula: a slice keeps this many to give back, a checkpoint counts these pulls, the burst and the
    /dev/shm batches follow from it."""
    return num_workers * (prefetch_factor or DEFAULT_PREFETCH) if num_workers else 0


def without_worker_only(kwargs: Mapping[str, Any]) -> dict:
    """``kwargs`` less the knobs that need workers (for a DataLoader with ``num_workers=0``)."""
    return {k: v for k, v in kwargs.items() if not (k in BY_NAME and BY_NAME[k].worker_only)}


@dataclass(frozen=True)
class LoaderConfig:
    """A DataLoader configuration: the knobs autoloader decides or records, one field each (``KNOBS``).

    ``loader.tuning.config`` is the one chosen; ``DataLoader(dataset, batch_size, **config.loader_kwargs())`` builds
    it (``threads`` and ``native_threads`` are autoloader's own, applied through the dataset and the workers'
    ``worker_init_fn``). The worker-only knobs are off without workers.

    Attributes:
        num_workers (int): DataLoader worker processes, >= 0 (0: batches are loaded in the main process).
        prefetch_factor (int): Batches each worker loads ahead, >= 1; None exactly when ``num_workers == 0``.
        pin_memory (bool): Batches are copied into page-locked memory, for faster and asynchronous copies to CUDA.
        persistent_workers (bool): Workers stay alive between epochs (off when they would hold more than half the
            memory budget); False without workers.
        threads (int): Threads fetching each batch's samples inside every loading process, >= 1 (1: none; see
            ``autoloader.ThreadedDataset``).
        multiprocessing_context (str): How the workers start (``"fork"``, ``"spawn"``, ``"forkserver"``) when you
            chose; None: the platform's default.
        native_threads (int): The most threads each worker's native pools (BLAS, OpenMP, OpenCV, numexpr) keep, >= 1
            (NOTE [ Native thread pools ] in ``autoloader/loader/native.py``); None: not limited, and always None
            without workers (the main process is never touched).

    Raises:
        ValueError: A knob out of range (e.g. ``num_workers=-1``, ``prefetch_factor=0``), or a worker-only knob set
            with ``num_workers=0``.
        TypeError: ``pin_memory`` or ``persistent_workers`` that is not a bool, or a ``multiprocessing_context``
            that is not a start method.
    """

    num_workers: int
    prefetch_factor: Optional[int] = None
    pin_memory: bool = False
    persistent_workers: bool = False
    threads: int = 1
    multiprocessing_context: Optional[str] = None
    native_threads: Optional[int] = None

    def __post_init__(self) -> None:
        check_knobs(dataclasses.asdict(self))

    def in_flight(self) -> int:
        """Batches its workers hold beyond what the DataLoader returned.

        Returns:
            int: ``num_workers * prefetch_factor`` (the module's ``in_flight`` formula), 0 without workers.
        """
        return in_flight(self.num_workers, self.prefetch_factor)

    def burst_batches(self) -> int:
        """Batches consumed before a measuring window opens: the start-up burst.

        Returns:
            int: What is in flight when the first batch comes, plus one more wave of ``num_workers`` (NOTE [ Trial
            timing ], 2. in ``autoloader/measure/run.py``); 1 without workers (the first batch, start-up included).
        """
        return self.in_flight() + self.num_workers if self.num_workers else 1

    def shm_batches(self) -> int:
        """Batches in ``/dev/shm`` at most.

        Returns:
            int: Those in flight, plus the one being pinned and the one the loop holds; 0 without workers (batches
            are made in the main process).
        """
        return self.in_flight() + 2 if self.num_workers else 0

    def worker_batches(self) -> int:
        """Batches one worker's memory may hold.

        Returns:
            int: Its share of those in flight, queued, and as many being built.
        """
        return 2 * self.in_flight() // self.num_workers if self.num_workers else 2 * DEFAULT_PREFETCH

    def loader_kwargs(self) -> dict:
        """The keywords to pass to ``torch.utils.data.DataLoader`` for this configuration.

        Returns:
            dict: The DataLoader knobs (not ``threads`` or ``native_threads``), the worker-only ones only with
            workers, none that is None (DataLoader's own default then).
        """
        return {k.name: getattr(self, k.name) for k in KNOBS if k.recorded and k.loader_arg
                and (self.num_workers > 0 or not k.worker_only) and getattr(self, k.name) is not None}

    def same_candidate(self, other: "LoaderConfig") -> bool:
        """Whether it is the same candidate as ``other``, whatever the knobs set only on decisions.

        Args:
            other: Another configuration.

        Returns:
            bool: True when every knob but those decided after the search (``persistent_workers``) is equal.
        """
        return all(getattr(self, k) == getattr(other, k) for k in RECORDED if k not in NOT_A_CANDIDATE)

    def label(self) -> str:
        """The configuration as short text, as the reports show it.

        Returns:
            str: e.g. ``"workers=4 prefetch=2 threads=8 pin"``: the worker count and prefetch always, the other
            knobs when not their default.
        """
        parts = []
        for knob in KNOBS:
            value = getattr(self, knob.name) if knob.recorded else knob.off
            if knob.label is not None and value != knob.off and (knob.always or value != knob.default):
                parts.append(knob.label(value))
        return " ".join(parts)

    def to_dict(self) -> dict:
        """The configuration as plain JSON data.

        Returns:
            dict: One entry per field; ``from_dict`` reads it back.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LoaderConfig":
        """Rebuild a configuration from what ``to_dict`` returned.

        Args:
            data: A mapping of field names to values.

        Returns:
            LoaderConfig: The configuration.

        Raises:
            ValueError: An unknown field, or a value out of range.
            TypeError: A missing ``num_workers``, or a flag that is not a bool.
        """
        unknown = set(data) - set(RECORDED)
        if unknown:
            raise ValueError(f"unknown LoaderConfig fields {sorted(unknown)}")
        return cls(**data)


def make_config(num_workers: int, *, fixed: Mapping[str, Any], **chosen: Any) -> LoaderConfig:
    """The configuration with ``num_workers`` and the knobs ``chosen`` (by the search), the user's ``fixed`` ones,
    and every other knob's default; worker-only knobs ``off`` without workers."""
    values: Dict[str, Any] = {}
    for knob in KNOBS:
        if not knob.recorded or knob.name == "num_workers":
            continue
        value = chosen[knob.name] if chosen.get(knob.name) is not None else fixed.get(knob.name, knob.default)
        values[knob.name] = knob.off if knob.worker_only and num_workers == 0 else value
    return LoaderConfig(num_workers, **values)
