"""The fence exchange: before a group commits a step, may it (is its quorum still current)?

A group asks with :class:`FenceRequest` on the unary ``Fence`` method (``FENCE_METHOD`` in
protocol.py, beside the service's other methods) and is answered with :class:`FenceResponse`:
yes, or no with the reason (declared lost, the quorum superseded, not a member of it), which
lighthouse/rules/members.py decides. Validated as every lighthouse message is (protocol.py):
a bad field is a :class:`~lighthouse.errors.ProtocolError` naming the message, the field and
the value.
"""

from __future__ import annotations

from dataclasses import dataclass

from lighthouse.wire.envelope import MAX_REASON_CHARS, check_bool, check_int, check_str, require, unpack
from lighthouse.wire.replica_id import check_replica_id


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
            replica_id=check_replica_id(require(o, m, "replica_id"), where=f"{m}.replica_id"),
            quorum_id=check_int(m, "quorum_id", require(o, m, "quorum_id"), 0),
            step=check_int(m, "step", require(o, m, "step"), 0),
        )


@dataclass(frozen=True, slots=True)
class FenceResponse:
    """The lighthouse's answer: ``ok`` to commit, or not, with the reason."""

    ok: bool
    reason: str = ""

    @classmethod
    def decode(cls, raw: bytes) -> FenceResponse:
        m = "FenceResponse"
        o = unpack(raw, m)
        return cls(
            ok=check_bool(m, "ok", require(o, m, "ok")),
            reason=check_str(m, "reason", o.get("reason", ""), MAX_REASON_CHARS, True),
        )
