"""A saved profile's JSON fields read strictly (autoloader.probe._fields): the wrong kind raises, naming the field."""
from __future__ import annotations

import math

import pytest

from autoloader.probe._fields import int_field, json_object, num_field, str_field


def test_an_object_must_have_exactly_its_keys():
    assert json_object({"a": 1}, "cpu", {"a"}) == {"a": 1}
    with pytest.raises(ValueError, match=r"cpu has keys \['a', 'b'\], expected \['a'\]"):
        json_object({"a": 1, "b": 2}, "cpu", {"a"})
    with pytest.raises(ValueError, match="cpu must be a JSON object, got list"):
        json_object([], "cpu", {"a"})


@pytest.mark.parametrize("read, good, bad", [
    (int_field, [0, 7, None], [True, -1, 1.5, "3"]),
    (num_field, [0, 2.5, 3, None], [True, -0.5, math.inf, math.nan, "1"]),
    (str_field, ["x", "", None], [1, b"x"])])
def test_each_reader_takes_its_kind_or_null_and_names_the_field_otherwise(read, good, bad):
    for value in good:
        assert read({"k": value}, "k", "disk") == value
    for value in bad:
        with pytest.raises(ValueError, match=r"disk\.k must be"):
            read({"k": value}, "k", "disk")
    with pytest.raises(ValueError, match=r"disk\.k must be"):
        read({"k": None}, "k", "disk", optional=False)


def test_a_number_comes_back_as_a_float():
    assert isinstance(num_field({"k": 3}, "k", "cpu"), float)
