"""What a doctor check returns and how the findings print (autoloader.cli.findings)."""
from __future__ import annotations

from autoloader.cli.findings import Finding, format_findings


def test_the_findings_print_counted_with_each_fix_under_its_check():
    text = format_findings([Finding("CPUs", "ok", "8 usable"), Finding("/dev/shm", "fail", "64 MiB", "--shm-size=8g"),
                            Finding("ulimit -n", "warn", "1024", "ulimit -n 65536"), Finding("GPUs", "info", "none")])
    lines = text.splitlines()
    assert lines[0] == "autotune doctor: 1 problem(s), 1 warning(s)"
    assert lines[1] == "  [ok]   CPUs: 8 usable" and lines[2] == "  [fail] /dev/shm: 64 MiB"
    assert lines[3] == "         fix: --shm-size=8g" and lines[-1] == "  [info] GPUs: none" and len(lines) == 7


def test_a_finding_as_json_keeps_every_field():
    assert Finding("GPUs", "info", "none").to_dict() == {"name": "GPUs", "status": "info", "detail": "none", "fix": ""}
