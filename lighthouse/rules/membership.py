"""The lighthouse's membership state machine: sessions, heartbeats, joins, losses, quorums.

One instance lives on the server's event loop and is changed only by the synchronous
methods below, each called with the current monotonic time; none does I/O, so the server
needs no locks and tests drive it with a fake clock.

A member exists while its session is live. It is *lost* — removed, and reported so the
server can notify the others — when:

* its session stream closes (process killed, host gone): at once, no heartbeat expiry;
* its session falls silent for longer than its own cadence allows (SIGSTOP, a frozen host, a
  partition with the TCP connection still open): the limit adapts to how often it speaks,
  between ``hung_min_s`` and ``heartbeat_timeout_s`` (liveness.py);
* it heartbeats but its training loop does not progress for ``progress_timeout_s`` while
  it is not waiting for a quorum (hung in a collective, deadlocked);
* a new session registers under the same replica id (the group restarted) while the old
  one is silent or comes from the same client instance (a reconnect). A *different*
  instance registering while the incumbent still speaks is a second process using the same
  replica id: it is refused (:class:`DuplicateReplica`), and the incumbent keeps training
  (before, each fenced the other ~15 times a second, forever, without a word).

The quorum a member is sent must fit one gRPC message, so the members' quorum entries
(id, address, data) are budgeted as they join: a join that would take the job's total past
:data:`QUORUM_BUDGET_BYTES` is refused, naming the totals (issue 19: 300 members with 16 KiB
of data each made a 4.5 MB quorum the lighthouse could not send, and every session died).

Quorum ids never repeat: within an incarnation they only grow, and a registering member
reports the last id it saw, so a restarted lighthouse continues above every id any live
member knows; stores are prefixed with the incarnation too (rendezvous keys unique forever).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import msgpack

from lighthouse.config.options import MembershipOptions
from lighthouse.rules.commit_lease import CommitLeases
from lighthouse.rules.history import LostSteps
from lighthouse.rules.liveness import LivenessRules, heartbeat_floor_s, paced_interval
from lighthouse.rules.members import (
    Lost,
    MemberState,
    QuorumRecord,
    budget_refusal,
    duplicate_refusal,
    entry_bytes,
    fence_answer,
)
from lighthouse.rules.quorum import QuorumDecision, QuorumRules, QuorumView, Waiting, decide_quorum
from lighthouse.rules.reconnects import ReconnectGrace
from lighthouse.rules.standing import StandingTerm, standing_steps
from lighthouse.wire.envelope import MAX_MESSAGE_BYTES
from lighthouse.wire.fence import FenceRequest, FenceResponse
from lighthouse.wire.protocol import (
    Heartbeat,
    Member,
    Quorum,
    QuorumRequest,
    Register,
)

HISTORY_LENGTH = 64
QUORUM_BUDGET_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
"""What the members' entries of one quorum may add up to, encoded: a gRPC message less room
for the envelopes around it (the answer on a session, the group server's forwarding)."""


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
    _current_ids: tuple[str, ...] | None = None
    """``current.replica_ids``, kept because the view is rebuilt on every join."""
    _survivors: int | None = None
    """How many of ``current``'s members are still healthy; None: recount (membership changed)."""
    _entry_bytes: int = 0
    """Sum of the members' ``entry_bytes``: the most a quorum of them could carry."""
    _liveness: LivenessRules = field(init=False)
    """``options.liveness``, built once: members cache their silence limit per rules object."""
    _commit_leases: CommitLeases = field(init=False)
    _reconnects: ReconnectGrace = field(init=False)
    _standing: StandingTerm = field(default_factory=StandingTerm)
    _lost_steps: LostSteps = field(default_factory=LostSteps)
    """Members declared hung, until they come back: no quorum forms behind their steps (history.py)."""

    def __post_init__(self) -> None:
        self._liveness = self.options.liveness
        self._commit_leases = CommitLeases(self.options.max_commit_lease_s)
        self._reconnects = ReconnectGrace(self.options.join_timeout_s, self.options.max_commit_lease_s)

    @property
    def rules(self) -> QuorumRules:
        return QuorumRules(self.options.min_replicas, self.options.join_timeout_s)

    def waiting_ids(self) -> list[str]:
        return sorted(self._joins)

    @property
    def next_quorum_id(self) -> int:
        return self._next_quorum_id

    def may_form_now(self) -> bool:
        """Cheap: can the members waiting now form a quorum without waiting for a deadline?

        Without a deadline a quorum forms only once every surviving member of the last quorum
        (fast path) or every healthy member (no previous quorum) is waiting, so fewer waiters
        than that cannot form one. The server asks this on every join, so a round of N joins
        costs O(N) instead of N full decisions; decisions that a deadline makes possible (join
        timeout, restart grace) are taken by the server's periodic tick.
        """
        previous = self._reconnects.previous(self._current_ids)
        if previous is None:
            return len(self._joins) >= len(self.members)
        if self._survivors is None:
            self._survivors = sum(1 for rid in previous if rid in self.members)
        return len(self._joins) >= self._survivors

    def successor(self, incarnation: int) -> Membership:
        """A fresh, empty state machine whose session serials continue this one's, so that a
        session of this one that closes late can never be taken for one of the successor's."""
        fresh = Membership(self.options, incarnation)
        fresh._next_session = self._next_session
        return fresh

    @property
    def heartbeat_floor_s(self) -> float:
        """The heartbeat interval members are asked to keep at least (liveness.py's budget)."""
        return heartbeat_floor_s(len(self.members))

    def restore(self, last_quorum: tuple[str, ...] | None, next_quorum_id: int, now: float) -> None:
        """Take over from a replicated lighthouse's previous leader (its state from etcd): quorum
        ids continue above every id it issued, and the first quorum waits for the last one's
        members (reconnects.py)."""
        self._next_quorum_id = max(self._next_quorum_id, next_quorum_id)
        self._reconnects.restore(last_quorum, now)

    def register(self, reg: Register, now: float, *, peer: str = "") -> tuple[int, list[Lost]]:
        """Open a session; returns its serial and the member it superseded, if any.

        Raises DuplicateReplica when another client instance holds the replica id and still
        speaks: a second process using the same id, refused so that the first trains on.
        """
        lost: list[Lost] = []
        old = self.members.get(reg.replica_id)
        if old is not None:
            if old.silent_too_long(now, self._liveness) is None and reg.instance != old.instance:
                raise duplicate_refusal(old, reg.replica_id, reg.instance, now, peer)
            lost = self._remove(old, "a new session registered under the same replica id")
        self._lost_steps.back(reg.replica_id)
        self._next_quorum_id = max(self._next_quorum_id, reg.last_quorum_id + 1)
        if self.current is None:
            self._reconnects.registered(reg.last_quorum_id, reg.last_quorum_members, now)
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
            instance=reg.instance,
            heartbeat_interval_s=paced_interval(reg.heartbeat_interval_s, len(self.members) + 1),
        )
        self._set_entry_bytes(self.members[reg.replica_id], entry_bytes(reg.replica_id, reg.address, b""))
        return session, lost

    def heartbeat(self, replica_id: str, session: int, hb: Heartbeat, now: float) -> bool:
        """Record a heartbeat; False when the session is no longer the member's (fenced)."""
        m = self.members.get(replica_id)
        if m is None or m.session != session:
            return False
        m.heard_heartbeat(hb.step, hb.progress, hb.healing, now)
        return True

    def close_session(
        self, replica_id: str, session: int, reason: str, *, graceful: bool = False, step: int = -1
    ) -> list[Lost]:
        """End a session; ``step``: what a member leaving cleanly said it had committed (its
        last heartbeat may be older)."""
        m = self.members.get(replica_id)
        if m is None or m.session != session:
            return []
        m.step = max(m.step, step)
        return self._remove(m, reason, graceful=graceful)

    def is_session_live(self, replica_id: str, session: int) -> bool:
        m = self.members.get(replica_id)
        return m is not None and m.session == session

    def join(self, req: QuorumRequest, now: float) -> bool:
        """Add a long-poll waiter; False when the replica has no live session.

        Raises QuorumTooLarge when the request's entry (id, address, data) would take the
        members' total past :data:`QUORUM_BUDGET_BYTES`: a quorum of them could not be sent.
        """
        m = self.members.get(req.replica_id)
        if m is None:
            return False
        entry = entry_bytes(
            req.replica_id, req.address, msgpack.packb(req.data, use_bin_type=True) if req.data else b""
        )
        total = self._entry_bytes - m.entry_bytes + entry
        if total > QUORUM_BUDGET_BYTES:
            raise budget_refusal(req.replica_id, req.address, entry, total, len(self.members), QUORUM_BUDGET_BYTES)
        self._set_entry_bytes(m, entry)
        m.heard(now)
        m.last_progress = now
        m.step = max(m.step, req.step)
        self._joins[req.replica_id] = _Join(req, Waiting(now, req.shrink_only))
        return True

    def end_standing(self, req: QuorumRequest) -> Quorum | None:
        """The current quorum if ``req`` ends its standing (standing.py); else None."""
        return self._standing.end(req, self.current)

    def leave(self, replica_id: str, now: float) -> None:
        """The long poll ended without a quorum (deadline or client gone)."""
        if self._joins.pop(replica_id, None) is not None:
            self._resume_progress_clock(replica_id, now)

    def expire(self, now: float, lag_allowance_s: float = 0.0) -> list[Lost]:
        """Drop members whose heartbeats stopped or whose training loop stopped progressing;
        ``lag_allowance_s``: silence the lighthouse's own lag may explain (liveness.LoopLag)."""
        lost: list[Lost] = []
        rules = self._liveness
        for m in list(self.members.values()):
            silent_s = now - m.last_heartbeat
            stuck_s = now - m.last_progress
            if (silence := m.silent_too_long(now, rules, lag_allowance_s)) is not None:
                lost += self._remove(
                    m,
                    f"silent for {silent_s:.2f}s, beyond its limit of {silence.limit_s:.2f}s ({silence.basis}): "
                    "hung (stopped, frozen or cut off) while its connection stays open",
                )
            elif m.replica_id not in self._joins and stuck_s > self.options.progress_timeout_s:
                lost += self._remove(
                    m,
                    f"alive but no progress for {stuck_s:.2f}s at step {m.step} "
                    f"(progress_timeout_s={self.options.progress_timeout_s:g})",
                )
            else:
                continue
            self._lost_steps.lost(m.replica_id, m.step, now)
        return lost

    def view(self) -> QuorumView:
        previous = self._reconnects.previous(self._current_ids)
        return QuorumView(
            healthy=frozenset(self.members),
            waiting={rid: j.waiting for rid, j in self._joins.items()},
            previous=previous,
            newcomers=frozenset(rid for rid, m in self.members.items() if m.newcomer),
        )

    def decide(self, now: float, now_unix_s: float | None = None) -> Quorum | None:
        """Form a quorum if the rules allow; returns it (already recorded) or None."""
        decision = decide_quorum(self.view(), now, self.rules)
        if decision.participants is not None:
            reach = max(self._joins[rid].request.step for rid in decision.participants)
            others = ((rid, m.step) for rid, m in self.members.items() if rid not in self._joins)
            held = self._lost_steps.holdout(reach, others, now, self.options.join_timeout_s)
            if held is None and self.current is None:
                held = self._reconnects.holdout(self.members.keys(), decision.participants, now)
            if held is not None:
                decision = QuorumDecision(None, held)
        sessions = frozenset((rid, self.members[rid].session) for rid in decision.participants or ())
        if decision.participants is not None and (held := self._commit_leases.holding_out(sessions, now)) is not None:
            decision = QuorumDecision(
                None,
                f"waiting {held[1]:.3f}s for the commit lease of {held[0]!r} to run out: "
                "it may still commit its step of the current quorum (commit_lease.py)",
            )
        self.last_decision = decision
        if decision.participants is None:
            return None
        joins = [self._joins.pop(rid) for rid in decision.participants]
        failures = any(j.request.commit_failures > 0 for j in joins)
        if self.current is None or sessions != self._current_sessions or failures or self._standing.ended:
            quorum_id = self._next_quorum_id
            self._next_quorum_id += 1
            standing = 0
        else:
            quorum_id = self.current.quorum_id
            # Standing only on a roster that held for a round already, with every member in it
            # and nobody healing (standing.py).
            steady = len(joins) == len(self.members) and len({j.request.step for j in joins}) == 1
            standing = (
                standing_steps((j.request.commit_lease_s for j in joins), self._commit_leases.max_s) if steady else 0
            )
        quorum = Quorum.of(
            quorum_id,
            self.incarnation,
            time.time() if now_unix_s is None else now_unix_s,
            (
                Member(j.request.replica_id, j.request.address, j.request.step, j.request.world_size, j.request.data)
                for j in joins
            ),
            max_commit_lease_s=self._commit_leases.max_s,
            standing_steps=standing,
        )
        self._commit_leases.grant(
            {
                j.request.replica_id: (self.members[j.request.replica_id].session, j.request.commit_lease_s)
                for j in joins
            },
            now,
            standing,
        )
        self._standing.grant(joins[0].request.step, standing)
        for rid in decision.participants:  # the floor is announced with the quorum; intervals only grow
            m = self.members[rid]
            m.heartbeat_interval_s = paced_interval(m.heartbeat_interval_s, len(self.members))
            m.quorum_id = quorum_id
            self.members[rid].newcomer = False
            self._resume_progress_clock(rid, now)
        self.current = quorum
        self._lost_steps.passed(reach)
        self._current_ids = quorum.replica_ids
        self._survivors = None
        self._current_sessions = sessions
        self.history.append(
            QuorumRecord(quorum_id, decision.participants, quorum.created_unix_s, decision.path, decision.reason)
        )
        return quorum

    def fence(self, req: FenceRequest) -> FenceResponse:
        """A group may commit only while its quorum is the current one and it is in it."""
        return fence_answer(
            self.members.get(req.replica_id), None if self.current is None else self.current.quorum_id, req
        )

    def _resume_progress_clock(self, replica_id: str, now: float) -> None:
        # Time spent waiting for a quorum is not time without progress: restart the progress
        # deadline when the wait ends, or a group that waited longer than progress_timeout_s
        # (for min_replicas, say) would be dropped the moment its quorum formed.
        m = self.members.get(replica_id)
        if m is not None:
            m.last_progress = now

    def _set_entry_bytes(self, m: MemberState, entry: int) -> None:
        self._entry_bytes += entry - m.entry_bytes
        m.entry_bytes = entry

    def _remove(self, m: MemberState, reason: str, *, graceful: bool = False) -> list[Lost]:
        del self.members[m.replica_id]
        if graceful:
            self._lost_steps.left(m.replica_id, m.step)
        self._standing.through = None  # the survivors' aborted step asks again anyway
        self._entry_bytes -= m.entry_bytes
        self._survivors = None
        self._joins.pop(m.replica_id, None)
        return [Lost(m.replica_id, m.session, reason, m.quorum_id, graceful, m.step if graceful else -1)]
