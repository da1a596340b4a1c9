"""One cache entry file read back and checked (autoloader.cache.entry): what ``read_json`` refuses unread, and what
``parse_entry`` refuses in the JSON. The store's handling of each (a warning, a log line, a listing) is in
test_store.py."""
from __future__ import annotations

import json
import os
import threading

import pytest

from autoloader.cache.entry import MAX_ENTRY_BYTES, BadEntry, OldSchema, parse_entry, read_json
from autoloader.cache.fingerprint import SCHEMA_VERSION
from autoloader.config import LoaderConfig
from autoloader.results import TuneResult

KEY = "0123456789abcdef0123456789abcdef"


def _entry(**changes):
    result = TuneResult(config=LoaderConfig(2, 2), samples_per_s=100.0, bottleneck="cpu", source="tuned")
    data = {"schema": SCHEMA_VERSION, "key": KEY, "created": 1700000000.5, "meta": {"dataset": "Images"},
            "result": result.to_dict()}
    data.update(changes)
    return data


def test_read_json_reads_an_entry_and_says_when_there_is_none(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"a": [1, 2]}))
    assert read_json(path) == {"a": [1, 2]}
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError):
        read_json(path / "under_a_file.json")


def test_read_json_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(pytest.raises(BadEntry, read_json, fifo).value),
                              daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "read_json blocked on a FIFO"
    assert "not a regular file" in str(outcome[0])


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe not text", "not UTF-8"),
    (b'{"schema": 1, ', "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_read_json_names_what_is_wrong_with_the_bytes(tmp_path, content, words):
    path = tmp_path / "e.json"
    path.write_bytes(content)
    with pytest.raises(BadEntry, match=words):
        read_json(path)


def test_read_json_refuses_a_directory_and_a_file_too_large_to_be_an_entry(tmp_path):
    with pytest.raises(BadEntry, match="directory"):
        read_json(tmp_path)
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(MAX_ENTRY_BYTES + 1)
    with pytest.raises(BadEntry, match=f"{MAX_ENTRY_BYTES + 1} bytes"):
        read_json(big)


def test_parse_entry_gives_created_meta_and_the_result_with_its_creation_time():
    created, meta, result = parse_entry(KEY, _entry())
    assert created == 1700000000.5 and meta == {"dataset": "Images"}
    assert result.config == LoaderConfig(2, 2) and result.created == 1700000000.5
    assert parse_entry(KEY, _entry(meta={}, created=None))[:2] == (None, {})


def test_parse_entry_tells_an_older_schema_from_a_bad_entry():
    with pytest.raises(OldSchema, match="earlier autoloader"):
        parse_entry(KEY, _entry(schema=SCHEMA_VERSION - 1))
    with pytest.raises(BadEntry) as newer:
        parse_entry(KEY, _entry(schema=SCHEMA_VERSION + 1))
    assert not isinstance(newer.value, OldSchema)


@pytest.mark.parametrize("data, words", [
    ([1, 2], "not an autoloader cache entry"),
    ({"schema": SCHEMA_VERSION}, "not an autoloader cache entry"),
    (_entry(schema=True), "schema is True"),
    (_entry(key="f" * 32), "not the key its name says"),
    (_entry(created="yesterday"), "created time"),
    (_entry(created=False), "created time"),
    (_entry(meta=[1]), "meta field"),
    (_entry(result="tuned"), "result field"),
    (_entry(result={"config": {"num_workers": -1}}), "result is malformed"),
])
def test_parse_entry_refuses_what_is_not_an_entry_for_this_key(data, words):
    with pytest.raises(BadEntry, match=words):
        parse_entry(KEY, data)
