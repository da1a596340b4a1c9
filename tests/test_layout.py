"""The test tree itself: pytest imports each test module by its file name (no packages under tests/), so two test
files of one name in different folders would break the default run's collection; it must not happen again."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_modules_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
