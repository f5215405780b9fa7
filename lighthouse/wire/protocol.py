"""The wire protocol between managers and the lighthouse: its messages and their validation.

Each message is a frozen dataclass that knows its own fields; the envelope they travel in
(msgpack, the version tag, size limits) and the field checks are lighthouse/wire/envelope.py. This
module and fence.py (the commit fence's request and answer) are the only places that know the
lighthouse's schema: servers and clients call ``decode_*`` and ``envelope.encode`` and never
touch a raw dict.

Validation is strict because the lighthouse is shared by every group of a job: a field of
the wrong type, out of range or too long is rejected with a :class:`ProtocolError` that
names the message, the field and the value, and the server keeps serving the others. A
replica id must also fit lighthouse/wire/replica_id.py's alphabet, since it names log lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgpack

from lighthouse.errors import ProtocolError, shown
from lighthouse.rules.commit_lease import MAX_COMMIT_LEASE_S
from lighthouse.rules.standing import MAX_STANDING_STEPS
from lighthouse.wire.envelope import (
    MAX_ADDRESS_CHARS,
    MAX_DATA_BYTES,
    MAX_ID_CHARS,
    MAX_REASON_CHARS,
    MAX_TIMEOUT_S,
    MAX_WORLD_SIZE,
    check_bool,
    check_bytes_column,
    check_choice,
    check_data,
    check_float,
    check_int,
    check_int_column,
    check_str,
    check_str_column,
    require,
    unpack,
    unpack_data,
)
from lighthouse.wire.replica_id import check_replica_id, check_replica_id_column

SERVICE = "replicaft.Lighthouse"
SESSION_METHOD = f"/{SERVICE}/Session"
QUORUM_METHOD = f"/{SERVICE}/Quorum"
FENCE_METHOD = f"/{SERVICE}/Fence"

NoticeKind = Literal["registered", "member_lost", "member_left", "quorum_formed", "fenced"]
NOTICE_KINDS: frozenset[str] = frozenset(
    {"registered", "member_lost", "member_left", "quorum_formed", "fenced", "standing_ended", "lease"}
)
"""``member_lost``: a member failed (survivors abandon in-flight collectives with it);
``member_left``: a member shut down cleanly after finishing its step (nothing to abandon);
``standing_ended``: a member asked for a new quorum while its quorum stood (standing.py): the
others abandon their step on that quorum, which could not complete without it; ``lease``: a
replicated leader renewed its lease (``Notice.lease_s``; lighthouse/client/leader_watch.py)."""


def _check_address(msg: str, name: str, value: Any) -> str:
    """An address: it is written into lighthouse log lines, so no control characters."""
    check_str(msg, name, value, MAX_ADDRESS_CHARS, True)
    if not value.isprintable():
        raise ProtocolError(f"{msg}.{name} is {value!r}; an address is printable text (host:port)")
    return value


def _optional_replica_id(msg: str, value: Any) -> str:
    """A replica id that may be empty (a notice about no member in particular)."""
    return value if value == "" else check_replica_id(value, where=f"{msg}.replica_id")


def _check_ids(msg: str, name: str, value: Any) -> tuple[str, ...]:
    """The replica ids of a quorum's members: each a valid id, none twice (the message's size bounds the count)."""
    ids = check_str_column(msg, name, value, None, MAX_ID_CHARS)
    check_replica_id_column(msg, name, ids)
    if len(set(ids)) != len(ids):
        twice = next(rid for i, rid in enumerate(ids) if rid in ids[:i])
        raise ProtocolError(f"{msg}.{name} lists {twice!r} more than once; each member appears once")
    return ids


@dataclass(frozen=True, slots=True)
class Register:
    """First message of a session stream: who this replica group is."""

    replica_id: str
    address: str
    world_size: int
    step: int
    last_quorum_id: int = -1
    """Highest quorum id this group has seen, so a restarted lighthouse never reuses ids."""
    last_quorum_members: tuple[str, ...] = ()
    """That quorum's replica ids (empty: unknown), for a restarted lighthouse to wait for (reconnects.py)."""
    instance: str = ""
    """Random per client object: the lighthouse tells a reconnect of this process (same
    instance) from a second process using the same replica id (another instance)."""
    heartbeat_interval_s: float = 0.0
    """How long the stream may be quiet before the client heartbeats: the lighthouse's bound
    on this member's gaps between messages (liveness.py). 0: not declared."""

    @classmethod
    def decode(cls, raw: bytes) -> Register:
        m = "Register"
        o = unpack(raw, m)
        return cls(
            replica_id=check_replica_id(require(o, m, "replica_id"), where=f"{m}.replica_id"),
            address=_check_address(m, "address", require(o, m, "address")),
            world_size=check_int(m, "world_size", require(o, m, "world_size"), 1, MAX_WORLD_SIZE),
            step=check_int(m, "step", require(o, m, "step"), 0),
            last_quorum_id=check_int(m, "last_quorum_id", o.get("last_quorum_id", -1), -1),
            last_quorum_members=_check_ids(m, "last_quorum_members", o.get("last_quorum_members", [])),
            instance=_check_address(m, "instance", o.get("instance", "")),
            heartbeat_interval_s=check_float(
                m, "heartbeat_interval_s", o.get("heartbeat_interval_s", 0.0), 0.0, MAX_TIMEOUT_S
            ),
        )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Sent on the session stream; ``progress`` counts calls the training loop made.

    The lighthouse records, in its own clock, when (step, progress) last changed. A group
    whose process is alive but whose training loop is stuck stops changing it, which is how
    "hung" is told apart from "slow".
    """

    TAG: ClassVar[str] = "heartbeat"
    step: int
    progress: int
    leaving: bool = False
    """The last heartbeat of a clean shutdown: the group finished its step and is leaving, so
    its peers must not abandon the collectives they are finishing with it."""
    healing: bool = False
    """The group is healing: loading the received state may stall it past its adaptive silence
    limit, so the lighthouse holds it to ``heartbeat_timeout_s`` until a heartbeat says
    otherwise (liveness.py). Absent (an older client): False."""

    @classmethod
    def decode(cls, raw: bytes) -> Heartbeat:
        return cls.from_map(unpack(raw, "Heartbeat"))

    @classmethod
    def from_map(cls, o: Mapping[str, Any]) -> Heartbeat:
        m = "Heartbeat"
        return cls(
            step=check_int(m, "step", require(o, m, "step"), 0),
            progress=check_int(m, "progress", require(o, m, "progress"), 0),
            leaving=check_bool(m, "leaving", o.get("leaving", False)),
            healing=check_bool(m, "healing", o.get("healing", False)),
        )


@dataclass(frozen=True, slots=True)
class Notice:
    """Server-pushed event on a session stream."""

    TAG: ClassVar[str] = "notice"
    kind: str
    quorum_id: int = -1
    replica_id: str = ""
    """The subject: the member that was lost or fenced (empty for quorum notices)."""
    reason: str = ""
    incarnation: int = 0
    heartbeat_interval_s: float = 0.0
    """``registered`` and ``quorum_formed``: heartbeat no more often than this (the
    lighthouse's heartbeat budget, liveness.py); 0: no floor."""
    lease_s: float = 0.0
    """``registered`` and ``lease``, from the leader of a replicated set: its lease holds at least
    this long after it sent the notice; a member that hears no newer one by then leaves it. 0:
    no lease (a single lighthouse)."""
    step: int = -1
    """``member_left``: the steps the member had committed when it left (-1: not known); a
    healer whose donors all left can finish its heal at their last step."""

    @classmethod
    def decode(cls, raw: bytes) -> Notice:
        return cls.from_map(unpack(raw, "Notice"))

    @classmethod
    def from_map(cls, o: Mapping[str, Any]) -> Notice:
        m = "Notice"
        return cls(
            kind=check_choice(m, "kind", require(o, m, "kind"), NOTICE_KINDS),
            quorum_id=check_int(m, "quorum_id", o.get("quorum_id", -1), -1),
            replica_id=_optional_replica_id(m, o.get("replica_id", "")),
            reason=check_str(m, "reason", o.get("reason", ""), MAX_REASON_CHARS, True),
            incarnation=check_int(m, "incarnation", o.get("incarnation", 0), 0),
            heartbeat_interval_s=check_float(
                m, "heartbeat_interval_s", o.get("heartbeat_interval_s", 0.0), 0.0, MAX_TIMEOUT_S
            ),
            lease_s=check_float(m, "lease_s", o.get("lease_s", 0.0), 0.0, MAX_TIMEOUT_S),
            step=check_int(m, "step", o.get("step", -1), -1),
        )


@dataclass(frozen=True, slots=True)
class QuorumRequest:
    """Join the next quorum; answered when a quorum containing the caller forms.

    Sent on the member's session stream (and answered there, see :class:`QuorumAnswer`), or
    as the unary ``Quorum`` long poll, which is answered with the encoded :class:`Quorum`.
    """

    TAG: ClassVar[str] = "quorum"
    replica_id: str
    step: int
    address: str
    world_size: int
    timeout_s: float
    shrink_only: bool = False
    commit_failures: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    ask: int = 0
    """Numbers the member's requests on its session stream (from 1), so a late answer to an
    earlier request is never taken for this one's. 0 on the unary RPC, where the call does it."""
    commit_lease_s: float = 0.0
    """The commit lease the member asks for with this quorum (commit_lease.py); 0: none."""

    @classmethod
    def decode(cls, raw: bytes) -> QuorumRequest:
        return cls.from_map(unpack(raw, "QuorumRequest"))

    @classmethod
    def from_map(cls, o: Mapping[str, Any]) -> QuorumRequest:
        m = "QuorumRequest"
        return cls(
            replica_id=check_replica_id(require(o, m, "replica_id"), where=f"{m}.replica_id"),
            step=check_int(m, "step", require(o, m, "step"), 0),
            address=_check_address(m, "address", require(o, m, "address")),
            world_size=check_int(m, "world_size", require(o, m, "world_size"), 1, MAX_WORLD_SIZE),
            timeout_s=check_float(m, "timeout_s", require(o, m, "timeout_s"), 0.0, MAX_TIMEOUT_S),
            shrink_only=check_bool(m, "shrink_only", o.get("shrink_only", False)),
            commit_failures=check_int(m, "commit_failures", o.get("commit_failures", 0), 0),
            data=check_data(m, "data", o.get("data", {})),
            ask=check_int(m, "ask", o.get("ask", 0), 0),
            commit_lease_s=check_float(m, "commit_lease_s", o.get("commit_lease_s", 0.0), 0.0, MAX_COMMIT_LEASE_S),
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
    """A formed quorum. Identical bytes go to every member; each derives its own plan.

    Stored and sent by column (ids, addresses, steps, world sizes, data), in replica id
    order, rather than as a list of member maps: every member decodes the whole quorum at
    every step, and columns validate in a few C-level passes (lighthouse/wire/envelope.py), ~80 µs
    at 256 members where a list of maps took ~700 µs. Each member's ``data`` map stays
    msgpack bytes (type and size checked on decode) until a :class:`Member` is built
    (:attr:`participants`, :meth:`member`), where it is decoded and checked: decoding maps
    allocates objects the garbage collector tracks, which in the benchmark's processes of
    128 members made full collections most of their CPU. Build with :meth:`of` from members.
    """

    quorum_id: int
    incarnation: int
    created_unix_s: float
    replica_ids: tuple[str, ...]
    addresses: tuple[str, ...]
    steps: tuple[int, ...]
    world_sizes: tuple[int, ...]
    data: tuple[bytes, ...]
    """Each member's ``data`` map, msgpack-encoded."""
    max_commit_lease_s: float = 0.0
    """The longest commit lease granted with this quorum: each participant holds the one it
    asked for, up to this (commit_lease.py); 0: none. A lighthouse's option, the same for every
    quorum it forms, so an update on an unchanged roster keeps it (replies.py)."""

    standing_steps: int = 0
    """The steps after this one its participants run on it without asking (standing.py); 0:
    ask at the next step."""

    @classmethod
    def of(
        cls,
        quorum_id: int,
        incarnation: int,
        created_unix_s: float,
        participants: Iterable[Member],
        *,
        max_commit_lease_s: float = 0.0,
        standing_steps: int = 0,
    ) -> Quorum:
        members = tuple(participants)
        return cls(
            quorum_id=quorum_id,
            incarnation=incarnation,
            created_unix_s=created_unix_s,
            replica_ids=tuple(p.replica_id for p in members),
            addresses=tuple(p.address for p in members),
            steps=tuple(p.step for p in members),
            world_sizes=tuple(p.world_size for p in members),
            data=tuple(msgpack.packb(p.data, use_bin_type=True) for p in members),
            max_commit_lease_s=max_commit_lease_s,
            standing_steps=standing_steps,
        )

    @property
    def participants(self) -> tuple[Member, ...]:
        """The members, built on each call (plan_step calls it once per quorum); raises
        ProtocolError naming ``Quorum.data[i]`` if a member's data is not a map."""
        return tuple(self._member(i) for i in range(len(self.replica_ids)))

    def member(self, replica_id: str) -> Member | None:
        if replica_id not in self.replica_ids:
            return None
        return self._member(self.replica_ids.index(replica_id))

    def _member(self, i: int) -> Member:
        data = unpack_data("Quorum", f"data[{i}]", self.data[i])
        return Member(self.replica_ids[i], self.addresses[i], self.steps[i], self.world_sizes[i], data)

    @classmethod
    def decode(cls, raw: bytes) -> Quorum:
        m = "Quorum"
        o = unpack(raw, m)
        ids = _check_ids(m, "replica_ids", require(o, m, "replica_ids"))
        n = len(ids)
        return cls(
            quorum_id=check_int(m, "quorum_id", require(o, m, "quorum_id"), 0),
            incarnation=check_int(m, "incarnation", require(o, m, "incarnation"), 0),
            created_unix_s=check_float(m, "created_unix_s", require(o, m, "created_unix_s"), 0.0, 1e12),
            replica_ids=ids,
            addresses=_check_address_column(m, require(o, m, "addresses"), n),
            steps=check_int_column(m, "steps", require(o, m, "steps"), n, 0),
            world_sizes=check_int_column(m, "world_sizes", require(o, m, "world_sizes"), n, 1, MAX_WORLD_SIZE),
            data=check_bytes_column(m, "data", require(o, m, "data"), n, MAX_DATA_BYTES),
            max_commit_lease_s=check_float(
                m, "max_commit_lease_s", o.get("max_commit_lease_s", 0.0), 0.0, MAX_COMMIT_LEASE_S
            ),
            standing_steps=check_int(m, "standing_steps", o.get("standing_steps", 0), 0, MAX_STANDING_STEPS),
        )


def _check_address_column(msg: str, value: Any, n: int) -> tuple[str, ...]:
    column = check_str_column(msg, "addresses", value, n, MAX_ADDRESS_CHARS, True)
    if not "".join(column).isprintable():
        for i, address in enumerate(column):
            _check_address(msg, f"addresses[{i}]", address)
    return column


def decode_session_request(raw: bytes) -> Heartbeat | QuorumRequest:
    """A message a member sends on its session stream after ``Register``, by its ``t`` tag."""
    return decode_tagged(raw, "SessionRequest", (Heartbeat, QuorumRequest))


def decode_tagged(raw: bytes, msg: str, classes: tuple[Any, ...]) -> Any:
    """The message among ``classes`` that ``raw``'s ``t`` tag names, decoded by its ``from_map``."""
    o = unpack(raw, msg)
    tag = o.get("t")
    for cls in classes:
        if tag == cls.TAG:
            return cls.from_map(o)
    raise ProtocolError(f"{msg}.t is {shown(tag)}; expected one of {[cls.TAG for cls in classes]}")
