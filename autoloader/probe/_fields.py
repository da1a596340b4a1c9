"""Reading a saved profile's JSON fields strictly: a field of the wrong kind raises ``ValueError`` naming it (a
corrupt profile is refused, never half read)."""
from __future__ import annotations

import math
from typing import AbstractSet, Literal, Optional, overload


def json_object(value: object, where: str, keys: AbstractSet[str]) -> dict:
    """``value`` when it is a JSON object with exactly ``keys``."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(value).__name__}")
    if set(value) != keys:
        raise ValueError(f"{where} has keys {sorted(value)}, expected {sorted(keys)}")
    return value


@overload
def int_field(d: dict, key: str, where: str, *, optional: Literal[False]) -> int: ...
@overload
def int_field(d: dict, key: str, where: str, *, optional: bool = ...) -> Optional[int]: ...


def int_field(d: dict, key: str, where: str, *, optional: bool = True) -> Optional[int]:
    value = d[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}.{key} must be an int >= 0{' or null' if optional else ''}, got {value!r}")
    return value


@overload
def num_field(d: dict, key: str, where: str, *, optional: Literal[False]) -> float: ...
@overload
def num_field(d: dict, key: str, where: str, *, optional: bool = ...) -> Optional[float]: ...


def num_field(d: dict, key: str, where: str, *, optional: bool = True) -> Optional[float]:
    value = d[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{where}.{key} must be a finite number >= 0{' or null' if optional else ''}, "
                         f"got {value!r}")
    return float(value)


@overload
def str_field(d: dict, key: str, where: str, *, optional: Literal[False]) -> str: ...
@overload
def str_field(d: dict, key: str, where: str, *, optional: bool = ...) -> Optional[str]: ...


def str_field(d: dict, key: str, where: str, *, optional: bool = True) -> Optional[str]:
    value = d[key]
    if (value is None and optional) or isinstance(value, str):
        return value
    raise ValueError(f"{where}.{key} must be a string{' or null' if optional else ''}, got {value!r}")
