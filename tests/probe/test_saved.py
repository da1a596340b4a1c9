"""The machine profile saved beside the cache and read back (autoloader.probe.saved): a round trip, a corrupt file
refused with a warning at the caller, and the saved disk figures lent to a profile without its own."""
from __future__ import annotations

import dataclasses
import json

import pytest

from autoloader.errors import AutoloaderWarning
from autoloader.probe import load_profile, save_profile, with_saved_disk
from helpers import full_profile


def test_save_and_load_profile(tmp_path, cache_dir):
    profile = full_profile()
    path = save_profile(profile, tmp_path)
    assert path == tmp_path / "machine.json"
    assert load_profile(tmp_path) == profile
    assert load_profile(tmp_path / "nothing-here") is None
    assert save_profile(profile) == cache_dir / "machine.json"   # default: AUTOLOADER_CACHE_DIR
    assert load_profile() == profile


@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": 1}), "\xff\xfe"])
def test_load_corrupt_profile_warns_and_returns_none(tmp_path, text):
    (tmp_path / "machine.json").write_text(text, encoding="latin-1")
    with pytest.warns(AutoloaderWarning, match="machine profile") as record:
        assert load_profile(tmp_path) is None
    assert record[0].filename == __file__                       # stacklevel points at the caller


def test_a_profile_without_disk_figures_borrows_the_saved_ones(cache_dir):
    measured = full_profile()
    bare = dataclasses.replace(measured, disk=None)
    assert with_saved_disk(bare) is bare  # nothing saved: unchanged
    save_profile(dataclasses.replace(measured, created=1.0))
    assert with_saved_disk(bare).disk == measured.disk and with_saved_disk(bare).created == measured.created
    own = dataclasses.replace(measured, disk=dataclasses.replace(measured.disk, path="/elsewhere"))
    assert with_saved_disk(own) is own  # its own figures win


def test_save_profile_refuses_what_is_not_a_profile(tmp_path):
    with pytest.raises(TypeError, match="MachineProfile"):
        save_profile({"cpu": 1}, tmp_path)  # type: ignore[arg-type]
