"""What a gRPC handler checks before it acts: the caller's token, the message, the leader.

Each guard aborts the call with a status that says what to fix (``context.abort`` raises, so a
handler that awaited a guard goes on only when it passed). Shared by the lighthouse's handlers
and the group manager's (replicaft/group/server.py), so a bad token reads the same everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from lighthouse.config.options import TOKEN_METADATA_KEY, token_problem
from lighthouse.errors import ProtocolError, VersionMismatch
from lighthouse.replicated.leadership import Leadership

logger = logging.getLogger(__name__)


async def require_token(
    context: grpc.aio.ServicerContext,
    token: str | None,
    *,
    server: str,
    fix: str = "",
    refused: Callable[[], None] | None = None,
) -> None:
    """Abort UNAUTHENTICATED unless the call carries ``token`` (None: any caller)."""
    problem = token_problem(context.invocation_metadata(), token)
    if problem is None:
        return
    if refused is not None:
        refused()
    logger.warning("%s rejected a call from %s: %s token", server, context.peer(), problem)
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{server}: {problem} {TOKEN_METADATA_KEY}{fix}")


async def reject(context: grpc.aio.ServicerContext, refused: Callable[[], None], error: ProtocolError) -> None:
    """Abort a call whose message was malformed (or of another protocol version)."""
    refused()
    logger.warning("rejected a message from %s: %s", context.peer(), error)
    code = (
        grpc.StatusCode.FAILED_PRECONDITION if isinstance(error, VersionMismatch) else grpc.StatusCode.INVALID_ARGUMENT
    )
    await context.abort(code, str(error))


async def require_leader(context: grpc.aio.ServicerContext, leadership: Leadership | None) -> None:
    """Abort UNAVAILABLE, naming the leader, on a lighthouse of a replicated set that does not lead."""
    if leadership is not None and not leadership.serving():
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, f"this lighthouse is not the leader ({leadership.leader_hint()})"
        )
