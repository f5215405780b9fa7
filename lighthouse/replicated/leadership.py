"""What a lighthouse of a replicated set must know about its leadership, as a seam and a rule.

:class:`Leadership` is the seam between the lighthouse server (which serves members) and
whatever decides whether it may serve (lighthouse/replicated/server.py: an etcd lease). The single embedded
lighthouse has none and always serves.

:class:`LeaseClock` is the rule that keeps a deposed leader from serving: etcd expires a
lease ``ttl`` after the last keepalive *it received*; this side counts from when it *sent*
the keepalive that etcd answered, which is earlier, and stops a margin before that. So the
moment this lighthouse stops serving always precedes the moment etcd lets another take the
lead, whatever the network did in between; a partitioned leader stops on its own clock,
without hearing from anyone. Pure: times are arguments (tests/lighthouse/test_leadership.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lighthouse.wire.protocol import Notice, Quorum

LEASE_MARGIN = 0.2
"""Stop serving this fraction of the lease before it could expire in etcd: room for this
machine's clock to run slow against etcd's over one lease (real drift is ppm) and for the
event loop to notice late."""


class Leadership(Protocol):
    """Asked by the lighthouse server on every action that members could act on."""

    def serving(self) -> bool:
        """May this lighthouse answer members now (leader, lease still valid)?"""
        ...

    def leader_hint(self) -> str:
        """Where members should go instead (the leader's address), or why there is none."""
        ...

    def lease_remaining_s(self) -> float:
        """How long the lease surely holds from now (0 when not serving): members leave the
        leader when it runs out without a newer one (lighthouse/client/leader_watch.py)."""
        ...

    async def publish(self, quorum: Quorum, next_quorum_id: int) -> bool:
        """Record a quorum with a new id before any member hears of it; False when this
        lighthouse was deposed meanwhile (it must then not send it)."""
        ...


@dataclass(frozen=True, slots=True)
class LeaseClock:
    """When a leader must stop serving, from the keepalives etcd answered."""

    ttl_s: float
    valid_until: float = 0.0
    """Monotonic; before the first renewal nothing is valid."""

    def renewed(self, sent_at: float, granted_ttl_s: float) -> LeaseClock:
        """A keepalive (or the grant) sent at ``sent_at`` was answered with ``granted_ttl_s``."""
        if granted_ttl_s <= 0:
            return LeaseClock(self.ttl_s, 0.0)
        until = sent_at + granted_ttl_s * (1 - LEASE_MARGIN)
        return LeaseClock(self.ttl_s, max(self.valid_until, until))

    def valid(self, now: float) -> bool:
        return now < self.valid_until

    def remaining_s(self, now: float) -> float:
        return max(self.valid_until - now, 0.0)


def takeover_notices(taken_over: tuple[int, frozenset[str]] | None, replica_id: str, incarnation: int) -> list[Notice]:
    """What a new leader tells a member of the previous leader's last quorum as it registers
    (``taken_over``: that quorum's id and members), before its own first quorum forms.

    The previous leader may have died while it was answering a round: some members then hold
    the round's quorum and wait in its collectives for peers that never got it, and would
    wait out their collective timeout (10 s; once in the soak's first hundred leader kills).
    Their step cannot commit anyway: its quorum is not current at the new leader, whose fence
    refuses it. So each member is told that the others are lost to that quorum (a
    ``member_lost`` per other member, which managers answer by abandoning the step's
    collectives with it) and asks for the next quorum at once.
    """
    if taken_over is None or replica_id not in taken_over[1]:
        return []
    quorum_id, members = taken_over
    reason = (
        f"the lighthouse that formed quorum {quorum_id} is gone; its collectives may never complete, "
        "and its steps cannot commit"
    )
    return [Notice("member_lost", quorum_id, other, reason, incarnation) for other in sorted(members - {replica_id})]
