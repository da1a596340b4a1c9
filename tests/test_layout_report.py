"""scripts/layout_report.py's line counter: the code lines issue 62 compares before and after are counted by one rule
(``code_lines``): docstrings, blanks and comments alone on their line are not code."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _report():
    spec = importlib.util.spec_from_file_location("layout_report", ROOT / "scripts" / "layout_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""A module's docstring,
on two lines."""
import os  # a comment after code: the line counts once

# a comment alone


def f(x):
    """f's docstring."""
    text = """a string that is a value,
    not a docstring"""
    return (x,
            text)


LIMIT = 3
"""An attribute's docstring."""
'''


def test_code_lines_leave_out_docstrings_blanks_and_lone_comments():
    report = _report()
    assert report.code_lines(SOURCE) == 7  # import, def, the two-line string, the two-line return, LIMIT
    assert report.code_lines(SOURCE, comments=True) == 8
    assert report.code_lines("") == 0 and report.code_lines('"""Only a docstring."""\n') == 0
