"""The lighthouse's state on its event loop, and the synchronous calls that move its rounds.

A round: members join (each with one wait for a quorum), the membership decides a quorum,
the quorum is delivered to the waits it answers and announced to every session, and the
waits left over fail: past their deadline, their member lost, the lighthouse no longer
leading. :class:`Rounds` holds what a round needs (the :class:`Membership`, the open
sessions, the waits) and makes these moves, each in one synchronous call with no await
midway, so the state needs no locks. The one step that waits is publishing a new quorum
id to etcd in a replicated set: it runs as a task of its own and looks again, once etcd
has answered, whether the quorum is still the current one before anything is sent.

Split from grpc_server.py, which keeps the gRPC shell (binding, the handlers, the streams,
the tick): a handler decodes, makes one call here or into the membership, and encodes.
The rules themselves are pure and live in lighthouse/rules/; what is sent, and how, is
delivery.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time

from lighthouse.errors import QuorumTooLarge
from lighthouse.replicated.leadership import Leadership
from lighthouse.rules.members import Lost
from lighthouse.rules.membership import Membership
from lighthouse.rules.waits import Waits
from lighthouse.server.delivery import Delivery
from lighthouse.server.metrics import Metrics
from lighthouse.server.session import Session, Waiter
from lighthouse.wire import envelope
from lighthouse.wire.protocol import Notice, Quorum, QuorumRequest

logger = logging.getLogger(__name__)


class Rounds:
    """The membership, sessions and waits of one lighthouse; event-loop only, built with the server."""

    def __init__(
        self, membership: Membership, *, metrics: Metrics, leadership: Leadership | None, incarnation: int
    ) -> None:
        self.membership = membership
        self.incarnation = incarnation
        self.leadership = leadership
        self.metrics = metrics
        self.sessions: dict[str, Session] = {}
        """The open session of each replica id; the handler of its stream adds and removes it."""
        self.waits = Waits()
        self.taken_over: tuple[int, frozenset[str]] | None = None
        """The previous leader's last quorum (id, members), until this leader's first quorum."""
        self._delivery = Delivery(self.sessions, metrics)

    def serving(self) -> bool:
        return self.leadership is None or self.leadership.serving()

    def join(self, req: QuorumRequest, waiter: Waiter) -> bool:
        """Make ``waiter`` the replica's one wait for a quorum, until ``req.timeout_s``;
        False when the replica has no live session."""
        now = time.monotonic()
        if (stood := self.membership.end_standing(req)) is not None:
            self._delivery.send_standing_ended(stood, req, self.incarnation)
        try:
            if not self.membership.join(req, now):
                return False
        except QuorumTooLarge as e:
            self.metrics.rejected_requests += 1
            logger.error("refused a quorum request of %s: %s", req.replica_id, e)
            waiter.fail("refused", str(e))
            return True
        self.waits.add(waiter, now)
        if self.membership.may_form_now():
            self.decide()
        return True

    def _last_reason(self) -> str:
        return self.membership.last_decision.reason if self.membership.last_decision else ""

    def expire_waits(self, now: float) -> None:
        for waiter in self.waits.expired(now):
            self.membership.leave(waiter.replica_id, now)
            waiter.fail(
                "timeout",
                f"no quorum with {waiter.replica_id!r} formed within {waiter.timeout_s:g}s: {self._last_reason()}",
            )

    def decide(self) -> None:
        if not self.serving():
            return
        now = time.monotonic()
        previous_id = self.membership.current.quorum_id if self.membership.current else None
        quorum = self.membership.decide(now)
        if quorum is None:
            return
        self.metrics.quorums_formed += 1
        self.metrics.quorums_standing += quorum.standing_steps > 0
        waiters, took = self.waits.take(quorum.replica_ids, now)
        if took is not None:
            self.metrics.quorum_latency_s.observe(took)
        encoded = self._delivery.encode(quorum)
        new_id = quorum.quorum_id != previous_id
        if new_id and self.leadership is not None:
            # A new quorum id reaches members only once etcd holds it (lighthouse/replicated/server.py).
            asyncio.create_task(self._publish_then_send(quorum, encoded, waiters))
        else:
            self._delivery.send(
                quorum,
                encoded,
                waiters,
                new_id=new_id,
                reason=self._last_reason(),
                heartbeat_floor_s=self.membership.heartbeat_floor_s,
            )

    async def _publish_then_send(self, quorum: Quorum, encoded: bytes, waiters: list[Waiter]) -> None:
        assert self.leadership is not None
        published = await self.leadership.publish(quorum, self.membership.next_quorum_id)
        if published and self.serving() and self.membership.current is quorum:
            self._delivery.send(
                quorum,
                encoded,
                waiters,
                new_id=True,
                reason=self._last_reason(),
                heartbeat_floor_s=self.membership.heartbeat_floor_s,
            )
            return
        why = "this lighthouse lost the lead" if not published else "a newer quorum replaced it"
        for w in waiters:
            w.fail("aborted", f"quorum {quorum.quorum_id} was not published: {why}")

    def handle_lost(self, lost: list[Lost]) -> None:
        for m in lost:
            self.waits.fail(m.replica_id, f"replica {m.replica_id!r} was declared lost: {m.reason}")
            self._delivery.send_lost(m, self.incarnation)

    # -- leadership (a replicated lighthouse) -----------------------------------------------

    def take_leadership(
        self, incarnation: int, last_quorum: tuple[str, ...] | None, last_quorum_id: int, next_quorum_id: int
    ) -> None:
        """Start a new history as ``incarnation`` from the previous leader's state (see
        :meth:`LighthouseServer.take_leadership <lighthouse.server.grpc_server.LighthouseServer.take_leadership>`)."""
        self.incarnation = incarnation
        self.membership = self.membership.successor(incarnation)
        self.membership.restore(last_quorum, next_quorum_id, time.monotonic())
        self.taken_over = (last_quorum_id, frozenset(last_quorum)) if last_quorum else None
        self.waits.round_started = None

    def announce_lease(self, lease_s: float) -> None:
        """Tell every session the leader's lease holds ``lease_s`` longer (Notice.lease_s)."""
        self._delivery.send_to_all(envelope.encode(Notice("lease", incarnation=self.incarnation, lease_s=lease_s)))

    def step_down(self, reason: str) -> None:
        """Every wait fails, every session ends, and the membership is dropped; idempotent."""
        if not self.sessions and not self.waits.by_replica and not self.membership.members:
            return
        logger.warning("lighthouse stops serving: %s", reason)
        self.waits.fail_all(f"the lighthouse stopped leading: {reason}")
        for session in self.sessions.values():
            session.close()
        self.membership = self.membership.successor(self.incarnation)
