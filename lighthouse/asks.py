"""The one quorum request a client has in flight on its session, and where its reply goes.

Requests are numbered (``ask``); a reply carries the number it answers, so a late reply to an
earlier request is never taken for the current one's. Split from client.py, which sends.
The client turns every quorum reply into a :class:`Quorum` first (replies.py: a whole one,
or an update of the last one on the session), then hands it here if it is for this request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from lighthouse.errors import LighthouseUnavailable, QuorumTimeout, QuorumTooLarge
from lighthouse.protocol import Quorum
from lighthouse.replies import QuorumFailed


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
