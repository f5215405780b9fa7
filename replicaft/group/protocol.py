"""Messages between a group's ranks and the group's manager server (hosted by group rank 0).

Same plumbing as the lighthouse (gRPC generic handlers, lighthouse/wire/envelope.py's msgpack
envelope and field checks); the answers to ``Quorum`` and the pushed notices reuse the lighthouse's
own :class:`~lighthouse.wire.protocol.Quorum` and :class:`~lighthouse.wire.protocol.Notice` encodings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lighthouse.wire.envelope import (
    MAX_TIMEOUT_S,
    check_bool,
    check_data,
    check_float,
    check_int,
    check_str,
    require,
    unpack,
)

SERVICE = "replicaft.GroupManager"
QUORUM_METHOD = f"/{SERVICE}/Quorum"
VOTE_METHOD = f"/{SERVICE}/Vote"
WATCH_METHOD = f"/{SERVICE}/Watch"
MAX_GROUP_RANKS = 65536


@dataclass(frozen=True, slots=True)
class GroupQuorumRequest:
    group_rank: int
    step: int
    timeout_s: float
    commit_failures: int = 0
    rank_data: dict[str, Any] = field(default_factory=dict)
    """This rank's addresses (rendezvous store, state server), published in the quorum."""

    @classmethod
    def decode(cls, raw: bytes) -> GroupQuorumRequest:
        m = "GroupQuorumRequest"
        o = unpack(raw, m)
        return cls(
            group_rank=check_int(m, "group_rank", require(o, m, "group_rank"), 0, MAX_GROUP_RANKS),
            step=check_int(m, "step", require(o, m, "step"), 0),
            timeout_s=check_float(m, "timeout_s", require(o, m, "timeout_s"), 0.0, MAX_TIMEOUT_S),
            commit_failures=check_int(m, "commit_failures", o.get("commit_failures", 0), 0),
            rank_data=check_data(m, "rank_data", o.get("rank_data", {})),
        )


@dataclass(frozen=True, slots=True)
class VoteRequest:
    group_rank: int
    step: int
    quorum_id: int
    ok: bool
    reason: str = ""
    timeout_s: float = 10.0
    leaving: bool = False
    """This rank was asked to stop (SIGTERM): the whole group leaves at this step's boundary."""

    @classmethod
    def decode(cls, raw: bytes) -> VoteRequest:
        m = "VoteRequest"
        o = unpack(raw, m)
        return cls(
            group_rank=check_int(m, "group_rank", require(o, m, "group_rank"), 0, MAX_GROUP_RANKS),
            step=check_int(m, "step", require(o, m, "step"), 0),
            quorum_id=check_int(m, "quorum_id", require(o, m, "quorum_id"), 0),
            ok=check_bool(m, "ok", require(o, m, "ok")),
            reason=check_str(m, "reason", o.get("reason", ""), 4096, True),
            timeout_s=check_float(m, "timeout_s", o.get("timeout_s", 10.0), 0.0, MAX_TIMEOUT_S),
            leaving=check_bool(m, "leaving", o.get("leaving", False)),
        )


@dataclass(frozen=True, slots=True)
class VoteResponse:
    commit: bool
    reason: str
    leave: bool = False
    """Some rank voted ``leaving``: every rank leaves at this boundary, so the ranks of a group
    stop (and, for the writer group, save) at the same step even when SIGTERM reached them
    on different sides of a step boundary."""

    @classmethod
    def decode(cls, raw: bytes) -> VoteResponse:
        m = "VoteResponse"
        o = unpack(raw, m)
        return cls(
            commit=check_bool(m, "commit", require(o, m, "commit")),
            reason=check_str(m, "reason", o.get("reason", ""), 16384, True),
            leave=check_bool(m, "leave", o.get("leave", False)),
        )


@dataclass(frozen=True, slots=True)
class WatchRequest:
    group_rank: int

    @classmethod
    def decode(cls, raw: bytes) -> WatchRequest:
        m = "WatchRequest"
        o = unpack(raw, m)
        return cls(group_rank=check_int(m, "group_rank", require(o, m, "group_rank"), 0, MAX_GROUP_RANKS))
