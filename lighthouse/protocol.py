"""The wire protocol between managers and the lighthouse: messages, encoding, validation.

Every message is a msgpack map carrying ``"v": PROTOCOL_VERSION`` and travels through gRPC
generic handlers as raw bytes, so there is no protoc step and no generated code. This module
is the only place that knows the schema: servers and clients call ``decode_*`` and
``encode`` and never touch a raw dict.

Validation is strict because the lighthouse is shared by every group of a job: a field of
the wrong type, out of range or too long is rejected with a :class:`ProtocolError` that
names the message, the field and the value, and the server keeps serving the others.
Nothing here can execute code from the wire (msgpack, never pickle).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

from lighthouse.errors import ProtocolError, VersionMismatch

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change; both sides refuse a peer speaking another version."""

SERVICE = "replicaft.Lighthouse"
SESSION_METHOD = f"/{SERVICE}/Session"
QUORUM_METHOD = f"/{SERVICE}/Quorum"
FENCE_METHOD = f"/{SERVICE}/Fence"

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC receive limit; a quorum of 1024 members with small ``data`` maps fits comfortably."""

MAX_ID_CHARS = 128
MAX_ADDRESS_CHARS = 256
MAX_DATA_BYTES = 16 * 1024
"""Per-member opaque ``data`` (store and state-server addresses per group rank)."""

MAX_WORLD_SIZE = 65536
MAX_TIMEOUT_S = 24 * 3600.0

NoticeKind = Literal["registered", "member_lost", "member_left", "quorum_formed", "fenced"]
NOTICE_KINDS: frozenset[str] = frozenset({"registered", "member_lost", "member_left", "quorum_formed", "fenced"})
"""``member_lost``: a member failed (survivors abandon in-flight collectives with it);
``member_left``: a member shut down cleanly after finishing its step (nothing to abandon)."""


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


def check_data(msg: str, name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{msg}.{name} is {type(value).__name__}; expected a map")
    for key in value:
        if not isinstance(key, str):
            raise ProtocolError(f"{msg}.{name} has a key {key!r}; keys must be strings")
    size = len(msgpack.packb(value))
    if size > MAX_DATA_BYTES:
        raise ProtocolError(f"{msg}.{name} is {size} bytes encoded; the limit is {MAX_DATA_BYTES}")
    return value


def unpack(raw: bytes, msg: str) -> dict[str, Any]:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"{msg}: expected bytes, got {type(raw).__name__}")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{msg} is {len(raw)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    try:
        obj = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True
        )
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"{msg} is not valid msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise ProtocolError(f"{msg} must be a msgpack map, got {type(obj).__name__}")
    version = obj.get("v")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"{msg} speaks protocol version {version!r}; this side speaks version "
            f"{PROTOCOL_VERSION}. Run the same replicaft release on the lighthouse and the "
            "managers."
        )
    return obj


def require(obj: Mapping[str, Any], msg: str, name: str) -> Any:
    if name not in obj:
        raise ProtocolError(f"{msg}.{name} is missing")
    return obj[name]


def encode(message: Any) -> bytes:
    """Encode any message dataclass of this module (with its version tag) as msgpack."""
    body = dataclasses.asdict(message)
    body["v"] = PROTOCOL_VERSION
    return msgpack.packb(body, use_bin_type=True)


@dataclass(frozen=True, slots=True)
class Register:
    """First message of a session stream: who this replica group is."""

    replica_id: str
    address: str
    world_size: int
    step: int
    last_quorum_id: int = -1
    """Highest quorum id this group has seen, so a restarted lighthouse never reuses ids."""

    @classmethod
    def decode(cls, raw: bytes) -> Register:
        m = "Register"
        o = unpack(raw, m)
        return cls(
            replica_id=check_str(m, "replica_id", require(o, m, "replica_id"), MAX_ID_CHARS),
            address=check_str(m, "address", require(o, m, "address"), MAX_ADDRESS_CHARS, True),
            world_size=check_int(m, "world_size", require(o, m, "world_size"), 1, MAX_WORLD_SIZE),
            step=check_int(m, "step", require(o, m, "step"), 0),
            last_quorum_id=check_int(m, "last_quorum_id", o.get("last_quorum_id", -1), -1),
        )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Sent on the session stream; ``progress`` counts calls the training loop made.

    The lighthouse records, in its own clock, when (step, progress) last changed. A group
    whose process is alive but whose training loop is stuck stops changing it, which is how
    "hung" is told apart from "slow".
    """

    step: int
    progress: int
    leaving: bool = False
    """The last heartbeat of a clean shutdown: the group finished its step and is leaving, so
    its peers must not abandon the collectives they are finishing with it."""

    @classmethod
    def decode(cls, raw: bytes) -> Heartbeat:
        m = "Heartbeat"
        o = unpack(raw, m)
        return cls(
            step=check_int(m, "step", require(o, m, "step"), 0),
            progress=check_int(m, "progress", require(o, m, "progress"), 0),
            leaving=check_bool(m, "leaving", o.get("leaving", False)),
        )


