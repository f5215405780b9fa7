"""The lighthouse's membership state machine: sessions, heartbeats, joins, losses, quorums.

One instance lives on the server's event loop and is changed only by the synchronous
methods below, each called with the current monotonic time; none does I/O, so the server
needs no locks and tests drive it with a fake clock.

A member exists while its session is live. It is *lost* — removed, and reported so the
server can notify the others — when:

* its session stream closes (process killed, host gone): at once, no heartbeat expiry;
* its heartbeats stop for ``heartbeat_timeout_s`` (SIGSTOP, partition with the TCP
  connection still open);
* it heartbeats but its training loop does not progress for ``progress_timeout_s`` while
  it is not waiting for a quorum (hung in a collective, deadlocked);
* a new session registers under the same replica id (the group restarted).

Quorum ids never repeat: within an incarnation they only grow, and a registering member
reports the last id it saw, so a restarted lighthouse continues above every id any live
member knows. Stores are additionally prefixed with the incarnation, so a rendezvous key is
unique forever.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from lighthouse.errors import OptionsError
from lighthouse.protocol import (
    FenceRequest,
    FenceResponse,
    Heartbeat,
    Member,
    Quorum,
    QuorumRequest,
    Register,
)
from lighthouse.quorum import QuorumDecision, QuorumRules, QuorumView, Waiting, decide_quorum

HISTORY_LENGTH = 64


@dataclass(frozen=True, slots=True)
class MembershipOptions:
    min_replicas: int = 1
    join_timeout_s: float = 2.0
    heartbeat_timeout_s: float = 2.0
    progress_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.min_replicas < 1:
            raise OptionsError(f"min_replicas={self.min_replicas}; it must be at least 1")
        for name in ("join_timeout_s", "heartbeat_timeout_s", "progress_timeout_s"):
            if getattr(self, name) <= 0:
                raise OptionsError(f"{name}={getattr(self, name)}; it must be positive")
        if self.progress_timeout_s <= self.heartbeat_timeout_s:
            raise OptionsError(
                f"progress_timeout_s={self.progress_timeout_s} is not above heartbeat_timeout_s="
                f"{self.heartbeat_timeout_s}: progress is only seen through heartbeats; set "
                f"--progress-timeout above {self.heartbeat_timeout_s}"
            )


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
    last_progress: float
    quorum_id: int = -1
    """The last quorum that included this member during this session."""
    newcomer: bool = False
    """Never in a quorum, in this session or before it (quorum.py's majority guard)."""


@dataclass(frozen=True, slots=True)
class Lost:
    replica_id: str
    session: int
    reason: str
    quorum_id: int
    graceful: bool = False
    """It left cleanly (announced in its last heartbeat) rather than failed."""


@dataclass(frozen=True, slots=True)
class QuorumRecord:
    quorum_id: int
    participants: tuple[str, ...]
    created_unix_s: float
    path: str
    reason: str


@dataclass(slots=True)
class _Join:
    request: QuorumRequest
    waiting: Waiting


@dataclass
class Membership:
    options: MembershipOptions
    incarnation: int
    members: dict[str, MemberState] = field(default_factory=dict)
    current: Quorum | None = None
    history: deque[QuorumRecord] = field(default_factory=lambda: deque(maxlen=HISTORY_LENGTH))
    last_decision: QuorumDecision | None = None
    _joins: dict[str, _Join] = field(default_factory=dict)
    _next_session: int = 1
    _next_quorum_id: int = 1
    _current_sessions: frozenset[tuple[str, int]] = frozenset()
    _reconnecting_since: float | None = None
    """When the first member of a previous incarnation's quorum registered (restart only)."""
    _current_ids: tuple[str, ...] | None = None
    """``current.replica_ids``, kept because the view is rebuilt on every join."""
    _survivors: int | None = None
    """How many of ``current``'s members are still healthy; None: recount (membership changed)."""

    @property
    def rules(self) -> QuorumRules:
        return QuorumRules(self.options.min_replicas, self.options.join_timeout_s)

    def waiting_ids(self) -> list[str]:
        return sorted(self._joins)

    def may_form_now(self) -> bool:
        """Cheap: can the members waiting now form a quorum without waiting for a deadline?

        Without a deadline a quorum forms only once every surviving member of the last quorum
        (fast path) or every healthy member (no previous quorum) is waiting, so fewer waiters
        than that cannot form one. The server asks this on every join, so a round of N joins
        costs O(N) instead of N full decisions; decisions that a deadline makes possible (join
        timeout, restart grace) are taken by the server's periodic tick.
        """
        if self._current_ids is None:
            return len(self._joins) >= len(self.members)
        if self._survivors is None:
            self._survivors = sum(1 for rid in self._current_ids if rid in self.members)
        return len(self._joins) >= self._survivors

    def register(self, reg: Register, now: float) -> tuple[int, list[Lost]]:
        """Open a session; returns its serial and the member it superseded, if any."""
        lost: list[Lost] = []
        old = self.members.get(reg.replica_id)
        if old is not None:
            lost = self._remove(old, "a new session registered under the same replica id")
        self._next_quorum_id = max(self._next_quorum_id, reg.last_quorum_id + 1)
        if reg.last_quorum_id >= 0 and self._reconnecting_since is None and self.current is None:
            self._reconnecting_since = now
        session = self._next_session
        self._next_session += 1
        self._survivors = None
        self.members[reg.replica_id] = MemberState(
            replica_id=reg.replica_id,
            session=session,
            address=reg.address,
            world_size=reg.world_size,
            step=reg.step,
            progress=0,
            registered_at=now,
            last_heartbeat=now,
            last_progress=now,
            newcomer=reg.last_quorum_id < 0,
        )
        return session, lost

    def heartbeat(self, replica_id: str, session: int, hb: Heartbeat, now: float) -> bool:
        """Record a heartbeat; False when the session is no longer the member's (fenced)."""
        m = self.members.get(replica_id)
        if m is None or m.session != session:
            return False
        m.last_heartbeat = now
        if (hb.step, hb.progress) != (m.step, m.progress):
            m.step, m.progress, m.last_progress = hb.step, hb.progress, now
        return True

    def close_session(self, replica_id: str, session: int, reason: str, *, graceful: bool = False) -> list[Lost]:
        m = self.members.get(replica_id)
        if m is None or m.session != session:
            return []
        return self._remove(m, reason, graceful=graceful)

    def is_session_live(self, replica_id: str, session: int) -> bool:
        m = self.members.get(replica_id)
        return m is not None and m.session == session

    def join(self, req: QuorumRequest, now: float) -> bool:
        """Add a long-poll waiter; False when the replica has no live session."""
        m = self.members.get(req.replica_id)
        if m is None:
            return False
        m.last_heartbeat = now
        m.last_progress = now
        m.step = max(m.step, req.step)
        self._joins[req.replica_id] = _Join(req, Waiting(now, req.shrink_only))
        return True

    def leave(self, replica_id: str, now: float) -> None:
        """The long poll ended without a quorum (deadline or client gone)."""
        if self._joins.pop(replica_id, None) is not None:
            self._resume_progress_clock(replica_id, now)

    def expire(self, now: float) -> list[Lost]:
        """Drop members whose heartbeats stopped or whose training loop stopped progressing."""
        lost: list[Lost] = []
        for m in list(self.members.values()):
            silent_s = now - m.last_heartbeat
            stuck_s = now - m.last_progress
            if silent_s > self.options.heartbeat_timeout_s:
                lost += self._remove(
                    m,
                    f"no heartbeat for {silent_s:.2f}s (heartbeat_timeout_s="
                    f"{self.options.heartbeat_timeout_s:g})",
                )
            elif m.replica_id not in self._joins and stuck_s > self.options.progress_timeout_s:
                lost += self._remove(
                    m,
                    f"alive but no progress for {stuck_s:.2f}s at step {m.step} "
                    f"(progress_timeout_s={self.options.progress_timeout_s:g})",
                )
        return lost

    def view(self) -> QuorumView:
        previous = self._current_ids
        return QuorumView(
            healthy=frozenset(self.members),
            waiting={rid: j.waiting for rid, j in self._joins.items()},
            previous=previous,
            newcomers=frozenset(rid for rid, m in self.members.items() if m.newcomer),
        )

    def decide(self, now: float, now_unix_s: float | None = None) -> Quorum | None:
        """Form a quorum if the rules allow; returns it (already recorded) or None."""
        decision = decide_quorum(self.view(), now, self.rules)
        if decision.participants is not None and self._awaiting_reconnects(now):
            decision = QuorumDecision(
                None,
                "this lighthouse restarted: waiting join_timeout "
                f"{self.options.join_timeout_s:g}s for the members of the last quorum to reconnect "
                "before forming the first one",
            )
        self.last_decision = decision
        if decision.participants is None:
            return None
        joins = [self._joins.pop(rid) for rid in decision.participants]
        sessions = frozenset((rid, self.members[rid].session) for rid in decision.participants)
        failures = any(j.request.commit_failures > 0 for j in joins)
        if self.current is None or sessions != self._current_sessions or failures:
            quorum_id = self._next_quorum_id
            self._next_quorum_id += 1
        else:
            quorum_id = self.current.quorum_id
        quorum = Quorum.of(
            quorum_id,
            self.incarnation,
            time.time() if now_unix_s is None else now_unix_s,
            (
                Member(j.request.replica_id, j.request.address, j.request.step, j.request.world_size, j.request.data)
                for j in joins
            ),
        )
        for rid in decision.participants:
            self.members[rid].quorum_id = quorum_id
            self.members[rid].newcomer = False
            self._resume_progress_clock(rid, now)
        self.current = quorum
        self._current_ids = quorum.replica_ids
        self._survivors = None
        self._current_sessions = sessions
        self.history.append(
            QuorumRecord(quorum_id, decision.participants, quorum.created_unix_s, decision.path, decision.reason)
        )
        return quorum

    def _awaiting_reconnects(self, now: float) -> bool:
        """After a lighthouse restart the first quorum waits for stragglers to reconnect.

        A member reporting a previous quorum id means this incarnation replaced another. Its
        peers reconnect with backoff, and a first quorum formed without them could commit a
        step some of them had already committed in the previous incarnation, making two
        different histories of one step that nobody would heal. So the first quorum of a
        restarted lighthouse forms only once join_timeout has passed since the first such
        member registered (at a fresh start nobody reports an id, and nothing waits).
        """
        return (
            self.current is None
            and self._reconnecting_since is not None
            and now - self._reconnecting_since < self.options.join_timeout_s
        )

    def fence(self, req: FenceRequest) -> FenceResponse:
        """A group may commit only while its quorum is the current one and it is in it."""
        m = self.members.get(req.replica_id)
        if m is None:
            return FenceResponse(False, f"replica {req.replica_id!r} has no live session (declared lost)")
        if self.current is None or self.current.quorum_id != req.quorum_id:
            current = None if self.current is None else self.current.quorum_id
            return FenceResponse(False, f"quorum {req.quorum_id} is not current (current: {current})")
        if m.quorum_id != req.quorum_id:
            return FenceResponse(
                False, f"replica {req.replica_id!r} is not a member of quorum {req.quorum_id}"
            )
        return FenceResponse(True)

    def _resume_progress_clock(self, replica_id: str, now: float) -> None:
        # Time spent waiting for a quorum is not time without progress: restart the progress
        # deadline when the wait ends, or a group that waited longer than progress_timeout_s
        # (for min_replicas, say) would be dropped the moment its quorum formed.
        m = self.members.get(replica_id)
        if m is not None:
            m.last_progress = now

    def _remove(self, m: MemberState, reason: str, *, graceful: bool = False) -> list[Lost]:
        del self.members[m.replica_id]
        self._survivors = None
        self._joins.pop(m.replica_id, None)
        return [Lost(m.replica_id, m.session, reason, m.quorum_id, graceful)]
