"""One candidate's record (``TrialResult``): what it measured, or why it did not run, round-tripped through plain
JSON; and its row in a tuning's table."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Literal, Mapping, Optional, Tuple

from .._text import rate
from ..config import LoaderConfig
from ..probe._pools import NativePool, limit_held

TrialStatus = Literal["ok", "skipped", "failed"]
TRIAL_STATUSES: Tuple[str, ...] = ("ok", "skipped", "failed")


@dataclass(frozen=True)
class TrialResult:
    """What one candidate configuration measured, or why it did not run: one row of ``print(loader.tuning)``.

    A candidate is a trial before training, or online a slice of your own epoch. Rates are steady-state: start-up
    (``startup_s``) and the burst of batches the workers prefetched during it are left out (NOTE [ Trial timing ] in
    ``autoloader/measure/run.py``). Per-worker figures are None without workers or where the platform does not report
    them; a candidate that was skipped holds only its ``config``, ``status``, ``reason`` and ``footprint_bytes``.

    Attributes:
        config (LoaderConfig): The configuration measured.
        status (str): ``"ok"`` (measured), ``"skipped"`` (not started, or stopped at its first batch: it would not
            fit the memory budget, ``/dev/shm`` or what is left of the time budget) or ``"failed"`` (a worker died, it
            ran past its time limit, too few batches, too many open files...).
        reason (str): Why it was skipped or failed, or why an ok rate is not a steady measurement, in words (e.g. ``"memory: ... over the memory budget of ..."``,
            ``"worker killed (SIGKILL, usually the out-of-memory killer)"``); None when ok.
        samples_per_s (float): Samples per second over the timed window; None when nothing was measured.
        batches (int): Batches in the timed window.
        window_s (float): Seconds the timed window spanned.
        startup_s (float): Seconds from starting the DataLoader's iterator to its first batch (forking or spawning
            the workers, their first batch); None when no batch came.
        elapsed_s (float): Seconds the whole candidate took, start-up and window.
        stall_fraction (float): The share of the window the consumer spent waiting for data, 0 to 1.
        fetch_s_per_batch (float): Seconds per batch spent waiting inside ``next()``.
        fetch_cpu_s_per_batch (float): CPU seconds per batch the main process spent inside ``next()`` (without
            workers: the cost of loading a batch).
        fetch_delay_s_per_batch (float): Of ``fetch_s_per_batch``, the time the measuring thread waited for a CPU
            (run-queue wait, not waiting for data); None where the kernel does not say.
        consumer_s_per_batch (float): Seconds per batch the step took (the simulated or your real one).
        consumer_cpu_s_per_batch (float): CPU seconds per batch this process spent in the step, every thread of it
            (a step on the CPU runs torch's intra-op pool: up to the usable CPUs per second of step); the CPUs the
            step takes from the workers (``capacity.step_cpus`` in ``autoloader/search/capacity.py``).
        worker_cpu_util (float): How busy each worker kept a CPU, 0 to 1 (CPU time over wall time, per worker).
        main_cpu_util (float): How busy the main process kept a CPU during the window.
        other_cpus (float): The CPUs other processes kept busy during the window, on average: the machine's other load
            on the CPUs this process may use (its busy time less this process's and its workers'); None where the
            platform does not say.
        read_bytes_per_batch (float): Bytes the workers read from storage per batch.
        worker_rss_bytes (int): The largest worker's resident memory at the window's end.
        worker_uss_bytes (int): One worker's private memory (USS) at the window's end: the mean of the workers read.
        worker_uss_growth_bytes (int): The most one worker's USS grew from its first batch to the window's end
            (copy-on-read, PyTorch issue 13246).
        batch_bytes (int): Bytes of one batch's tensors.
        steady (bool): False when the window was cut short (inside the start-up burst, or too few batches): the rate
            is then a lower bound counted from the start, shown as "not steady".
        worker_uss_total_bytes (int): The workers' memory: the sum of their USS at the window's end.
        footprint_bytes (int): What the configuration takes of the memory budget (NOTE [ Memory budget ] in
            ``autoloader/search/memory.py``): from its own measurements when it ran, predicted when it was skipped;
            None when unknown.
        worker_copied_bytes (int): What one worker copied of the pages it shared with the main process, from its first
            batch to the window's end (copy-on-read: NOTE [ Copy-on-read forecast ] in
            ``autoloader/search/memory.py``); None with one worker, or where Linux's ``/proc/<pid>/pagemap`` could
            not be read.
        worker_copied_run_bytes (int): Of ``worker_copied_bytes``, the pages next to another copied one (what the
            worker wrote, such as new objects in inherited free space: they grow linearly, not up to a span).
        worker_copy_span_bytes (int): Of what that worker shared at its first batch, the bytes within the address span
            its copies fell in: the inherited objects its reads copy from, the most that copying can reach.
        worker_shared_bytes (int): What that worker shared with the main process at its first batch: the most it can
            ever copy.
        drained (bool): An online candidate's window with workers: whether the loop waited for a batch in it
            (``window_rule.DRAIN_WAIT_S``: the workers' queue ran dry, so the rate is theirs); False when every batch
            came from the queue, so the rate is the loop's pace while the prefetched batches lasted, and what the
            workers make in the long run is the model's (``online_policy.sustained``). None otherwise.
        native_pools (tuple of NativePool): The native thread pools one of its workers found, and kept under
            ``config.native_threads`` (NOTE [ Native thread pools ] in ``autoloader/loader/native.py``); None
            without workers, or when unknown (no threadpoolctl).
    """

    config: LoaderConfig
    status: TrialStatus = "ok"
    reason: Optional[str] = None
    samples_per_s: Optional[float] = None
    batches: int = 0
    window_s: float = 0.0
    startup_s: Optional[float] = None
    elapsed_s: float = 0.0
    stall_fraction: Optional[float] = None
    fetch_s_per_batch: Optional[float] = None
    fetch_cpu_s_per_batch: Optional[float] = None
    fetch_delay_s_per_batch: Optional[float] = None
    consumer_s_per_batch: Optional[float] = None
    consumer_cpu_s_per_batch: Optional[float] = None
    worker_cpu_util: Optional[float] = None
    main_cpu_util: Optional[float] = None
    other_cpus: Optional[float] = None
    read_bytes_per_batch: Optional[float] = None
    worker_rss_bytes: Optional[int] = None
    worker_uss_bytes: Optional[int] = None
    worker_uss_growth_bytes: Optional[int] = None
    batch_bytes: Optional[int] = None
    steady: bool = True
    worker_uss_total_bytes: Optional[int] = None
    footprint_bytes: Optional[int] = None
    native_pools: Optional[Tuple[NativePool, ...]] = None
    worker_copied_bytes: Optional[int] = None
    worker_copied_run_bytes: Optional[int] = None
    worker_copy_span_bytes: Optional[int] = None
    worker_shared_bytes: Optional[int] = None
    drained: Optional[bool] = None

    @property
    def ok(self) -> bool:
        """True when it ran and measured a rate (``status == "ok"`` and ``samples_per_s`` is not None)."""
        return self.status == "ok" and self.samples_per_s is not None

    @property
    def native_limit_held(self) -> Optional[bool]:
        """Whether its workers' native pools were seen held to ``config.native_threads`` (``probe._pools.limit_held``):
        None without workers or without a limit; False when they were not (their pools unknown: threadpoolctl
        missing; or one kept more threads)."""
        return None if self.config.num_workers == 0 else limit_held(self.config.native_threads, self.native_pools)

    @property
    def worker_memory_bytes(self) -> Optional[int]:
        """The workers' memory: the sum of their USS (0 without worker processes: threads of the main process have
        none of their own); None when not measured."""
        if self.config.num_workers == 0:
            return 0
        if self.worker_uss_total_bytes is not None:
            return self.worker_uss_total_bytes
        return None if self.worker_uss_bytes is None else self.worker_uss_bytes * self.config.num_workers

    def to_dict(self) -> dict:
        """The trial as plain JSON data.

        Returns:
            dict: One entry per field, ``config`` and ``native_pools`` as dicts; ``from_dict`` reads it back.
        """
        data = dataclasses.asdict(self)
        data["config"] = self.config.to_dict()
        data["native_pools"] = None if self.native_pools is None else [p.to_dict() for p in self.native_pools]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrialResult":
        """Rebuild a trial from what ``to_dict`` returned.

        Args:
            data: The mapping ``to_dict`` made, as JSON gives it back.

        Returns:
            TrialResult: The trial it holds.

        Raises:
            KeyError: ``data`` has no ``config``.
            ValueError: An unknown field, a bad ``status``, ``native_pools`` that is not a list, or a configuration
                value out of range.
            TypeError: A configuration flag that is not a bool, or a field of the wrong kind.
        """
        data = dict(data)
        data["config"] = LoaderConfig.from_dict(data["config"])
        if data.get("native_pools") is not None:
            if not isinstance(data["native_pools"], (list, tuple)):
                raise ValueError(f"native_pools must be a list of pools, got {data['native_pools']!r}")
            data["native_pools"] = tuple(NativePool.from_dict(p) for p in data["native_pools"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown TrialResult fields {sorted(unknown)}")
        if data.get("status", "ok") not in TRIAL_STATUSES:
            raise ValueError(f"bad trial status {data.get('status')!r}")
        return cls(**data)



def trial_row(trial: TrialResult, best: Optional[float], chosen: bool, *, threads: bool, native: bool,
               memory: bool, footprint: bool) -> List[str]:
    """One candidate's row of a tuning's table (``tune_result.format_tune_result``): ``best`` the best rate (its
    "vs best" column), ``chosen`` its ``*``; the flags say which optional columns the table shows."""
    c = trial.config
    if trial.ok:
        status = "ok" if trial.steady else f"ok ({trial.reason or 'short window, not steady'})"
    else:
        status = f"{trial.status}: {trial.reason or 'no reason recorded'}"
    pct = (lambda x: "-" if x is None else f"{100 * x:.0f}")
    used = trial.worker_memory_bytes if trial.ok else None
    measured = trial.samples_per_s if trial.ok else None  # never None when ok
    return ["*" if chosen else "", str(c.num_workers), *([str(c.threads)] if threads else []),
            "-" if c.prefetch_factor is None else str(c.prefetch_factor),
            "yes" if c.pin_memory else "no", *([_native_cell(trial)] if native else []),
            rate(measured),
            f"{100 * measured / best:.0f}%" if measured is not None and best else "-",
            "-" if trial.startup_s is None else f"{trial.startup_s:.2f}",
            pct(trial.stall_fraction if trial.ok else None),
            pct(trial.worker_cpu_util if c.num_workers else None),
            *([("-" if used is None else f"{used / (1 << 20):,.0f}")] if memory else []),
            *([_mib_cell(trial.footprint_bytes)] if footprint else []), status]


def _native_cell(trial: TrialResult) -> str:
    """The native threads column: the limit (``N?`` when a measured candidate's workers were not seen held to it:
    ``TrialResult.native_limit_held``), ``off`` for workers without one, ``-`` without workers."""
    config = trial.config
    if config.num_workers == 0:
        return "-"
    if config.native_threads is None:
        return "off"
    return f"{config.native_threads}?" if trial.ok and trial.native_limit_held is False else str(config.native_threads)


def _mib_cell(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / (1 << 20):,.0f}"
