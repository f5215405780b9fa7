"""Commit leases: the quorum's promise that lets a group commit its step without asking the fence.

A group commits a step only while the step's quorum is current and the group still in it
(replicaft/step/commit.py): otherwise the others may have gone on without it, and its commit
would make a second history of that step. Asking the lighthouse at every step's end (the
fence, one round trip) cost 1.2-1.4 ms of a 20 ms step (the step-overhead benchmark at
10 MB). A commit lease answers in advance. With a quorum, the lighthouse grants each
participant the commit lease it asked for (at most ``max_commit_lease_s``) and promises to
form no quorum without that participant's session until the lease has run out; a quorum
*with* it forms only once it asks for one, which it does after its step has ended. So while
the lease runs, the member's quorum is current and the member in it: the fence's answer.

The member counts its lease from when it *sent* the request, before the lighthouse granted
it, so the lease ends on the member's clock no later than on the lighthouse's (both
monotonic; their rates differ by parts per million). A step that outlasts its lease (a slow
step, a SIGSTOP) asks the fence as before, and a group declared lost meanwhile is refused
there. Members ask for ``LEASE_STEPS`` of their step intervals (lighthouse/client/async_client.py); a
quorum granted standing steps (standing.py) grants the longest lease, ``max_commit_lease_s``,
which covers those steps too.

The price: once a group is lost, the survivors' next quorum waits until its commit lease
has run out, at most two of its step intervals after its last quorum formed
(``max_commit_lease_s`` if that quorum stood), less the time the survivors took to notice the loss. A restarted
lighthouse
knows no leases, so its first quorum waits at least ``max_commit_lease_s`` (membership.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

MAX_COMMIT_LEASE_S = 10.0
"""The longest lease a lighthouse may be configured to grant, and a member asks for."""
WITHIN_LEASE = "within the commit lease"
"""The fence's answer when the lease gave it (the "commit" event's reason says so)."""
LEASE_STEPS = 2.0
"""A member asks for a lease of this many of its step intervals (the time between its last
two quorum requests): its commit comes about one interval after its request."""


def lease_s(asked_s: float, standing_steps: int, max_s: float) -> float:
    """The lease granted for ``asked_s`` (``LEASE_STEPS`` intervals), on the lighthouse and on
    the member alike. A quorum that stands gets the longest: its standing steps were counted to
    fit in it with at least an interval to spare (standing.py), the slack of its last commit.
    Stretched by just one interval per standing step, a last step a little slower than the
    others outlasted it and asked the fence (1.4 ms)."""
    return max_s if standing_steps > 0 else min(asked_s, max_s)


@dataclass(frozen=True, slots=True)
class GrantedLease:
    session: int
    until: float
    """Lighthouse monotonic time."""


class CommitLeases:
    """The leases granted with the current quorum, on the lighthouse. Pure: callers pass ``now``."""

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self._held: dict[str, GrantedLease] = {}

    def grant(self, asked: Mapping[str, tuple[int, float]], now: float, standing_steps: int = 0) -> None:
        """A quorum formed: each participant's (session, seconds asked for), and the standing
        steps it was granted. Replaces the leases of the last quorum: a quorum forms only once
        no lease outside it still runs."""
        self._held = {
            rid: GrantedLease(session, now + lease_s(seconds, standing_steps, self.max_s))
            for rid, (session, seconds) in asked.items()
            if seconds > 0 and self.max_s > 0
        }

    def holding_out(self, sessions: frozenset[tuple[str, int]], now: float) -> tuple[str, float] | None:
        """A lease that forbids forming a quorum of ``sessions`` (replica id, session) now, as
        (replica id, seconds it still runs); None when none does."""
        for rid, lease in self._held.items():
            if lease.until > now and (rid, lease.session) not in sessions:
                return rid, lease.until - now
        return None


@dataclass(frozen=True, slots=True)
class CommitLease:
    """A member's lease: the quorum and steps it covers, until when (this host's monotonic time)."""

    quorum_id: int
    step: int
    last_step: int
    """``step`` and its standing steps (standing.py)."""
    until: float

    def covers(self, quorum_id: int, step: int, now: float) -> bool:
        return quorum_id == self.quorum_id and self.step <= step <= self.last_step and now < self.until


class MemberLease:
    """The member's side (lighthouse/client/async_client.py): what to ask for with each quorum request, and
    the lease its answer granted. Set on the client's loop, read on any thread (one reference)."""

    def __init__(self) -> None:
        self.held: CommitLease | None = None
        self._last_ask: tuple[float, int] | None = None
        """(when, for which step) the last request was made."""

    def ask(self, now: float, step: int) -> float:
        """The seconds to ask for with a request made at ``now`` for ``step``: ``LEASE_STEPS``
        step intervals (none before a first interval; an interval is the time since the last
        request over the steps since, which standing steps make several). The last lease ends
        here."""
        self.held = None
        last, self._last_ask = self._last_ask, (now, step)
        if last is None:
            return 0.0
        interval_s = (now - last[0]) / max(1, step - last[1])
        return min(LEASE_STEPS * interval_s, MAX_COMMIT_LEASE_S)

    def granted(
        self, quorum_id: int, step: int, asked_s: float, standing_steps: int, max_s: float, sent_at: float
    ) -> None:
        """The answer to a request for ``step`` sent at ``sent_at``, asking ``asked_s``, granted
        ``standing_steps`` under a lighthouse granting at most ``max_s``; counted from the
        sending, the lease ends on this host before it does on the lighthouse."""
        seconds = lease_s(asked_s, standing_steps, max_s)
        self.held = CommitLease(quorum_id, step, step + standing_steps, sent_at + seconds) if seconds > 0 else None

    def covers(self, quorum_id: int, step: int) -> bool:
        """Whether the lease held now covers ``step`` of ``quorum_id``: the fence would say yes."""
        held = self.held
        return held is not None and held.covers(quorum_id, step, time.monotonic())
