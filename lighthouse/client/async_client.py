"""The lighthouse client, on asyncio (lighthouse/client/blocking_client.py wraps it for threads).

The session (register, heartbeats, quorum requests and their answers, notices) runs as a
background task that reconnects with exponential backoff (50 ms doubling to 1 s, with
jitter) for as long as the client is open, so a lighthouse restart is survived without the
caller noticing beyond a slower quorum: a quorum request whose session ends is asked again
on the next one. Quorums are asked for on the session stream rather than by a unary call
per step because a stream message costs grpc.aio a fraction of a new call (lighthouse/server/grpc_server.py).
Every call takes a deadline; nothing here blocks without one.

Notices (member lost or left, quorum formed, fenced, standing ended, and ``registered`` when a
session after the first registers) are delivered to ``on_notice``, called on the
client's event loop: keep it short and thread-safe (set an event, enqueue).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Callable
from typing import Any

import grpc

from lighthouse.client.asks import SessionAsks
from lighthouse.client.channels import Reconnect, Targets, parse_addresses, translate
from lighthouse.client.connections import Connections
from lighthouse.client.handshake_refusal import diagnose, unregistered
from lighthouse.client.last_quorum import LastQuorum
from lighthouse.client.leader_watch import LeaderWatch
from lighthouse.client.stream_writer import StreamWriter
from lighthouse.errors import (
    LighthouseUnavailable,
    ProtocolError,
    QuorumTimeout,
)
from lighthouse.rules.commit_lease import WITHIN_LEASE, MemberLease
from lighthouse.tls.files import TlsFiles
from lighthouse.wire import envelope, protocol
from lighthouse.wire.fence import FenceRequest, FenceResponse
from lighthouse.wire.progress import Progress
from lighthouse.wire.protocol import (
    Heartbeat,
    Notice,
    Quorum,
    QuorumRequest,
    Register,
)
from lighthouse.wire.replies import decode_session_reply

logger = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.02
DEADLINE_GRACE_S = 1.0
"""The RPC deadline exceeds the server-side wait so the server's reason arrives first."""
DUPLICATE_PATIENCE_S = 5.0
"""How long a session refused because another process holds the replica id keeps trying
before the refusal is final. A restarted group whose predecessor's host vanished (its
session silent, not closed) is refused until the lighthouse drops that session, at most its
heartbeat timeout (2 s by default); a second live process is refused every time."""


