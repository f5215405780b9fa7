"""The group manager's gRPC server: how ranks 1..W-1 reach group rank 0's coordinator.

Thin on purpose: each handler authenticates, decodes and validates the message, makes one
call into the coordinator (coordinator.py) and encodes the answer. Started only when the group
has more than one rank; rank 0 itself calls the coordinator in-process.

Authenticated always: with the job's token when there is one, else with a secret rank 0 makes
for its group and hands to the other ranks through the group's rendezvous store (client.py),
so no process outside the group can join its rounds or break it by opening and dropping a
notice stream.

Bounded (issue 19), since a peer needs no secret to connect: messages as on the channels
(``envelope.MAX_MESSAGE_BYTES``); connections at ``max_connections(W)``, past which grpc
closes a new one as it is accepted; a connection that has not sent its HTTP/2 settings
(its TLS handshake included) within ``HANDSHAKE_TIMEOUT_S`` is closed (grpc's default waits
two minutes); and RPCs at ``max_concurrent_rpcs(W)``, past which one is refused with
RESOURCE_EXHAUSTED. A call without the secret is aborted before it does anything, so it
holds its slot for microseconds.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from lighthouse.errors import LighthouseError, ProtocolError
from lighthouse.server.guards import require_token
from lighthouse.tls.files import HANDSHAKE_TIMEOUT_S, TlsFiles, add_port
from lighthouse.wire import envelope
from replicaft.errors import GroupBroken, StepMismatch
from replicaft.group import protocol as gp
from replicaft.group.coordinator import GroupCoordinator, GroupRefused
from replicaft.process.threads import LoopThread

logger = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", envelope.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", envelope.MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

SPARE_CONNECTIONS = 16
"""Room beyond the group's own: ranks reconnecting before grpc has dropped their old
connections, and callers without the secret while they are being refused."""


def max_connections(world_size: int) -> int:
    """Ranks 1..W-1 hold one channel each, two while one reconnects: 2 W, plus spares. The cap
    keeps a flood from taking the training process's file descriptors (NCCL, Gloo and the
    checkpoint files draw on the same table); it is not what keeps strangers out (the secret is)."""
    return 2 * world_size + SPARE_CONNECTIONS


def max_concurrent_rpcs(world_size: int) -> int:
    """Each rank has at most a notice stream, a quorum and a vote under way: 3 W, plus spares."""
    return 3 * world_size + SPARE_CONNECTIONS


_REFUSAL_STATUS = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "mismatch": grpc.StatusCode.FAILED_PRECONDITION,
    "broken": grpc.StatusCode.ABORTED,
    "expired": grpc.StatusCode.DEADLINE_EXCEEDED,
}


class GroupServer:
    """Serves ``coordinator`` on ``loop``; ``start()`` returns the address ranks connect to."""

    def __init__(
        self,
        coordinator: GroupCoordinator,
        loop: LoopThread,
        *,
        host: str,
        token: str,
        tls: TlsFiles | None = None,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        """``handshake_timeout_s``: how long a new connection may take to send its HTTP/2 settings."""
        self._coordinator = coordinator
        self._handshake_timeout_s = handshake_timeout_s
        self._loop = loop
        self._host = host
        self._token = token
        self._tls = tls
        self._server: grpc.aio.Server | None = None

    def start(self, timeout_s: float) -> str:
        return self._loop.call(self._start(), timeout_s)

    def stop(self) -> None:
        if self._server is None:
            return
        try:
            self._loop.call(self._server.stop(0.5), 5.0)
        except Exception:
            logger.exception("group manager server did not stop cleanly")
        self._server = None

    async def _start(self) -> str:
        world_size = self._coordinator.options.group_world_size
        self._server = grpc.aio.server(
            options=[
                *CHANNEL_OPTIONS[:2],
                ("grpc.max_allowed_incoming_connections", max_connections(world_size)),
                ("grpc.server_handshake_timeout_ms", round(self._handshake_timeout_s * 1000)),
            ],
            maximum_concurrent_rpcs=max_concurrent_rpcs(world_size),
        )
        handler = grpc.method_handlers_generic_handler(
            gp.SERVICE,
            {
                "Quorum": grpc.unary_unary_rpc_method_handler(self._quorum),
                "Vote": grpc.unary_unary_rpc_method_handler(self._vote),
                "Watch": grpc.unary_stream_rpc_method_handler(self._watch),
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        host = f"[{self._host}]" if ":" in self._host else self._host
        port = add_port(self._server, f"{host}:0", self._tls)
        await self._server.start()
        return f"{host}:{port}"

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        await require_token(context, self._token, server="group manager")

    async def _quorum(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        try:
            quorum = await self._coordinator.quorum(gp.GroupQuorumRequest.decode(raw))
        except ProtocolError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except GroupRefused as e:
            await context.abort(_REFUSAL_STATUS[e.refusal.code], str(e))
        except StepMismatch as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except GroupBroken as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        except LighthouseError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(e).__name__}: {e}")
        return envelope.encode(quorum)

    async def _vote(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        try:
            req = gp.VoteRequest.decode(raw)
        except ProtocolError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return envelope.encode(await self._coordinator.vote(req))

    async def _watch(self, raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await self._authenticate(context)
        try:
            req = gp.WatchRequest.decode(raw)
            outbox = self._coordinator.open_watch(req.group_rank)
        except ProtocolError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except GroupRefused as e:
            await context.abort(_REFUSAL_STATUS[e.refusal.code], str(e))
        try:
            while (notice := await outbox.get()) is not None:
                yield envelope.encode(notice)
        finally:
            self._coordinator.close_watch(req.group_rank)
