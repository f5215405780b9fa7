"""The step plan: what every manager derives from a formed quorum, identically.

The lighthouse sends the same :class:`Quorum` to every member; each manager applies
:func:`plan_step` to it to learn its replica rank, the step to be at, whether it heals, who
donates, and who hosts the rendezvous store of each column. Because the function is pure and
deterministic, every member reaches the same facts without another round trip; that is what
makes a quorum usable the moment it arrives.

:func:`assign_stripes` splits a healer's state (a byte range over its manifest) across all
up-to-date donors, so recovery time falls as donors are added.

Torch-free on purpose: the lighthouse's tests and the managers share it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lighthouse.wire.protocol import Member, Notice, Quorum

MIN_STRIPE_BYTES = 4 * 1024 * 1024
"""Below this a range is not worth its own request (a round trip costs more than the bytes)."""
STRIPES_PER_DONOR = 4
"""More, smaller stripes let a fast donor take more and a dead donor's share be re-fetched
in pieces; four per donor balances that against per-request overhead."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    quorum_id: int
    incarnation: int
    replica_id: str
    replica_rank: int
    """Position of this group among the participants (sorted by replica id): its rank in
    every column process group of this quorum."""
    num_replicas: int
    max_step: int
    step: int
    """This group's own step when it joined."""
    donors: tuple[str, ...]
    """Participants at ``max_step``: they contribute real gradients and can serve state."""
    healers: tuple[str, ...]
    """Participants behind ``max_step``: they fetch state and contribute zeros this step."""
    participants: tuple[Member, ...]

    @property
    def healing(self) -> bool:
        return self.replica_id in self.healers

    @property
    def num_contributors(self) -> int:
        """The divisor of the gradient average: groups that contribute real gradients."""
        return len(self.donors)

    @property
    def store_prefix(self) -> str:
        """Unique forever: incarnations never repeat and quorum ids grow within one."""
        return f"replicaft/{self.incarnation}/{self.quorum_id}"

    def column_store_owner(self, group_rank: int) -> Member:
        """The participant whose rank ``group_rank`` hosts that column's rendezvous store.

        Rotated over the donors so no single group hosts every column, and never a healer:
        a healer is the likeliest to fail again, and its death would break the rendezvous.
        """
        owner = self.donors[group_rank % len(self.donors)]
        member = self.member(owner)
        assert member is not None
        return member

    def member(self, replica_id: str) -> Member | None:
        for p in self.participants:
            if p.replica_id == replica_id:
                return p
        return None

    def with_one_donor(self) -> StepPlan:
        """This plan with every participant but the first donor healing from it: at step 0,
        so that every group starts from identical weights (the managers' ``init_sync``)."""
        primary = self.donors[0]
        return dataclasses.replace(
            self, donors=(primary,), healers=tuple(m.replica_id for m in self.participants if m.replica_id != primary)
        )

    def rank_entry(self, replica_id: str, group_rank: int) -> dict[str, Any]:
        """What rank ``group_rank`` of participant ``replica_id`` published with its quorum
        request (its ``data["ranks"][group_rank]``: store and state-server addresses, heal
        hints), ``{}`` if absent or malformed: it came over the wire, so readers check each
        value they take."""
        member = self.member(replica_id)
        ranks = member.data.get("ranks") if member is not None else None
        if not isinstance(ranks, list) or not 0 <= group_rank < len(ranks) or not isinstance(ranks[group_rank], dict):
            return {}
        return ranks[group_rank]

    def lost_participant(self, notice: Notice) -> bool:
        """Whether a ``member_lost`` notice is about a participant of this plan.

        The notice carries the last quorum the lost member was in during its session. A plan
        of a later quorum with a member of that name has a new process or session of it (the
        lighthouse removed the lost one before that quorum formed: the group restarted and
        joined again), so a notice that arrives after the restarted group joined must not
        abort a step with it.

        -1: the lost session was in no quorum of the lighthouse incarnation that lost it. If
        that is the incarnation that formed this plan's quorum, the member in the plan is a
        later session: a group fenced while it started (its interpreter stalled past its
        silence limit before its first quorum) and back in time for the first quorum. Taken
        as a participant, the notice aborted the first step on the groups that read it early
        while the others waited out the column rendezvous for them (10 s at every loaded
        start). From another incarnation (the lighthouse restarted while this plan's step ran)
        it may be this plan's member: it is.
        """
        if self.member(notice.replica_id) is None:
            return False
        if notice.quorum_id < 0:
            return notice.incarnation != self.incarnation
        return self.quorum_id <= notice.quorum_id


def plan_step(quorum: Quorum, replica_id: str) -> StepPlan:
    """Derive this replica's plan; raises ValueError if it is not a participant."""
    participants = tuple(sorted(quorum.participants, key=lambda m: m.replica_id))
    ids = [p.replica_id for p in participants]
    if replica_id not in ids:
        raise ValueError(f"replica {replica_id!r} is not in quorum {quorum.quorum_id} ({ids})")
    max_step = max(p.step for p in participants)
    me = participants[ids.index(replica_id)]
    return StepPlan(
        quorum_id=quorum.quorum_id,
        incarnation=quorum.incarnation,
        replica_id=replica_id,
        replica_rank=ids.index(replica_id),
        num_replicas=len(participants),
        max_step=max_step,
        step=me.step,
        donors=tuple(p.replica_id for p in participants if p.step == max_step),
        healers=tuple(p.replica_id for p in participants if p.step != max_step),
        participants=participants,
    )


@dataclass(frozen=True, slots=True)
class Stripe:
    donor: str
    start: int
    stop: int

    @property
    def num_bytes(self) -> int:
        return self.stop - self.start


def assign_stripes(
    num_bytes: int,
    donors: Sequence[str],
    *,
    healer_index: int = 0,
    min_stripe_bytes: int = MIN_STRIPE_BYTES,
    stripes_per_donor: int = STRIPES_PER_DONOR,
) -> tuple[Stripe, ...]:
    """Split ``[0, num_bytes)`` into contiguous stripes dealt round-robin to ``donors``.

    ``healer_index`` rotates the deal so that several healers start on different donors.
    The stripes cover every byte exactly once, in order.
    """
    if num_bytes < 0:
        raise ValueError(f"num_bytes={num_bytes}; expected >= 0")
    if not donors:
        raise ValueError("no donors to assign stripes to")
    if num_bytes == 0:
        return ()
    num_stripes = max(1, min(len(donors) * stripes_per_donor, math.ceil(num_bytes / max(1, min_stripe_bytes))))
    base, extra = divmod(num_bytes, num_stripes)
    stripes = []
    start = 0
    for i in range(num_stripes):
        size = base + (1 if i < extra else 0)
        stripes.append(Stripe(donors[(i + healer_index) % len(donors)], start, start + size))
        start += size
    return tuple(stripes)
