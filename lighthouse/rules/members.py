"""What the lighthouse's membership records about each member, and what it reports.

Plain records, split from membership.py (the state machine that changes them): a member's
session, cadence and budget share; a member lost; a quorum formed (the status page's history).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from lighthouse.errors import DuplicateReplica, QuorumTooLarge
from lighthouse.rules.liveness import (
    GAP_WINDOW,
    LivenessRules,
    Silence,
    beyond_limit,
    silence_limit,
)
from lighthouse.wire.fence import FenceRequest, FenceResponse

logger = logging.getLogger(__name__)

ENTRY_OVERHEAD_BYTES = 24
"""A member's entry in an encoded quorum beyond its id, address and data: msgpack headers,
step, world size."""


@dataclass(slots=True)
class MemberState:
    replica_id: str
    session: int
    address: str
    world_size: int
    step: int
    progress: int
    registered_at: float
    last_heartbeat: float
    """When the session last carried anything (a heartbeat or a quorum request)."""
    last_progress: float
    quorum_id: int = -1
    """The last quorum that included this member during this session."""
    newcomer: bool = False
    """Never in a quorum, in this session or before it (quorum.py's majority guard)."""
    instance: str = ""
    """The client instance that opened the session (a reconnect keeps it, a new process not)."""
    heartbeat_interval_s: float = 0.0
    """The interval its client heartbeats a quiet stream at, as it declared (0: unknown)."""
    healing: bool = False
    """Its last heartbeat said it heals: its silence limit is the ceiling (liveness.py)."""
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAP_WINDOW))
    """The last gaps between the session's messages (liveness.py)."""
    num_gaps: int = 0
    entry_bytes: int = 0
    """What this member adds to a quorum, encoded (its budget share)."""
    limit: tuple[tuple[int, float, LivenessRules, bool], Silence] | None = None
    """Its silence limit, and the (gaps seen, interval, rules, healing) it was computed for: it changes
    only when the member is heard, while the tick asks every quiet member on every tick (at
    1,024 members recomputing it, a max over the gaps and a reason string each, took ~1.4 ms
    of every 20 ms tick)."""

    def silent_too_long(self, now: float, rules: LivenessRules, allowance_s: float = 0.0) -> Silence | None:
        """The silence limit this member has exceeded at ``now`` (liveness.is_silent_too_long), or None."""
        silent_s = now - self.last_heartbeat
        if silent_s <= rules.hung_min_s + allowance_s:  # below any limit: the common case, nothing to compute
            return None
        key = (self.num_gaps, self.heartbeat_interval_s, rules, self.healing)
        if self.limit is None or self.limit[0] != key:
            self.limit = key, silence_limit(self.gaps, self.num_gaps, self.heartbeat_interval_s, rules, self.healing)
        return beyond_limit(silent_s, self.limit[1], allowance_s)

    def heard_heartbeat(self, step: int, progress: int, healing: bool, now: float) -> None:
        """A heartbeat: heard, at this step and progress; a change of its healing declaration
        is logged (liveness.py)."""
        self.heard(now)
        if healing != self.healing:
            self.healing = healing
            logger.info(
                "replica %s %s healing at step %d: its silence limit is %s",
                self.replica_id,
                "is" if healing else "is done",
                step,
                "the heartbeat timeout" if healing else "adaptive again",
            )
        if (step, progress) != (self.step, self.progress):
            self.step, self.progress, self.last_progress = step, progress, now

    def heard(self, now: float) -> None:
        self.gaps.append(now - self.last_heartbeat)
        self.num_gaps += 1
        self.last_heartbeat = now


@dataclass(frozen=True, slots=True)
class Lost:
    replica_id: str
    session: int
    reason: str
    quorum_id: int
    graceful: bool = False
    """It left cleanly (announced in its last heartbeat) rather than failed."""
    step: int = -1
    """Graceful: the steps it had committed when it left."""


@dataclass(frozen=True, slots=True)
class QuorumRecord:
    quorum_id: int
    participants: tuple[str, ...]
    created_unix_s: float
    path: str
    reason: str


def entry_bytes(replica_id: str, address: str, data: bytes) -> int:
    """An upper bound of a member's entry in an encoded quorum."""
    return len(replica_id) + len(address.encode()) + len(data) + ENTRY_OVERHEAD_BYTES


def duplicate_refusal(old: MemberState, replica_id: str, instance: str, now: float, peer: str) -> DuplicateReplica:
    """The error for a second live process registering under ``old``'s replica id."""
    return DuplicateReplica(
        f"replica id {replica_id!r} is already held by a live session (client instance {old.instance!r}, at "
        f"{old.address!r}, heard {now - old.last_heartbeat:.2f}s ago, at step {old.step}); this one (instance "
        f"{instance!r}{', from ' + peer if peer else ''}) is refused. Two processes are using one replica id: give "
        "each replica group its own REPLICAFT_REPLICA_ID, or stop the other process"
    )


def budget_refusal(replica_id: str, address: str, entry: int, total: int, members: int, budget: int) -> QuorumTooLarge:
    """The error for a join whose quorum entry of ``entry`` bytes would take the ``members``'
    total to ``total``, past the ``budget`` of one gRPC message."""
    return QuorumTooLarge(
        f"replica {replica_id!r} asks to join with a {entry}-byte quorum entry (data of "
        f"{entry - entry_bytes(replica_id, address, b'')} bytes), which would make a quorum of "
        f"the {members} members {total} bytes, over the {budget}-byte budget "
        f"that one gRPC message allows; send less data per member (on average "
        f"{budget // max(members, 1)} bytes an entry fit) or run fewer groups"
    )


def fence_answer(member: MemberState | None, current_quorum_id: int | None, req: FenceRequest) -> FenceResponse:
    """A group may commit only while its quorum is the current one and it is in it."""
    if member is None:
        return FenceResponse(False, f"replica {req.replica_id!r} has no live session (declared lost)")
    if current_quorum_id != req.quorum_id:
        return FenceResponse(False, f"quorum {req.quorum_id} is not current (current: {current_quorum_id})")
    if member.quorum_id != req.quorum_id:
        return FenceResponse(False, f"replica {req.replica_id!r} is not a member of quorum {req.quorum_id}")
    return FenceResponse(True)
