"""The Ray tests (``test_ray*.py``, and those marked ``ray``) start Ray clusters, which takes seconds and several
processes each: they run only when the run names this folder or one of its files (``python -m pytest
tests/integrations``, as CI's integration step runs it), so the default run never imports Ray, installed or not."""
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _named(config) -> bool:
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if collection_path.name.startswith("test_ray") and not _named(config):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    if _named(config):
        return
    skip = pytest.mark.skip(reason="starts Ray: run with python -m pytest tests/integrations")
    for item in items:
        if "ray" in item.keywords and HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)
