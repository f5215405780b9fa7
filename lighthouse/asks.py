"""The one quorum request a client has in flight on its session, and where its reply goes.

Requests are numbered (``ask``); a reply carries the number it answers, so a late reply to an
earlier request is never taken for the current one's. Split from client.py, which sends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from lighthouse.errors import LighthouseUnavailable, QuorumTimeout, QuorumTooLarge
from lighthouse.protocol import QuorumAnswer, QuorumFailed


@dataclass(frozen=True, slots=True)
class PendingAsk:
    """Request ``ask``; ``answer`` gets the encoded quorum, or the error that ended the wait."""

    ask: int
    answer: asyncio.Future[bytes]

    def settle(self, reply: QuorumAnswer | QuorumFailed) -> bool:
        """Take the lighthouse's reply; False when it is not for this request (or too late)."""
        if reply.ask != self.ask or self.answer.done():
            return False
        if isinstance(reply, QuorumAnswer):
            self.answer.set_result(reply.quorum)
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
