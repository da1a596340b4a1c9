"""``--plot``: samples/s against num_workers for a tuning's trials, as a PNG (needs the ``plot`` extra, matplotlib)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:
    from ..results import TuneResult

MISSING = "install autoloader[plot] (matplotlib) for --plot"


def available() -> bool:
    """Whether matplotlib can be imported (checked without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def plot_tune_result(result: "TuneResult", path: Union[str, "os.PathLike[str]"], *,
                     title: Optional[str] = None) -> Path:
    """Write a PNG of the ok trials' rates: one series per prefetch_factor (``num_workers=0`` joins each), the chosen
    point ringed, the consumer's own rate as a dashed line when known. Raises ``ImportError`` without matplotlib."""
    if not available():
        raise ImportError(MISSING)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ok = [t for t in result.trials if t.ok]
    serial = [(t.config.num_workers, t.samples_per_s) for t in ok if t.config.num_workers == 0]
    series: Dict[Tuple[int, bool], List[Tuple[int, float]]] = {}
    for trial in ok:
        if trial.config.num_workers:
            series.setdefault((trial.config.prefetch_factor or 0, trial.config.pin_memory), []).append(
                (trial.config.num_workers, trial.samples_per_s))
    fig = Figure(figsize=(7, 4.2), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    pins = {pin for _, pin in series}
    for (prefetch, pin), points in sorted(series.items()):
        points = sorted(serial[:1] + points)
        label = f"prefetch_factor={prefetch}" + ((" pinned" if pin else " not pinned") if len(pins) > 1 else "")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
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
    tops = [t.samples_per_s for t in ok] + [result.consumer_samples_per_s or 0.0]
    ax.set_ylim(0, 1.15 * max(tops) if max(tops) > 0 else 1.0)
    ax.set_title(title or f"autoloader trials ({result.source}, bottleneck: {result.bottleneck or 'unknown'})")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    out = Path(path)
    fig.savefig(out, format="png")
    return out
