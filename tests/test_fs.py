"""Where autoloader keeps its files and how it writes them (autoloader._fs)."""
from __future__ import annotations

import json
import os

import pytest

from autoloader import _fs


def test_the_cache_directory_follows_the_variables_in_order(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOLOADER_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _fs.default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("AUTOLOADER_CACHE_DIR")
    assert _fs.default_cache_dir() == tmp_path / "xdg" / "autoloader"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _fs.default_cache_dir() == tmp_path / "home" / ".cache" / "autoloader"


def test_an_atomic_write_replaces_a_symlink_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("untouched")
    link = tmp_path / "sub" / "entry.json"
    link.parent.mkdir()
    link.symlink_to(target)
    _fs.atomic_write_json(link, {"b": 1, "a": [1, 2]})
    assert target.read_text() == "untouched" and not link.is_symlink()
    assert json.loads(link.read_text()) == {"a": [1, 2], "b": 1} and link.read_text().endswith("\n")
    assert os.listdir(link.parent) == ["entry.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path, monkeypatch):
    path = tmp_path / "entry.json"
    _fs.atomic_write_json(path, {"v": 1})

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_fs.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        _fs.atomic_write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1} and os.listdir(tmp_path) == ["entry.json"]
