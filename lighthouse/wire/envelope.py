"""The envelope every replicaft control message travels in, and the checks of its fields.

A message is a msgpack map carrying ``"v": PROTOCOL_VERSION``, sent through gRPC generic
handlers as raw bytes (no protoc step, no generated code). This module is that plumbing, and
nothing else: unpacking with size and version checks, encoding a message dataclass, and the
field checks that name the message, the field and the value. The lighthouse's messages
(protocol.py) and the group manager's (replicaft/group/protocol.py) are both built on it, as
are the heal wire's manifest and requests; none of them touches msgpack or a raw dict for
anything this module does. Nothing here can execute code from the wire (msgpack, never
pickle).

The scalar checks (``check_str``, ``check_int``, ...) validate one field. The column checks
validate a whole list at once, because every member decodes every quorum at every step: a
list of 256 ids passes ``set(map(type, ...))``, ``max(map(len, ...))`` and ``min``/``max`` in
a few C-level passes (~60 µs for a 256-member quorum on this machine), where a check per
field per member in Python costs ~3 µs per member. Only when a fast pass fails does the check
walk the list in Python, to name the first bad element with the scalar check's message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import msgpack

from lighthouse.errors import ProtocolError, VersionMismatch, shown
from lighthouse.wire.replica_id import MAX_REPLICA_ID_CHARS

PROTOCOL_VERSION = 4
"""Bumped on any incompatible change; both sides refuse a peer speaking another version.
Version 2: quorums travel on the session stream, and a quorum is encoded by column.
Version 3: a quorum on an unchanged roster travels as a QuorumUpdate (lighthouse/wire/replies.py).
Version 4: a quorum may stand for further steps, and a member that asks before they ran out
ends the standing for the others with a ``standing_ended`` notice (lighthouse/rules/standing.py)."""

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC receive limit; a quorum of 1024 members with small ``data`` maps fits comfortably."""

MAX_ID_CHARS = MAX_REPLICA_ID_CHARS
MAX_ADDRESS_CHARS = 256
MAX_DATA_BYTES = 16 * 1024
"""Per-member opaque ``data`` (store and state-server addresses per group rank)."""

MAX_WORLD_SIZE = 65536
MAX_REASON_CHARS = 4096
MAX_TIMEOUT_S = 24 * 3600.0


def check_data(msg: str, name: str, value: Any) -> dict[str, Any]:
    check_map(msg, name, value)
    size = len(msgpack.packb(value))
    if size > MAX_DATA_BYTES:
        raise ProtocolError(f"{msg}.{name} is {size} bytes encoded; the limit is {MAX_DATA_BYTES}")
    return value


def unpack_data(msg: str, name: str, raw: bytes) -> dict[str, Any]:
    """A member's ``data`` map from its msgpack bytes, as carried in a :class:`Quorum`."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"{msg}.{name} is not valid msgpack ({type(e).__name__}: {e})") from e
    return check_map(msg, name, value)


def unpack(raw: bytes, msg: str) -> dict[str, Any]:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"{msg}: expected bytes, got {type(raw).__name__}")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{msg} is {len(raw)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"{msg} is not valid msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise ProtocolError(f"{msg} must be a msgpack map, got {type(obj).__name__}")
    version = obj.get("v")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"{msg} speaks protocol version {shown(version)}; this side speaks version "
            f"{PROTOCOL_VERSION}. Run the same replicaft release on the lighthouse and the "
            "managers."
        )
    return obj


def require(obj: Mapping[str, Any], msg: str, name: str) -> Any:
    if name not in obj:
        raise ProtocolError(f"{msg}.{name} is missing")
    return obj[name]


def encode(message: Any) -> bytes:
    """Encode any message dataclass of this module (with its version and type tags) as msgpack.

    Fields are taken as they are, not deep-copied (``dataclasses.asdict`` copied every map
    of a quorum's ``data``): msgpack writes tuples as arrays and never changes its input.
    """
    body = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    tag = getattr(type(message), "TAG", None)
    if tag is not None:
        body["t"] = tag
    body["v"] = PROTOCOL_VERSION
    return msgpack.packb(body, use_bin_type=True)


def check_str(msg: str, name: str, value: Any, max_chars: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {shown(value)}; expected a string")
    if not value and not allow_empty:
        raise ProtocolError(f"{msg}.{name} is empty; expected a non-empty string")
    if len(value) > max_chars:
        raise ProtocolError(f"{msg}.{name} is {len(value)} characters long; the limit is {max_chars}")
    return value


def check_choice(msg: str, name: str, value: Any, choices: frozenset[str]) -> str:
    """One of a closed set of short strings (a kind, a code)."""
    check_str(msg, name, value, 64)
    if value not in choices:
        raise ProtocolError(f"{msg}.{name} is {value!r}; expected one of {sorted(choices)}")
    return value


def check_int(msg: str, name: str, value: Any, lo: int, hi: int = 2**62) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {shown(value)}; expected an integer")
    if not lo <= value <= hi:
        raise ProtocolError(f"{msg}.{name} is {value}; expected {lo} <= {name} <= {hi}")
    return value


def check_float(msg: str, name: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {shown(value)}; expected a number")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise ProtocolError(f"{msg}.{name} is {value}; expected {lo} <= {name} <= {hi}")
    return float(value)


def check_bool(msg: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__} {shown(value)}; expected a boolean")
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
            raise ProtocolError(f"{msg}.{name} has a key {shown(key)}; keys must be strings")
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
