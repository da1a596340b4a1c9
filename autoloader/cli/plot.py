"""PNGs (need the ``plot`` extra, matplotlib): ``--plot``'s samples/s against num_workers for a tuning's trials, and
``plot_online_epoch``'s samples/s over an epoch that tuned online."""
from __future__ import annotations

import bisect
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from ..results import EpochTrace, TuneResult

MISSING = "--plot needs matplotlib: pip install matplotlib (the plot extra: pip install \".[plot]\" in a checkout)"


def available() -> bool:
    """Whether matplotlib can be imported (checked without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def plot_tune_result(result: "TuneResult", path: Union[str, "os.PathLike[str]"], *,
                     title: Optional[str] = None) -> Path:
    """Write a PNG of a tuning's measured rates against ``num_workers`` (``autotune --plot``).

    One series per ``prefetch_factor`` (``num_workers=0`` joins each) and, when threads were tried, per threads per
    process (square markers, dashed), the chosen point ringed, the training step's own rate as a dashed line when
    known.

    Args:
        result (TuneResult): A tuning, e.g. ``loader.tuning`` or what ``tune()`` returned.
        path: The PNG file to write (a str or ``os.PathLike``).
        title (str): The plot's title. Default None: the source and the bottleneck.

    Returns:
        Path: The file written.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``, the ``plot`` extra).
        OSError: ``path`` cannot be written.
    """
    if not available():
        raise ImportError(MISSING)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ok = [(t, t.samples_per_s) for t in result.trials if t.ok and t.samples_per_s is not None]  # ok: measured
    serial = [(0, rate) for t, rate in ok if t.config.num_workers == 0 and t.config.threads == 1]
    series: Dict[Tuple[int, int, bool], List[Tuple[int, float]]] = {}
    for trial, rate in ok:  # one line per threads per process, prefetch_factor and pin_memory
        if trial.config.num_workers or trial.config.threads > 1:
            series.setdefault((trial.config.threads, trial.config.prefetch_factor or 0, trial.config.pin_memory),
                              []).append((trial.config.num_workers, rate))
    fig = Figure(figsize=(7, 4.2), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    pins = {pin for _, _, pin in series}
    threaded = any(threads > 1 for threads, _, _ in series)
    for (threads, prefetch, pin), points in sorted(series.items()):
        points = sorted((serial[:1] if threads == 1 else []) + points)
        label = (f"threads={threads} " if threaded else "") + f"prefetch_factor={prefetch}" + \
            ((" pinned" if pin else " not pinned") if len(pins) > 1 else "")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if threads == 1 else "s",
                linestyle="-" if threads == 1 else "--", label=label)
    if not series and serial:
        ax.plot([0], [serial[0][1]], marker="o", linestyle="", label="num_workers=0")
    if result.samples_per_s is not None and ok:
        ax.plot([result.num_workers], [result.samples_per_s], marker="o", markersize=16, markerfacecolor="none",
                markeredgecolor="black", linestyle="", label=f"chosen: {result.config.label()}")
    if result.consumer_samples_per_s:
        ax.axhline(result.consumer_samples_per_s, color="grey", linestyle="--",
                   label=f"training step alone: {result.consumer_samples_per_s:,.0f} samples/s")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    tops = [rate for _, rate in ok] + [result.consumer_samples_per_s or 0.0]
    ax.set_ylim(0, 1.15 * max(tops) if max(tops) > 0 else 1.0)
    ax.set_title(title or f"autoloader trials ({result.source}, bottleneck: {result.bottleneck or 'unknown'})")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def rolling_rate(batches: Sequence[Tuple[float, int]], *, points: int = 400,
                 width_s: Optional[float] = None) -> Tuple[List[float], List[float], float]:
    """Samples/s over time from ``(seconds, samples)`` per batch: at ``points`` instants from 0 to the last batch,
    the samples that arrived in the ``width_s`` seconds centred there, divided by the seconds of that window that lie
    inside the epoch. ``width_s`` defaults to a 60th of the epoch, at least 8 median batch intervals and at least
    0.1 s. Returns (times, rates, width_s)."""
    if not batches:
        return [], [], 0.0
    times = [t for t, _ in batches]
    end = max(times)
    if width_s is None:
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        median_gap = gaps[len(gaps) // 2] if gaps else 0.0
        width_s = max(end / 60.0, 8.0 * median_gap, 0.1)
    half = width_s / 2.0
    grid = [end * i / (points - 1) for i in range(points)] if points > 1 else [end]
    # prefix sums over the batches in time order: samples arrived up to each instant
    ordered = sorted(batches)
    arrived = [0]
    for _, samples in ordered:
        arrived.append(arrived[-1] + samples)
    stamps = [t for t, _ in ordered]
    rates = []
    for t in grid:
        low, high = max(0.0, t - half), min(end, t + half)
        count = arrived[bisect.bisect_right(stamps, t + half)] - arrived[bisect.bisect_right(stamps, t - half)]
        rates.append(count / (high - low) if high > low else 0.0)
    return grid, rates, width_s


def _switch_gaps(batches: Sequence[Tuple[float, int]],
                 spans: Sequence[Tuple[float, float, str, Optional[float]]]) -> List[Tuple[float, float]]:
    """Per candidate after the first: from the previous candidate's last batch to this one's first (the loop got
    nothing: the old workers stopping, the new ones starting)."""
    times = sorted(t for t, _ in batches)
    gaps = []
    for start, _, _, _ in spans[1:]:
        before = bisect.bisect_right(times, start) - 1
        after = bisect.bisect_left(times, start)
        if before >= 0 and after < len(times):
            gaps.append((times[before], times[after]))
    return gaps


def plot_online_epoch(trace: "EpochTrace", path: Union[str, "os.PathLike[str]"], *,
                      title: Optional[str] = None) -> Path:
    """Write a PNG of one epoch that tuned online: the loop's rolling samples/s over the epoch, each candidate's slice
    shaded and labelled with its configuration and measured rate (a dashed segment at that rate), the switches
    between candidates hatched, and the configuration that served the rest of the epoch.

    Args:
        trace (EpochTrace): The epoch, an entry of ``loader.online_traces`` (``[0]`` is the first epoch's).
        path: The PNG file to write (a str or ``os.PathLike``).
        title (str): The plot's title. Default None: the epoch, its slices and samples.

    Returns:
        Path: The file written.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``, the ``plot`` extra).
        OSError: ``path`` cannot be written.
    """
    if not available():
        raise ImportError(MISSING)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    spans = list(trace.spans)
    times, rates, width = rolling_rate(trace.batches)
    fig = Figure(figsize=(10, 5.4), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    top = max([r for _, _, _, r in spans if r is not None] + rates + [1.0])
    end = max([e for _, e, _, _ in spans] + [times[-1] if times else 0.0] + [1e-3])
    ax.set_xlim(0, end)
    chosen_label = _draw_slices(ax, spans, top=top, end=end)
    gaps = _switch_gaps(trace.batches, spans)
    for start, stop in gaps:
        ax.axvspan(start, stop, facecolor="none", edgecolor="#444444", hatch="////", linewidth=0)
    ax.plot(times, rates, color="black", linewidth=1.2)
    arrivals = [t for t, _ in trace.batches]
    ax.plot(arrivals, [0.015 * top] * len(arrivals), linestyle="", marker="|", markersize=5, color="#333333",
            alpha=0.35)
    _legend(ax, width=width, gaps=gaps, chosen_label=chosen_label)
    ax.set_xlabel(f"seconds since the epoch started (epoch {trace.epoch})")
    ax.set_ylabel("samples/s")
    samples = sum(n for _, n in trace.batches)
    ax.set_title(title or f"online tuning, epoch {trace.epoch}: {len(spans)} slices, {samples:,} samples in "
                          f"{end:.1f} s")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def _draw_slices(ax: Any, spans: List[Tuple[float, float, str, Optional[float]]], *, top: float,
                 end: float) -> Optional[str]:
    """Shade and label each candidate's slice (its measured rate dashed); returns the chosen configuration's label,
    the one that served the rest of the epoch."""
    measured_labels = {label for _, _, label, rate in spans if rate is not None}
    palette = ["#4C72B0", "#DD8452", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD"]
    colours: Dict[str, str] = {}
    chosen_label: Optional[str] = None
    labels = []
    for index, (start, stop, label, rate) in enumerate(spans):
        words = label.split()
        if rate is None and label in measured_labels:
            colour, lines = "#55A868", ["chosen:"] + words + ["rest of the epoch"]
            chosen_label = label
        elif rate is None:
            colour = colours.setdefault(label, palette[len(colours) % len(palette)])
            lines = words + ["not measured:", "epoch ended"] if index == len(spans) - 1 else words + ["failed"]
        else:
            colour = colours.setdefault(label, palette[len(colours) % len(palette)])
            lines = words + [f"{rate:,.0f}/s"]
            ax.plot([start, stop], [rate, rate], color=colour, linestyle="--", linewidth=1.6)
        ax.axvspan(start, stop, color=colour, alpha=0.16, linewidth=0)
        ax.axvline(start, color="#666666", linewidth=0.6)
        # about 125 characters of 8 pt text fill the axes' width: too narrow a slice gets its label turned
        fits = (stop - start) / end >= (max(len(line) for line in lines) + 1) / 125.0
        if fits:
            text = "\n".join(lines)
        else:
            text = " ".join(line for line in lines if line != "rest of the epoch").replace("prefetch=", "pf=")
            text = text.replace("not measured: epoch ended", "(cut by the epoch's end)")
        labels.append(((start + stop) / 2.0, text, fits))
    # head room above the rates for the labels: a turned one runs down about 1.6 % of the axes' height a character
    share = 0.016 * max((len(text) for _, text, fits in labels if not fits), default=0)
    room = min(0.8, max(0.32, share / (1 - share))) if share < 1 else 0.8
    ax.set_ylim(0, (1 + room) * top)
    for x, text, fits in labels:
        ax.text(x, (1 + room) * top * 0.985, text, ha="center", va="top", fontsize=8 if fits else 7,
                rotation=0 if fits else 90, color="#222222")
    return chosen_label


def _legend(ax: Any, *, width: float, gaps: List[Tuple[float, float]], chosen_label: Optional[str]) -> None:
    from matplotlib.patches import Patch

    switch_s = sum(stop - start for start, stop in gaps)
    handles = [_line(f"loop's samples/s (rolling {width:.2g} s)", "black", "-"),
               _line("measured rate of a candidate (its timed window)", "#4C72B0", "--"),
               _line("a batch reaches the loop", "#333333", "", marker="|")]
    if gaps:
        handles.append(Patch(facecolor="none", edgecolor="#444444", hatch="////",
                             label=f"switch: no batch while workers stop and start ({switch_s:.1f} s in all)"))
    if chosen_label is not None:
        handles.append(Patch(facecolor="#55A868", alpha=0.3, label=f"chosen: {chosen_label}"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize="small",
              frameon=False)


def _line(label: str, colour: str, style: str, marker: Optional[str] = None) -> Any:
    """A legend entry for a line (or a marker)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color=colour, linestyle=style or "none", marker=marker, label=label)
