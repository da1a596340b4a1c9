"""Text helpers every report shares: bytes in MiB, rates, times and aligned columns ("unknown" for a figure not
known). Imports nothing of autoloader's, so the records, the search and the command line all use it."""
from __future__ import annotations

import time
from typing import List, Optional, Sequence

UNKNOWN = "unknown"


def mib(n: float) -> str:
    """Bytes in MiB, with one decimal below 10 MiB: "1.5 MiB", "1,024 MiB"."""
    value = n / (1 << 20)
    return f"{value:.1f} MiB" if value < 10 else f"{value:,.0f} MiB"


def rate(x: Optional[float]) -> str:
    """A rate in samples/s as a whole number with thousands separators; "-" when not measured."""
    return "-" if x is None else f"{x:,.0f}"


def when(created: Optional[float]) -> str:
    """A creation time (seconds since the epoch) as local "YYYY-MM-DD HH:MM"; "unknown" when None."""
    return UNKNOWN if created is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(created))


def grid(headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = ()) -> List[str]:
    """Rows under headers, columns right-aligned except those in ``left`` (the last column is never padded)."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [c if i == len(cells) - 1 else (c.ljust(widths[i]) if i in left else c.rjust(widths[i]))
                 for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    return [line(headers)] + [line(r) for r in rows]
