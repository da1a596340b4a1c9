"""What a doctor check returns (``Finding``: its verdict, what was found, the fix) and the findings as text."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

Status = Literal["ok", "warn", "fail", "info"]


@dataclass(frozen=True)
class Finding:
    """One check's verdict: ``detail`` says what was found, ``fix`` what to do about it (empty when nothing)."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def format_findings(findings: Sequence[Finding]) -> str:
    """Doctor findings: one block per check with its status, what was found and the fix."""
    counts = {s: sum(1 for f in findings if f.status == s) for s in ("fail", "warn")}
    lines = [f"autotune doctor: {counts['fail']} problem(s), {counts['warn']} warning(s)"]
    for finding in findings:
        lines.append(f"  {('[' + finding.status + ']').ljust(6)} {finding.name}: {finding.detail}")
        if finding.fix:
            lines.append(f"  {' ' * 6} fix: {finding.fix}")
    return "\n".join(lines)