@dataclass(frozen=True, slots=True)
class Notice:
    """Server-pushed event on a session stream."""

    kind: str
    quorum_id: int = -1
    replica_id: str = ""
    """The subject: the member that was lost or fenced (empty for quorum notices)."""
    reason: str = ""
    incarnation: int = 0

    @classmethod
    def decode(cls, raw: bytes) -> Notice:
        m = "Notice"
        o = unpack(raw, m)
        kind = check_str(m, "kind", require(o, m, "kind"), 32)
        if kind not in NOTICE_KINDS:
            raise ProtocolError(f"Notice.kind is {kind!r}; expected one of {sorted(NOTICE_KINDS)}")
        return cls(
            kind=kind,
            quorum_id=check_int(m, "quorum_id", o.get("quorum_id", -1), -1),
            replica_id=check_str(m, "replica_id", o.get("replica_id", ""), MAX_ID_CHARS, True),
            reason=check_str(m, "reason", o.get("reason", ""), 4096, True),
            incarnation=check_int(m, "incarnation", o.get("incarnation", 0), 0),
        )


@dataclass(frozen=True, slots=True)
class QuorumRequest:
    """Long poll: join the next quorum; answered when a quorum containing the caller forms."""

    replica_id: str
    step: int
    address: str
    world_size: int
    timeout_s: float
    shrink_only: bool = False
    commit_failures: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def decode(cls, raw: bytes) -> QuorumRequest:
        m = "QuorumRequest"
        o = unpack(raw, m)
        return cls(
            replica_id=check_str(m, "replica_id", require(o, m, "replica_id"), MAX_ID_CHARS),
            step=check_int(m, "step", require(o, m, "step"), 0),
            address=check_str(m, "address", require(o, m, "address"), MAX_ADDRESS_CHARS, True),
            world_size=check_int(m, "world_size", require(o, m, "world_size"), 1, MAX_WORLD_SIZE),
            timeout_s=check_float(m, "timeout_s", require(o, m, "timeout_s"), 0.0, MAX_TIMEOUT_S),
            shrink_only=check_bool(m, "shrink_only", o.get("shrink_only", False)),
            commit_failures=check_int(m, "commit_failures", o.get("commit_failures", 0), 0),
            data=check_data(m, "data", o.get("data", {})),
        )


@dataclass(frozen=True, slots=True)
class Member:
    """One participant of a quorum as every member sees it."""

    replica_id: str
    address: str
    step: int
    world_size: int
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Quorum:
    """A formed quorum. Identical bytes go to every member; each derives its own plan."""

    quorum_id: int
    incarnation: int
    created_unix_s: float
    participants: tuple[Member, ...]

    @property
    def replica_ids(self) -> tuple[str, ...]:
        return tuple(p.replica_id for p in self.participants)

    def member(self, replica_id: str) -> Member | None:
        for p in self.participants:
            if p.replica_id == replica_id:
                return p
        return None

    @classmethod
    def decode(cls, raw: bytes) -> Quorum:
        m = "Quorum"
        o = unpack(raw, m)
        parts = require(o, m, "participants")
        if not isinstance(parts, list):
            raise ProtocolError(f"Quorum.participants is {type(parts).__name__}; expected a list")
        members = []
        for i, p in enumerate(parts):
            pm = f"Quorum.participants[{i}]"
            if not isinstance(p, dict):
                raise ProtocolError(f"{pm} is {type(p).__name__}; expected a map")
            members.append(
                Member(
                    replica_id=check_str(pm, "replica_id", require(p, pm, "replica_id"), MAX_ID_CHARS),
                    address=check_str(pm, "address", require(p, pm, "address"), MAX_ADDRESS_CHARS, True),
                    step=check_int(pm, "step", require(p, pm, "step"), 0),
                    world_size=check_int(pm, "world_size", require(p, pm, "world_size"), 1, MAX_WORLD_SIZE),
                    data=check_data(pm, "data", p.get("data", {})),
                )
            )
        return cls(
            quorum_id=check_int(m, "quorum_id", require(o, m, "quorum_id"), 0),
            incarnation=check_int(m, "incarnation", require(o, m, "incarnation"), 0),
            created_unix_s=check_float(m, "created_unix_s", require(o, m, "created_unix_s"), 0.0, 1e12),
            participants=tuple(members),
        )


@dataclass(frozen=True, slots=True)
class FenceRequest:
    """Asked before a group commits: is ``quorum_id`` still this group's current quorum?"""

    replica_id: str
    quorum_id: int
    step: int

    @classmethod
    def decode(cls, raw: bytes) -> FenceRequest:
        m = "FenceRequest"
        o = unpack(raw, m)
        return cls(
            replica_id=check_str(m, "replica_id", require(o, m, "replica_id"), MAX_ID_CHARS),
            quorum_id=check_int(m, "quorum_id", require(o, m, "quorum_id"), 0),
            step=check_int(m, "step", require(o, m, "step"), 0),
        )


@dataclass(frozen=True, slots=True)
class FenceResponse:
    ok: bool
    reason: str = ""

    @classmethod
    def decode(cls, raw: bytes) -> FenceResponse:
        m = "FenceResponse"
        o = unpack(raw, m)
        return cls(
            ok=check_bool(m, "ok", require(o, m, "ok")),
            reason=check_str(m, "reason", o.get("reason", ""), 4096, True),
        )
