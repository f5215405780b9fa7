"""Field checks for messages off the wire: each names the message, the field and the value.

The scalar checks (``check_str``, ``check_int``, ...) validate one field. The column checks
validate a whole list at once, because every member decodes every quorum at every step: a
list of 256 ids passes ``set(map(type, ...))``, ``max(map(len, ...))`` and ``min``/``max`` in
a few C-level passes (~60 µs for a 256-member quorum on this machine), where a check per
field per member in Python costs ~3 µs per member. Only when a fast pass fails does the check
walk the list in Python, to name the first bad element with the scalar check's message.
"""

from __future__ import annotations

import math
from typing import Any

from lighthouse.errors import ProtocolError


def check_str(msg: str, name: str, value: Any, max_chars: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {value!r}; expected a string")
    if not value and not allow_empty:
        raise ProtocolError(f"{msg}.{name} is empty; expected a non-empty string")
    if len(value) > max_chars:
        raise ProtocolError(
            f"{msg}.{name} is {len(value)} characters long; the limit is {max_chars}"
        )
    return value


def check_choice(msg: str, name: str, value: Any, choices: frozenset[str]) -> str:
    """One of a closed set of short strings (a kind, a code)."""
    check_str(msg, name, value, 64)
    if value not in choices:
        raise ProtocolError(f"{msg}.{name} is {value!r}; expected one of {sorted(choices)}")
    return value


def check_int(msg: str, name: str, value: Any, lo: int, hi: int = 2**62) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {value!r}; expected an integer")
    if not lo <= value <= hi:
        raise ProtocolError(f"{msg}.{name} is {value}; expected {lo} <= {name} <= {hi}")
    return value


def check_float(msg: str, name: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {value!r}; expected a number")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise ProtocolError(f"{msg}.{name} is {value}; expected {lo} <= {name} <= {hi}")
    return float(value)


def check_bool(msg: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {value!r}; expected a boolean")
    return value


def check_list(msg: str, name: str, value: Any, length: int | None = None) -> list[Any]:
    """A list, of ``length`` elements when given (every column of a message has one length)."""
    if not isinstance(value, list):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__}; expected a list")
    if length is not None and len(value) != length:
        raise ProtocolError(f"{msg}.{name} has {len(value)} elements; expected {length}, one per member")
    return value


def check_str_column(
    msg: str, name: str, value: Any, length: int | None, max_chars: int, allow_empty: bool = False
) -> tuple[str, ...]:
    column = check_list(msg, name, value, length)
    try:
        "".join(column)  # TypeError unless every element is a str: the cheapest C-level pass
    except TypeError:
        pass
    else:
        if not column or max(map(len, column)) <= max_chars and (allow_empty or all(column)):
            return tuple(column)
    for i, element in enumerate(column):
        check_str(msg, f"{name}[{i}]", element, max_chars, allow_empty)
    raise AssertionError("unreachable: the fast pass failed, so some element must")


def check_int_column(msg: str, name: str, value: Any, length: int, lo: int, hi: int = 2**62) -> tuple[int, ...]:
    # type(x) is int excludes bool, as check_int does.
    column = check_list(msg, name, value, length)
    if not column or set(map(type, column)) == {int} and lo <= min(column) and max(column) <= hi:
        return tuple(column)
    for i, element in enumerate(column):
        check_int(msg, f"{name}[{i}]", element, lo, hi)
    raise AssertionError("unreachable: the fast pass failed, so some element must")


def check_map(msg: str, name: str, value: Any) -> dict[str, Any]:
    """A map with string keys (msgpack's ``strict_map_key`` already limits keys to str or bytes)."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__}; expected a map")
    for key in value:
        if not isinstance(key, str):
            raise ProtocolError(f"{msg}.{name} has a key {key!r}; keys must be strings")
    return value


def check_bytes_column(msg: str, name: str, value: Any, length: int, max_bytes: int) -> tuple[bytes, ...]:
    column = check_list(msg, name, value, length)
    if not column or set(map(type, column)) == {bytes} and max(map(len, column)) <= max_bytes:
        return tuple(column)
    for i, element in enumerate(column):
        if type(element) is not bytes:
            raise ProtocolError(f"{msg}.{name}[{i}] is {type(element).__name__}; expected bytes (msgpack bin)")
        if len(element) > max_bytes:
            raise ProtocolError(f"{msg}.{name}[{i}] is {len(element)} bytes; the limit is {max_bytes}")
    raise AssertionError("unreachable: the fast pass failed, so some element must")
