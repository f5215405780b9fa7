"""Sending what the membership decided: a formed quorum (to the members waiting for it,
whole or as an update, and the ``quorum_formed`` notice), and a member lost or left (to
every other session; ``fenced`` to the lost member's own, which then ends).

A quorum is encoded once per round. A member whose session already holds the round's roster
(replica ids, addresses, world sizes, data) gets a QuorumUpdate instead (lighthouse/wire/replies.py
says why): the roster is compared once per round and numbered, and each session remembers the
number it holds, so the choice per member is one integer comparison.
"""

from __future__ import annotations

import logging

from lighthouse.rules.members import Lost
from lighthouse.rules.membership import QUORUM_BUDGET_BYTES
from lighthouse.server.metrics import Metrics
from lighthouse.server.session import SentQuorum, Session, Waiter
from lighthouse.wire import envelope
from lighthouse.wire.protocol import Notice, Quorum, QuorumRequest
from lighthouse.wire.replies import QuorumUpdate

logger = logging.getLogger(__name__)


class Delivery:
    """Owned by the server's rounds (rounds.py); ``sessions`` is their live map of open sessions."""

    def __init__(self, sessions: dict[str, Session], metrics: Metrics) -> None:
        self._sessions = sessions
        self._metrics = metrics
        self._roster: tuple[object, ...] = ()
        self._roster_version = 0
        """Counts distinct rosters sent; sessions remember the one they hold."""

    def encode(self, quorum: Quorum) -> bytes:
        encoded = envelope.encode(quorum)
        if len(encoded) > QUORUM_BUDGET_BYTES:  # the join budget (membership.py) makes this unreachable
            logger.error(
                "quorum %d is %d bytes, over the %d-byte budget", quorum.quorum_id, len(encoded), QUORUM_BUDGET_BYTES
            )
        return encoded

    def send(
        self,
        quorum: Quorum,
        encoded: bytes,
        waiters: list[Waiter],
        *,
        new_id: bool,
        reason: str,
        heartbeat_floor_s: float,
    ) -> None:
        roster = (quorum.replica_ids, quorum.addresses, quorum.world_sizes, quorum.data)
        if roster != self._roster:  # one O(N) comparison per round; members compare versions
            self._roster, self._roster_version = roster, self._roster_version + 1
        sent = SentQuorum(quorum, encoded, self._roster_version, QuorumUpdate.encode_steps(quorum.steps))
        for waiter in waiters:
            waiter.answer(sent)
        if not new_id:
            return
        self._metrics.quorum_ids_issued += 1
        logger.info("quorum %d formed with %s (%s)", quorum.quorum_id, list(quorum.replica_ids), reason)
        notice = envelope.encode(
            Notice(
                "quorum_formed",
                quorum_id=quorum.quorum_id,
                incarnation=quorum.incarnation,
                heartbeat_interval_s=heartbeat_floor_s,
            )
        )
        for rid in quorum.replica_ids:
            session = self._sessions.get(rid)
            if session is not None:
                session.send(notice)

    def send_standing_ended(self, quorum: Quorum, req: QuorumRequest, incarnation: int) -> None:
        """``req``'s member asked while ``quorum`` stood (standing.py): its other participants
        abandon their step on it."""
        self._metrics.standing_ended += 1
        reason = f"{req.replica_id!r} asked for a quorum at step {req.step} while quorum {quorum.quorum_id} stood"
        logger.info("standing of quorum %d ended: %s", quorum.quorum_id, reason)
        notice = envelope.encode(Notice("standing_ended", quorum.quorum_id, req.replica_id, reason, incarnation))
        for rid in quorum.replica_ids:
            session = self._sessions.get(rid)
            if rid != req.replica_id and session is not None:
                session.send(notice)

    def send_to_all(self, notice: bytes) -> None:
        for session in self._sessions.values():
            session.send(notice)

    def send_lost(self, m: Lost, incarnation: int) -> None:
        if m.graceful:
            logger.info("member %s left (quorum %d)", m.replica_id, m.quorum_id)
        else:
            self._metrics.members_lost += 1
            logger.warning("member %s lost (quorum %d): %s", m.replica_id, m.quorum_id, m.reason)
        own = self._sessions.get(m.replica_id)
        if own is not None and own.serial == m.session and not m.graceful:
            own.send(envelope.encode(Notice("fenced", m.quorum_id, m.replica_id, m.reason, incarnation)))
            own.close()
        kind = "member_left" if m.graceful else "member_lost"
        notice = envelope.encode(Notice(kind, m.quorum_id, m.replica_id, m.reason, incarnation, step=m.step))
        for rid, session in self._sessions.items():
            if rid != m.replica_id:
                session.send(notice)
