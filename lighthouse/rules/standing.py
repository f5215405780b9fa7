"""Standing quorums: a stable quorum holds for the next few steps without a round each.

A quorum round costs every step a request and an answer through the lighthouse: measured
1.5-2 ms of a 17 ms step at 10 MB on two cores (benchmarks/step_overhead.py), the lighthouse's
CPU and the members' gRPC threads taking turns with training. When nothing changes (the same
sessions as the last quorum, nobody healing, nobody else waiting) the answer is known in
advance: the same roster, one step on. So the lighthouse grants such a quorum
``standing_steps``: its participants run that many further steps on it without asking, and ask
again at the step after (every participant counts the same steps, so all ask at once).

What keeps it safe is the commit lease (commit_lease.py), the longest the lighthouse grants
for a standing quorum, which covers its standing steps: the lighthouse forms no quorum without a participant until its
lease has run out, and a
participant commits a standing step without the fence only within the lease. Standing is
granted only as far as the lease reaches: the steps that fit in the longest lease the
lighthouse grants (``max_commit_lease_s``), at the slowest participant's step interval, after
the ``LEASE_STEPS`` of the lease every member asks for. Steps slower than a third of the
longest lease (33 ms at the default 0.1 s) stand none, so a newcomer waits at most about one
lease for the next round.

A standing quorum ends early when a step of it does not commit (each participant then asks at
once), on any notice about its quorum, and when one participant asks before its standing ran
out: the lighthouse then tells the others (``standing_ended``), whose step on the old quorum
could never complete without it. The price: a lost group's lease is longer, so the survivors'
next quorum may wait up to one lease (chaos ``standing``: a SIGKILL cost the survivors
0.07-0.12 s).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lighthouse.rules.commit_lease import LEASE_STEPS

if TYPE_CHECKING:  # protocol.py imports the bound below
    from lighthouse.wire.protocol import Quorum, QuorumRequest

MAX_STANDING_STEPS = 8
"""At most this many standing steps follow a round, however fast the steps."""


def standing_steps(asked_leases_s: Iterable[float], max_lease_s: float) -> int:
    """The standing steps a quorum's participants may run, from the commit leases they asked
    for (``LEASE_STEPS`` of each one's step interval; 0: no interval yet)."""
    asked = list(asked_leases_s)
    if not asked or max_lease_s <= 0 or min(asked) <= 0:
        return 0
    slowest_interval_s = max(asked) / LEASE_STEPS
    return max(0, min(MAX_STANDING_STEPS, math.floor(max_lease_s / slowest_interval_s) - int(LEASE_STEPS)))


@dataclass(slots=True)
class StandingQuorum:
    """A member's standing quorum: the answer to the next asks, while they come in order."""

    quorum: Quorum
    next_step: int
    last_step: int

    @classmethod
    def granted(cls, quorum: Quorum, step: int) -> StandingQuorum | None:
        """The standing ``quorum`` (the answer for ``step``) grants; None if it grants none."""
        if quorum.standing_steps <= 0:
            return None
        return cls(quorum, step + 1, step + quorum.standing_steps)

    def answer(self, step: int, commit_failures: int) -> Quorum | None:
        """The quorum for ``step`` without asking, if this standing covers it: the next step in
        order (the last one committed), within the standing; None means ask the lighthouse."""
        if commit_failures or step != self.next_step or step > self.last_step:
            return None
        self.next_step += 1
        return dataclasses.replace(self.quorum, steps=(step,) * len(self.quorum.steps), standing_steps=0)


@dataclass(slots=True)
class StandingTerm:
    """The lighthouse's record of how far the current quorum stands (Membership's)."""

    through: int | None = None
    """The last standing step; None: the current quorum does not stand."""
    ended: bool = False
    """A member ended the standing early: the next quorum gets a new id, so that the
    ``standing_ended`` notice, which names the current one, cannot abort a step of it."""

    def grant(self, step: int, standing: int) -> None:
        """A quorum formed for ``step`` with ``standing`` steps to follow."""
        self.through = step + standing if standing else None
        self.ended = False

    def end(self, req: QuorumRequest, current: Quorum | None) -> Quorum | None:
        """``current`` if ``req`` ends its standing (its member asks for a step the quorum
        stands for), so that its others are told (``standing_ended``); else None."""
        if (
            self.through is None
            or current is None
            or req.step > self.through
            or req.replica_id not in current.replica_ids
        ):
            return None
        self.through = None
        self.ended = True
        return current