class AsyncLighthouseClient:
    """A replica group's connection to the lighthouse (used by group rank 0's manager)."""

    def __init__(
        self,
        address: str,
        replica_id: str,
        *,
        world_size: int = 1,
        member_address: str = "",
        token: str | None = None,
        tls: TlsFiles | None = None,
        heartbeat_interval_s: float = 0.1,
        on_notice: Callable[[Notice], None] | None = None,
        duplicate_patience_s: float = DUPLICATE_PATIENCE_S,
        progress: Progress | None = None,
    ) -> None:
        self.targets = Targets(parse_addresses(address))
        """The lighthouse (or the replicated set's members) this client may talk to."""
        self.replica_id = replica_id
        self.world_size = world_size
        self.member_address = member_address
        self.heartbeat_interval_s = heartbeat_interval_s
        self.on_notice = on_notice
        self.duplicate_patience_s = duplicate_patience_s
        self.incarnation: int | None = None
        self.session_epoch = 0
        """Counts sessions registered so far; a change means the lighthouse saw us anew."""
        self.last_quorum = LastQuorum()
        self.commit_lease = MemberLease()
        """The commit lease of the last quorum answered (commit_lease.py)."""
        self.instance = secrets.token_hex(8)
        """Names this client object to the lighthouse: a reconnect keeps it, another process has another."""
        self.progress = progress if progress is not None else Progress()
        """What heartbeats report; the owner of a training loop passes its own and records into it."""
        self._connections = Connections(self.targets, token=token, tls=tls)
        """The channel to each lighthouse and the calls on them (connections.py)."""
        self._registered = asyncio.Event()
        self._fatal: Exception | None = None
        self._session_task: asyncio.Task[None] | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._writer = StreamWriter()
        self._asks = SessionAsks(replica_id)
        self._watch = LeaderWatch(replica_id)
        """Leaves a replicated leader whose lease ran out (leader_watch.py)."""
        self._closing = False

    async def start(self) -> None:
        self._connections.open()
        self._session_task = asyncio.create_task(self._run_session(), name=f"lighthouse-session-{self.replica_id}")

    async def close(self) -> None:
        """Leave cleanly: the last heartbeat says so, and peers are told "member_left" (they
        finish their collectives with us) instead of "member_lost" (they would abandon them)."""
        self._closing = True
        call = self._call
        if call is not None and self._registered.is_set():
            try:
                await asyncio.wait_for(
                    self._writer.write(call, Heartbeat(self.progress.step, self.progress.count, leaving=True)), 1.0
                )
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.TimeoutError, LighthouseUnavailable) as e:
                logger.debug("could not announce leaving to the lighthouse: %s", e)
        if self._session_task is not None:
            self._session_task.cancel()
            try:
                await self._session_task
            except asyncio.CancelledError:
                pass
        await self._connections.close()

    async def wait_registered(self, timeout_s: float) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._registered.is_set():  # the common case, without wait_for's task
            return
        try:
            await asyncio.wait_for(self._registered.wait(), timeout_s)
        except asyncio.TimeoutError:  # not the builtin before 3.11, which pyproject allows
            raise await unregistered(self.address, self._connections.tls, timeout_s) from None
        if self._fatal is not None:
            raise self._fatal

    async def quorum(
        self,
        step: int,
        timeout_s: float,
        *,
        shrink_only: bool = False,
        commit_failures: int = 0,
        data: dict[str, Any] | None = None,
    ) -> Quorum:
        """Join the next quorum; returns it once formed. Retries across lighthouse restarts.

        Raises QuorumTimeout (with the lighthouse's reason) when none forms by the deadline,
        Unauthenticated / VersionMismatch / ProtocolError when retrying cannot help.
        """
        self.progress.record(step)
        asked_at = time.monotonic()
        lease_s = self.commit_lease.ask(asked_at, step)
        deadline = asked_at + timeout_s
        last = "no answer yet"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QuorumTimeout(f"no quorum within {timeout_s:g}s for {self.replica_id!r}: {last}")
            try:
                await self.wait_registered(remaining)
            except LighthouseUnavailable as e:
                raise QuorumTimeout(f"no quorum within {timeout_s:g}s: {e}") from None
            remaining = deadline - time.monotonic()
            request = QuorumRequest(
                replica_id=self.replica_id,
                step=step,
                address=self.member_address,
                world_size=self.world_size,
                timeout_s=max(remaining, 0.0),
                shrink_only=shrink_only,
                commit_failures=commit_failures,
                data=data or {},
                ask=self._asks.num_asks + 1,
                commit_lease_s=lease_s,
            )
            sent_at = time.monotonic()
            try:
                quorum = await self._ask(request, remaining + DEADLINE_GRACE_S)
            except LighthouseUnavailable as e:
                last = str(e)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            self.last_quorum.seen(quorum, self.session_epoch)
            self.commit_lease.granted(
                quorum.quorum_id, step, lease_s, quorum.standing_steps, quorum.max_commit_lease_s, sent_at
            )
            return quorum

    async def _ask(self, request: QuorumRequest, timeout_s: float) -> Quorum:
        """Send ``request`` (numbered one above the last) on the current session and wait for
        its answer, the quorum.

        Raises LighthouseUnavailable when the session ends first or the lighthouse aborted
        the request (the caller asks again), QuorumTimeout when the lighthouse found no
        quorum or did not answer within ``timeout_s``, and a fatal error the session met.
        """
        call = self._call
        if call is None or not self._registered.is_set():
            raise LighthouseUnavailable("the session with the lighthouse ended before the request was sent")
        pending = self._asks.begin(request.ask)
        # A timer that fails the answer, rather than asyncio.wait/wait_for around it: ~15 µs
        # less per request (measured), and the answer's own QuorumTimeout, the lighthouse's
        # reason, is never confused with this side's deadline.
        timer = asyncio.get_running_loop().call_later(
            timeout_s,
            pending.fail,
            QuorumTimeout(
                f"the lighthouse at {self.address} did not answer quorum request "
                f"{pending.ask} of {self.replica_id!r} within {timeout_s:g}s"
            ),
        )
        try:
            await self._writer.write(call, request)
            return await pending.answer
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            raise LighthouseUnavailable(f"the session with the lighthouse broke: {e}") from None
        finally:
            timer.cancel()
            self._asks.end(pending)

    async def fence(self, quorum_id: int, step: int, timeout_s: float) -> FenceResponse:
        """Ask whether this group may commit ``step`` of ``quorum_id``; never raises for I/O.

        An unreachable lighthouse answers "no": not committing is always safe, committing
        a step of a quorum the lighthouse has replaced is not. Within the quorum's commit
        lease the answer is known without asking (commit_lease.py).
        """
        if self.commit_lease.covers(quorum_id, step):
            return FenceResponse(True, WITHIN_LEASE)
        try:
            raw = await self._connections.unary(
                protocol.FENCE_METHOD,
                envelope.encode(FenceRequest(self.replica_id, quorum_id, step)),
                timeout_s,
            )
            return FenceResponse.decode(raw)
        except grpc.aio.AioRpcError as e:
            return FenceResponse(False, f"lighthouse did not confirm the quorum: {translate(e, self.address)}")

    @property
    def address(self) -> str:
        """The lighthouse the session is (or will next be) with."""
        return self.targets.current

    async def _run_session(self) -> None:
        reconnect = Reconnect(self.targets, self.replica_id, self.duplicate_patience_s)
        while not self._closing:
            try:
                pause = reconnect.after_session(await self._one_session())
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                error = await diagnose(e, self.address, self._connections.tls, self._registered.is_set())
                if (after := reconnect.after_error(error, time.monotonic(), self._registered.is_set())) is None:
                    self._refuse(error)
                    return
                pause = after
            except ProtocolError as e:
                logger.error("bad message from the lighthouse at %s: %s", self.address, e)
                pause = self.targets.after_failure()
            finally:
                self._registered.clear()
            await asyncio.sleep(pause * (1 + random.random() / 2))

    def _notify(self, notice: Notice) -> None:
        if self.on_notice is not None:
            try:
                self.on_notice(notice)
            except Exception:
                logger.exception("on_notice callback failed for %s", notice)

    def _refuse(self, error: Exception) -> None:
        """Retrying cannot help: every waiting and later call raises ``error``."""
        logger.error("lighthouse refused the session of %s: %s", self.replica_id, error)
        self._fatal = error
        self._asks.fail(error)
        self._registered.set()

    async def _one_session(self) -> bool:
        """One session with ``targets.current``; True if it registered before it ended."""
        call = self._connections.session()
        self._asks.new_session()
        self._call = call
        if self.targets.replicated:
            self._watch.begin(call, self.targets.current)
        heartbeats: asyncio.Task[None] | None = None
        try:
            await self._writer.write(
                call,
                Register(
                    self.replica_id,
                    self.member_address,
                    self.world_size,
                    self.progress.step,
                    *self.last_quorum.report(self.session_epoch),
                    self.instance,
                    self.heartbeat_interval_s,
                ),
            )
            raw = await call.read()
            if raw is grpc.aio.EOF:
                return False
            first = decode_session_reply(raw)
            if not isinstance(first, Notice) or first.kind != "registered":
                raise ProtocolError(f"expected a 'registered' notice first, got {first!r}")
            self.incarnation = first.incarnation
            self._watch.renewed(first.lease_s)
            self._pace(first)
            self.session_epoch += 1
            self._registered.set()
            if self.session_epoch > 1:
                self._notify(first)  # a new session: the step in flight was on the last one
            heartbeats = asyncio.create_task(
                self._writer.fill_silences(
                    call, self.progress, lambda: self.heartbeat_interval_s, lambda: self._closing
                )
            )
            while True:
                raw = await call.read()
                if raw is grpc.aio.EOF:
                    return True
                reply = decode_session_reply(raw)
                if not isinstance(reply, Notice):
                    self._asks.settle(reply)
                    continue
                if reply.kind == "lease":
                    self._watch.renewed(reply.lease_s)
                    continue
                self._pace(reply)
                self._notify(reply)
                if reply.kind == "fenced":
                    return True
        except asyncio.CancelledError:
            if self._watch.lapsed is None or self._closing:
                raise
            return self._registered.is_set()  # the watch cancelled the call: on to the next lighthouse
        finally:
            self._watch.end()
            self._call = None
            self._asks.fail(LighthouseUnavailable("the session with the lighthouse ended"))
            if heartbeats is not None:
                heartbeats.cancel()
            call.cancel()

    def _pace(self, notice: Notice) -> None:
        """Heartbeat no more often than the lighthouse's budget allows (it only ever grows)."""
        self.heartbeat_interval_s = max(self.heartbeat_interval_s, notice.heartbeat_interval_s)
