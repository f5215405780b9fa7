"""Sessions and waits on the lighthouse: a session stream's bounded outbox, and a member
waiting for a quorum.

Split from grpc_server.py, which owns the streams: these are the queues between the state
machine's synchronous calls (which produce notices and answers) and the handler coroutines
that write them to gRPC.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from lighthouse.errors import ProtocolError
from lighthouse.wire import envelope
from lighthouse.wire.protocol import Quorum, QuorumRequest
from lighthouse.wire.replies import FailureCode, QuorumAnswer, QuorumFailed, QuorumUpdate

REGISTER_TIMEOUT_S = 10.0
"""A session must send its Register message within this time of opening the stream."""


class Session:
    """One open session stream and its outbox of encoded messages (None ends the stream).

    The outbox is bounded (``LighthouseOptions.outbox_max_messages`` / ``_bytes``): gRPC's
    write waits while the member does not read (HTTP/2 flow control), and every notice for
    it would otherwise pile up here without end. A member that lets its outbox fill is not
    reading its session: it is ended (its handler task cancelled, so the stream closes and
    the member is reported lost with the reason) rather than allowed to grow the
    lighthouse's memory.
    """

    def __init__(self, replica_id: str, serial: int, max_messages: int, max_bytes: int) -> None:
        self.replica_id = replica_id
        self.serial = serial
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued_bytes = 0
        self.ended: str | None = None
        """Why the lighthouse ended the session (it stopped reading), if it did."""
        self.task: asyncio.Task[object] | None = None
        self.roster_version = 0
        """The roster of the last quorum sent on this session (0: none yet): a quorum on the
        same roster goes as a QuorumUpdate (replies.py)."""
        self._max_messages = max_messages
        self._max_bytes = max_bytes

    def send(self, message: bytes) -> None:
        if self.ended is not None:
            return
        if self.outbox.qsize() >= self._max_messages or self.queued_bytes + len(message) > self._max_bytes:
            self.ended = (
                f"not reading its session stream: {self.outbox.qsize()} messages ({self.queued_bytes} bytes) "
                f"waiting to be sent (limit {self._max_messages} messages, {self._max_bytes} bytes)"
            )
            if self.task is not None:
                self.task.cancel()
            return
        self.queued_bytes += len(message)
        self.outbox.put_nowait(message)

    async def next_message(self) -> bytes | None:
        message = await self.outbox.get()
        if message is not None:
            self.queued_bytes -= len(message)
        return message

    def close(self) -> None:
        self.outbox.put_nowait(None)


@dataclass(frozen=True, slots=True)
class SentQuorum:
    """A quorum as the server sends it this round: encoded whole once, its steps encoded once
    for the members whose session already holds its roster."""

    quorum: Quorum
    encoded: bytes
    roster_version: int
    steps: bytes
    _replies: dict[tuple[bool, int], bytes] = field(default_factory=dict)
    """Replies encoded this round, by (whole quorum?, ask): members' asks mostly agree (each
    session numbers its requests from 1), so N members cost a few encodings, not N."""

    def reply(self, ask: int, *, whole: bool) -> bytes:
        """The encoded QuorumAnswer (``whole``) or QuorumUpdate answering request ``ask``."""
        key = (whole, ask)
        if (encoded := self._replies.get(key)) is None:
            q = self.quorum
            message = (
                QuorumAnswer(ask, self.encoded)
                if whole
                else QuorumUpdate(ask, q.quorum_id, q.incarnation, q.created_unix_s, self.steps, q.standing_steps)
            )
            encoded = self._replies[key] = envelope.encode(message)
        return encoded


@dataclass(slots=True)
class Waiter:
    """A member waiting for a quorum, and where its answer goes: into its session's outbox
    (a stream request) or into the future a unary call awaits."""

    replica_id: str
    timeout_s: float
    answer: Callable[[SentQuorum], None]
    """Called with the quorum formed, encoded."""
    fail: Callable[[FailureCode, str], None]
    deadline: float = math.inf
    """Monotonic; the tick fails the wait after it (a timer per wait cost more than the scan)."""

    @classmethod
    def on_session(cls, session: Session, req: QuorumRequest) -> Waiter:
        """A request on a session stream: answered (or failed) down that stream."""

        def answer(sent: SentQuorum) -> None:
            whole = session.roster_version != sent.roster_version
            session.send(sent.reply(req.ask, whole=whole))
            session.roster_version = sent.roster_version

        def fail(code: FailureCode, reason: str) -> None:
            session.send(envelope.encode(QuorumFailed(req.ask, code, reason)))

        return cls(req.replica_id, req.timeout_s, answer, fail)

    @classmethod
    def on_future(cls, req: QuorumRequest, result: asyncio.Future[bytes]) -> Waiter:
        """A unary ``Quorum`` call: answered through the future its handler awaits."""

        def answer(sent: SentQuorum) -> None:
            if not result.done():
                result.set_result(sent.encoded)

        def fail(code: FailureCode, reason: str) -> None:
            if not result.done():
                result.set_exception(WaitFailed(code, reason))

        return cls(req.replica_id, req.timeout_s, answer, fail)


FAILURE_STATUS: dict[str, grpc.StatusCode] = {
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "aborted": grpc.StatusCode.ABORTED,
    "refused": grpc.StatusCode.RESOURCE_EXHAUSTED,
}
"""How the unary ``Quorum`` call reports each way a wait ends without a quorum."""


class WaitFailed(Exception):
    def __init__(self, code: FailureCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def check_on_session(req: QuorumRequest, replica_id: str) -> None:
    """A session joins quorums only for the replica it registered, numbering its requests."""
    if req.replica_id != replica_id:
        raise ProtocolError(
            f"QuorumRequest.replica_id is {req.replica_id!r} on the session of {replica_id!r}; a "
            "session asks for quorums only for the replica it registered"
        )
    if req.ask < 1:
        raise ProtocolError(f"QuorumRequest.ask is {req.ask} on a session stream; number requests from 1")
