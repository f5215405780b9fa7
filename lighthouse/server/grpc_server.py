"""The lighthouse gRPC server: a thin asyncio shell around :class:`Membership`.

Each handler decodes and validates, makes one synchronous call into the state machine and
encodes the answer; the rules live in membership.py and quorum.py, and the rounds they decide
(joins, quorums delivered, waits failed, leadership taken and given up) in rounds.py. All
state is touched only on this server's event loop, between awaits, so there are no locks.

RPCs (generic handlers, msgpack bodies; see protocol.py):

* ``Session`` (stream/stream): ``Register``, then ``Heartbeat``s and ``QuorumRequest``s up;
  ``Notice``s, ``QuorumAnswer``s and ``QuorumFailed``s down. The stream closing is how a dead
  group is detected without waiting for a heartbeat expiry. Quorums are asked for here
  because a message on an open stream costs grpc.aio far less than a new call: 256 members
  (in two client processes) meeting at a bare grpc.aio barrier took ~58 ms as unary calls
  and ~15 ms as stream messages on this machine. Each answer wraps the same bytes, the quorum encoded once.
* ``Quorum`` (unary long poll with the caller's deadline): the same join, answered with the
  encoded :class:`Quorum`; kept for clients that hold no stream of their own.
* ``Fence`` (unary): may this group commit a step of this quorum?
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from lighthouse.config.options import LighthouseOptions
from lighthouse.errors import DuplicateReplica, ProtocolError
from lighthouse.replicated.leadership import Leadership, takeover_notices
from lighthouse.rules.liveness import LoopLag
from lighthouse.rules.membership import Membership
from lighthouse.server.binding import bind_grpc
from lighthouse.server.guards import reject, require_leader, require_token
from lighthouse.server.metrics import Metrics
from lighthouse.server.rounds import Rounds
from lighthouse.server.session import (
    FAILURE_STATUS,
    REGISTER_TIMEOUT_S,
    Session,
    Waiter,
    WaitFailed,
    check_on_session,
)
from lighthouse.server.status import StatusServer, status_snapshot
from lighthouse.wire import envelope, protocol
from lighthouse.wire.fence import FenceRequest
from lighthouse.wire.protocol import (
    Notice,
    QuorumRequest,
    Register,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServingAddresses:
    grpc: str
    status: str | None


class LighthouseServer:
    """Build with options; ``start()`` binds and serves; ``stop()`` shuts down cleanly."""

    def __init__(
        self, options: LighthouseOptions, *, incarnation: int | None = None, leadership: Leadership | None = None
    ) -> None:
        self.options = options
        incarnation = incarnation if incarnation is not None else time.time_ns() // 1000
        self.leadership = leadership
        """None: the single lighthouse, always serving. Otherwise one of a replicated set,
        serving only while ``leadership.serving()`` (lighthouse/replicated/server.py)."""
        self.metrics = Metrics()
        self._rounds = Rounds(
            Membership(options.membership, incarnation),
            metrics=self.metrics,
            leadership=leadership,
            incarnation=incarnation,
        )
        """The membership, sessions and waits, and the moves of each round (rounds.py)."""
        self._server: grpc.aio.Server | None = None
        self._status: StatusServer | None = None
        self._ticker: asyncio.Task[None] | None = None

    @property
    def incarnation(self) -> int:
        """The history this lighthouse serves; a new leader of a replicated set starts a new one."""
        return self._rounds.incarnation

    @property
    def membership(self) -> Membership:
        """The state machine (lighthouse/rules/membership.py); replaced when leadership changes."""
        return self._rounds.membership

    async def start(self) -> ServingAddresses:
        o = self.options
        handler = grpc.method_handlers_generic_handler(
            protocol.SERVICE,
            {
                "Session": grpc.stream_stream_rpc_method_handler(self._session),
                "Quorum": grpc.unary_unary_rpc_method_handler(self._quorum),
                "Fence": grpc.unary_unary_rpc_method_handler(self._fence),
            },
        )
        self._server, port = await bind_grpc(o, handler)
        bind = f"[{o.host}]" if ":" in o.host else o.host
        await self._server.start()
        self._ticker = asyncio.create_task(self._tick_forever(), name="lighthouse-tick")
        status = None
        if o.status_port is not None:
            self._status = StatusServer(lambda: status_snapshot(self.membership, self.metrics), self.metrics.render)
            try:
                status = await self._status.start(
                    o.host, o.status_port, o.tls.server_context(client_cert=False) if o.tls else None
                )
            except OSError:
                self._status = None
                await self.stop(0)
                raise
        grpc_address = f"{bind}:{port}"
        logger.info(
            "lighthouse incarnation %d serving gRPC at %s%s",
            self.incarnation,
            grpc_address,
            " over TLS" if o.tls else "",
        )
        return ServingAddresses(grpc_address, status)

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for s in self._rounds.sessions.values():
            s.close()
        if self._status is not None:
            await self._status.stop()
        if self._server is not None:
            await self._server.stop(grace_s)

    # -- handlers ---------------------------------------------------------------------------

    async def _session(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        await self._authenticate(context)
        await require_leader(context, self.leadership)
        try:
            first = await asyncio.wait_for(context.read(), REGISTER_TIMEOUT_S)
            if first is grpc.aio.EOF:
                return
            reg = Register.decode(first)
        except (asyncio.TimeoutError, ProtocolError) as e:  # not the builtin before 3.11
            await reject(
                context,
                self._refused,
                e
                if isinstance(e, ProtocolError)
                else ProtocolError(f"no Register message within {REGISTER_TIMEOUT_S:g}s of opening a session"),
            )
            return
        try:
            serial, lost = self.membership.register(reg, time.monotonic(), peer=context.peer())
        except DuplicateReplica as e:
            self.metrics.duplicate_replicas_refused += 1
            logger.error("refused a second process for replica %s: %s", reg.replica_id, e)
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        # Before the new session takes the replica id's slot, so the superseded session is
        # the one told it is fenced.
        self._rounds.handle_lost(lost)
        o = self.options
        session = Session(reg.replica_id, serial, o.outbox_max_messages, o.outbox_max_bytes)
        session.task = asyncio.current_task()
        self._rounds.sessions[reg.replica_id] = session
        self.metrics.sessions_open += 1
        logger.info("session %d opened by %s (%s) at step %d", serial, reg.replica_id, reg.address or "-", reg.step)
        reader = asyncio.create_task(self._read_session(session, context))
        reader.add_done_callback(lambda _: session.close())
        try:
            await context.write(
                envelope.encode(
                    Notice(
                        "registered",
                        incarnation=self.incarnation,
                        replica_id=reg.replica_id,
                        heartbeat_interval_s=self.membership.heartbeat_floor_s,
                        lease_s=self.leadership.lease_remaining_s() if self.leadership is not None else 0.0,
                    )
                )
            )
            if self.membership.current is None:  # a new leader, before its first quorum
                for notice in takeover_notices(self._rounds.taken_over, reg.replica_id, self.incarnation):
                    await context.write(envelope.encode(notice))
            while (message := await session.next_message()) is not None:
                await context.write(message)
        finally:
            reader.cancel()
            self.metrics.sessions_open -= 1
            if self._rounds.sessions.get(reg.replica_id) is session:
                del self._rounds.sessions[reg.replica_id]
            if session.ended is not None:
                self.metrics.sessions_ended_not_reading += 1
            self._rounds.handle_lost(
                self.membership.close_session(reg.replica_id, serial, session.ended or "session stream closed")
            )
            self._rounds.decide()
        if reader.done() and not reader.cancelled() and reader.exception() is None and (rejected := reader.result()):
            await reject(context, self._refused, rejected)
        await require_leader(context, self.leadership)  # ended by a step-down: say where to go

    async def _read_session(self, session: Session, context: grpc.aio.ServicerContext) -> ProtocolError | None:
        """Take a session's heartbeats and quorum requests until it ends; returns the error
        that ended it, if a message was malformed (the handler then aborts the stream with it)."""
        while True:
            raw = await context.read()
            if raw is grpc.aio.EOF:
                return None
            try:
                message = protocol.decode_session_request(raw)
                if isinstance(message, QuorumRequest):
                    check_on_session(message, session.replica_id)
            except ProtocolError as e:
                return e
            if isinstance(message, QuorumRequest):
                if not self._join_on_session(session, message):
                    return None
            elif message.leaving:
                self._rounds.handle_lost(
                    self.membership.close_session(
                        session.replica_id,
                        session.serial,
                        "left cleanly after its last step",
                        graceful=True,
                        step=message.step,
                    )
                )
                self._rounds.decide()
                return None
            elif not self.membership.heartbeat(session.replica_id, session.serial, message, time.monotonic()):
                return None

    def _join_on_session(self, session: Session, req: QuorumRequest) -> bool:
        """A quorum request on a session stream; False when the session was superseded."""
        if not self.membership.is_session_live(session.replica_id, session.serial):
            return False
        return self._rounds.join(req, Waiter.on_session(session, req))

    async def _quorum(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        await require_leader(context, self.leadership)
        try:
            req = QuorumRequest.decode(raw)
        except ProtocolError as e:
            await reject(context, self._refused, e)
        result: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        waiter = Waiter.on_future(req, result)
        if not self._rounds.join(req, waiter):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"replica {req.replica_id!r} has no open session; open a Session before asking for a quorum",
            )
        try:
            return await result
        except WaitFailed as e:
            await context.abort(FAILURE_STATUS[e.code], e.reason)
        finally:
            if self._rounds.waits.discard(waiter):  # the caller went away first
                self.membership.leave(req.replica_id, time.monotonic())
        raise AssertionError("unreachable")

    async def _fence(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        await require_leader(context, self.leadership)
        try:
            req = FenceRequest.decode(raw)
        except ProtocolError as e:
            await reject(context, self._refused, e)
        self.metrics.fences_answered += 1
        return envelope.encode(self.membership.fence(req))

    # -- guards (guards.py) -----------------------------------------------------------------

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        await require_token(
            context,
            self.options.token,
            server="lighthouse",
            refused=self._refused,
            fix="; start the manager with the lighthouse's token (--token or REPLICAFT_TOKEN)",
        )

    def _refused(self) -> None:
        self.metrics.rejected_requests += 1

    # -- leadership (a replicated lighthouse) -----------------------------------------------

    def serving(self) -> bool:
        return self._rounds.serving()

    def take_leadership(
        self, incarnation: int, last_quorum: tuple[str, ...] | None, last_quorum_id: int, next_quorum_id: int
    ) -> None:
        """Start serving as the leader, from the previous leader's state (read from etcd);
        ``last_quorum`` None when etcd records none. Until the first quorum forms, members of
        the last one are told as they register to abandon its step (leadership.takeover_notices)."""
        self._rounds.take_leadership(incarnation, last_quorum, last_quorum_id, next_quorum_id)
        logger.warning(
            "lighthouse leads (incarnation %d): quorum ids from %d; waiting for %s",
            incarnation,
            next_quorum_id,
            sorted(last_quorum) if last_quorum is not None else "no recorded quorum",
        )

    def announce_lease(self, lease_s: float) -> None:
        """Tell every session the leader's lease holds ``lease_s`` longer (Notice.lease_s)."""
        self._rounds.announce_lease(lease_s)

    def step_down(self, reason: str) -> None:
        """Stop serving: every session ends (told where the leader is) and every wait fails.
        Idempotent; the membership is dropped, a later lead restores it from etcd."""
        self._rounds.step_down(reason)

    async def _tick_forever(self) -> None:
        lag = LoopLag()
        while True:
            due = time.monotonic() + self.options.tick_s
            await asyncio.sleep(self.options.tick_s)
            lag.observe(time.monotonic(), due)
            try:
                if not self.serving():
                    self.step_down("its leadership ended")
                    continue
                self._rounds.handle_lost(self.membership.expire(time.monotonic(), lag.allowance_s()))
                self._rounds.decide()
                self._rounds.expire_waits(time.monotonic())
            except Exception:
                logger.exception("lighthouse tick failed; continuing")
