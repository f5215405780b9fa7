"""The one quorum request a client has in flight on its session, and where its reply goes.

Requests are numbered (``ask``); a reply carries the number it answers, so a late reply to an
earlier request is never taken for the current one's. Split from client.py, which sends.
:class:`SessionAsks` turns every quorum reply into a :class:`Quorum` first (replies.py: a
whole one, or an update of the last one on the session), then hands it to the
:class:`PendingAsk` if it is for that request.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from lighthouse.errors import LighthouseUnavailable, ProtocolError, QuorumTimeout, QuorumTooLarge
from lighthouse.wire.protocol import Quorum
from lighthouse.wire.replies import QuorumAnswer, QuorumFailed, QuorumUpdate

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingAsk:
    """Request ``ask``; ``answer`` gets the quorum, or the error that ended the wait."""

    ask: int
    answer: asyncio.Future[Quorum]

    def settle(self, ask: int, reply: Quorum | QuorumFailed) -> bool:
        """Take the lighthouse's reply to request ``ask``; False when it is not for this
        request (or too late)."""
        if ask != self.ask or self.answer.done():
            return False
        if isinstance(reply, Quorum):
            self.answer.set_result(reply)
        elif reply.code == "timeout":
            self.answer.set_exception(QuorumTimeout(reply.reason))
        elif reply.code == "refused":
            self.answer.set_exception(QuorumTooLarge(reply.reason))
        else:
            self.answer.set_exception(LighthouseUnavailable(f"quorum request aborted: {reply.reason}"))
        return True

    def fail(self, error: Exception) -> None:
        """End the wait with ``error`` (the session ended, this side's deadline passed)."""
        if not self.answer.done():
            self.answer.set_exception(error)


class SessionAsks:
    """A client's quorum requests: their numbering, the one in flight, and the last quorum the
    lighthouse sent on the current session (the base of its next ``QuorumUpdate``)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.num_asks = 0
        self.pending: PendingAsk | None = None
        self._session_quorum: Quorum | None = None

    def new_session(self) -> None:
        """A new session starts from no quorum: the lighthouse sends a whole one first."""
        self._session_quorum = None

    def begin(self, ask: int) -> PendingAsk:
        """Request ``ask`` is about to be sent: it becomes the one in flight."""
        self.num_asks = ask
        self.pending = PendingAsk(ask, asyncio.get_running_loop().create_future())
        return self.pending

    def end(self, pending: PendingAsk) -> None:
        if pending.answer.done() and not pending.answer.cancelled():
            pending.answer.exception()  # retrieved: a send that failed already said why
        if self.pending is pending:
            self.pending = None

    def settle(self, reply: QuorumAnswer | QuorumUpdate | QuorumFailed) -> None:
        """Take a quorum reply. Every quorum sent on the session becomes the base of the next
        update, whether or not it is still awaited: the lighthouse counts what it sent."""
        result: Quorum | QuorumFailed
        if isinstance(reply, QuorumAnswer):
            result = self._session_quorum = Quorum.decode(reply.quorum)
        elif isinstance(reply, QuorumUpdate):
            if self._session_quorum is None:
                raise ProtocolError(f"QuorumUpdate for request {reply.ask} before any quorum on this session")
            result = self._session_quorum = reply.apply(self._session_quorum)
        else:
            result = reply
        if self.pending is None or not self.pending.settle(reply.ask, result):
            logger.debug("%s ignores a late reply to quorum request %d", self.replica_id, reply.ask)

    def fail(self, error: Exception) -> None:
        if self.pending is not None:
            self.pending.fail(error)
