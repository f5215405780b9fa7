"""Protocol Buffers encoding of the few etcd v3 messages the replicated lighthouse sends.

etcd's v3 API is gRPC with protobuf bodies (etcd's ``api/etcdserverpb/rpc.proto`` and
``api/mvccpb/kv.proto``). The lighthouse needs a dozen of its messages (Range, Put, Txn with
Compare, LeaseGrant/Revoke/KeepAlive) and a handful of fields in each, so instead of a
protobuf runtime and generated code it writes and reads the wire format directly: every
field is a tag varint ``(number << 3) | wire type`` followed by a varint (ints, bools,
enums) or a length-prefixed blob (bytes, strings, nested messages). Encoders emit fields in
number order and skip defaults, as protobuf does; decoders keep the fields they know and
skip the rest by wire type, so a newer etcd adding fields is read fine.

Field numbers are those of etcd 3.4's rpc.proto (unchanged since 3.0 for what is used here).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(ValueError):
    """A reply from etcd could not be decoded (truncated or not the message expected)."""


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives take ten bytes, two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    return b"" if not value else _varint(number << 3 | _VARINT) + _varint(int(value))


def _bytes_field(number: int, value: bytes) -> bytes:
    return b"" if not value else _varint(number << 3 | _LEN) + _varint(len(value)) + value


def _message_field(number: int, body: bytes) -> bytes:
    """A nested message: present even when empty (a oneof member must be sent)."""
    return _varint(number << 3 | _LEN) + _varint(len(body)) + body


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint in a reply from etcd")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) for every field; varints as int (int64 sign restored)."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            value, pos = _read_varint(data, pos)
            yield number, value - (1 << 64) if value >= 1 << 63 else value
        elif kind == _LEN:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise WireError("truncated field in a reply from etcd")
            yield number, data[pos : pos + size]
            pos += size
        elif kind in (_I64, _I32):
            pos += 8 if kind == _I64 else 4
        else:
            raise WireError(f"unknown protobuf wire type {kind} in a reply from etcd")


# -- requests ---------------------------------------------------------------------------------


def range_request(key: bytes, range_end: bytes = b"", *, serializable: bool = False) -> bytes:
    return _bytes_field(1, key) + _bytes_field(2, range_end) + _int_field(7, serializable)


def put_request(key: bytes, value: bytes, lease: int = 0) -> bytes:
    return _bytes_field(1, key) + _bytes_field(2, value) + _int_field(3, lease)


def delete_range_request(key: bytes) -> bytes:
    return _bytes_field(1, key)


EQUAL, GREATER, LESS, NOT_EQUAL = 0, 1, 2, 3
"""Compare.result"""
VERSION, CREATE, MOD, VALUE = 0, 1, 2, 3
"""Compare.target"""
_TARGET_FIELD = {VERSION: 4, CREATE: 5, MOD: 6}


@dataclass(frozen=True, slots=True)
class Compare:
    """A guard of a transaction: ``target`` of ``key`` compared with ``value`` by ``result``."""

    key: bytes
    target: int
    result: int
    value: int

    def encode(self) -> bytes:
        # The oneof value is sent even when zero: "create_revision == 0" (key absent) must
        # carry its zero, or etcd could not tell which member of the union is meant.
        number = _TARGET_FIELD[self.target]
        return (
            _int_field(1, self.result)
            + _int_field(2, self.target)
            + _bytes_field(3, self.key)
            + _varint(number << 3 | _VARINT)
            + _varint(self.value)
        )


def request_op_put(put: bytes) -> bytes:
    return _message_field(2, put)


def request_op_range(range_: bytes) -> bytes:
    return _message_field(1, range_)


def request_op_delete(delete: bytes) -> bytes:
    return _message_field(3, delete)


def txn_request(compare: Sequence[Compare], success: Sequence[bytes], failure: Sequence[bytes] = ()) -> bytes:
    return (
        b"".join(_message_field(1, c.encode()) for c in compare)
        + b"".join(_message_field(2, op) for op in success)
        + b"".join(_message_field(3, op) for op in failure)
    )


def lease_grant_request(ttl_s: int) -> bytes:
    return _int_field(1, ttl_s)


def lease_id_request(lease_id: int) -> bytes:
    """LeaseRevokeRequest and LeaseKeepAliveRequest: both carry only the ID, as field 1."""
    return _int_field(1, lease_id)


# -- replies ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    value: bytes = b""
    lease: int = 0


def key_value(data: bytes) -> KeyValue:
    found: dict[int, int | bytes] = dict(_fields(data))
    return KeyValue(
        key=_as_bytes(found.get(1, b"")),
        create_revision=_as_int(found.get(2, 0)),
        mod_revision=_as_int(found.get(3, 0)),
        version=_as_int(found.get(4, 0)),
        value=_as_bytes(found.get(5, b"")),
        lease=_as_int(found.get(6, 0)),
    )


def header_revision(header: bytes) -> int:
    return _as_int(dict(_fields(header)).get(3, 0))


@dataclass(frozen=True, slots=True)
class RangeResponse:
    revision: int
    kvs: list[KeyValue] = field(default_factory=list)


def range_response(data: bytes) -> RangeResponse:
    revision, kvs = 0, []
    for number, value in _fields(data):
        if number == 1:
            revision = header_revision(_as_bytes(value))
        elif number == 2:
            kvs.append(key_value(_as_bytes(value)))
    return RangeResponse(revision, kvs)


@dataclass(frozen=True, slots=True)
class TxnResponse:
    revision: int
    succeeded: bool
    ranges: list[RangeResponse] = field(default_factory=list)
    """The range results among the responses, in order (the others carry nothing we read)."""


def txn_response(data: bytes) -> TxnResponse:
    revision, succeeded, ranges = 0, False, []
    for number, value in _fields(data):
        if number == 1:
            revision = header_revision(_as_bytes(value))
        elif number == 2:
            succeeded = bool(value)
        elif number == 3:
            for op_number, op in _fields(_as_bytes(value)):
                if op_number == 1:
                    ranges.append(range_response(_as_bytes(op)))
    return TxnResponse(revision, succeeded, ranges)


def revision_only(data: bytes) -> int:
    """The store revision in the header of a Put, DeleteRange or LeaseRevoke reply."""
    return header_revision(_as_bytes(dict(_fields(data)).get(1, b"")))


@dataclass(frozen=True, slots=True)
class LeaseReply:
    """LeaseGrantResponse and LeaseKeepAliveResponse: ID 2, TTL 3 (TTL <= 0: no such lease)."""

    lease_id: int
    ttl_s: int
    error: str = ""


def lease_reply(data: bytes) -> LeaseReply:
    found = dict(_fields(data))
    error = found.get(4, b"")
    return LeaseReply(_as_int(found.get(2, 0)), _as_int(found.get(3, 0)), _as_bytes(error).decode(errors="replace"))


def _as_int(value: int | bytes) -> int:
    if not isinstance(value, int):
        raise WireError(f"expected a varint field from etcd, got {len(value)} bytes")
    return value


def _as_bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise WireError(f"expected a length-delimited field from etcd, got the number {value}")
    return value
