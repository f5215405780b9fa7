"""The lighthouse gRPC server: a thin asyncio shell around :class:`Membership`.

Each handler decodes and validates, makes one synchronous call into the state machine and
encodes the answer; the rules live in membership.py and quorum.py. All state is touched only
on this server's event loop, between awaits, so there are no locks.

RPCs (generic handlers, msgpack bodies; see protocol.py):

* ``Session`` (stream/stream): ``Register`` then ``Heartbeat``s up; ``Notice``s down. The
  stream closing is how a dead group is detected without waiting for a heartbeat expiry.
* ``Quorum`` (unary long poll with the caller's deadline): answered with the encoded
  :class:`Quorum` once one containing the caller forms. The same bytes go to every member.
* ``Fence`` (unary): may this group commit a step of this quorum?
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from lighthouse import protocol
from lighthouse.errors import ProtocolError, VersionMismatch
from lighthouse.membership import Lost, Membership
from lighthouse.metrics import Metrics
from lighthouse.options import TOKEN_METADATA_KEY, LighthouseOptions, token_problem
from lighthouse.protocol import FenceRequest, Heartbeat, Notice, QuorumRequest, Register
from lighthouse.status import StatusServer

logger = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 10.0
"""A session must send its Register message within this time of opening the stream."""


@dataclass(frozen=True, slots=True)
class ServingAddresses:
    grpc: str
    status: str | None


class _Session:
    """One open session stream: its outbox and the task pumping it."""

    def __init__(self, replica_id: str, serial: int) -> None:
        self.replica_id = replica_id
        self.serial = serial
        self.outbox: asyncio.Queue[Notice | None] = asyncio.Queue()


class LighthouseServer:
    """Build with options; ``start()`` binds and serves; ``stop()`` shuts down cleanly."""

    def __init__(self, options: LighthouseOptions, *, incarnation: int | None = None) -> None:
        self.options = options
        self.incarnation = incarnation if incarnation is not None else time.time_ns() // 1000
        self.membership = Membership(options.membership, self.incarnation)
        self.metrics = Metrics()
        self._sessions: dict[str, _Session] = {}
        self._waiters: dict[str, asyncio.Future[bytes]] = {}
        self._round_started: float | None = None
        self._server: grpc.aio.Server | None = None
        self._status: StatusServer | None = None
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> ServingAddresses:
        o = self.options
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", protocol.MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", protocol.MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ]
        )
        handler = grpc.method_handlers_generic_handler(
            protocol.SERVICE,
            {
                "Session": grpc.stream_stream_rpc_method_handler(self._session),
                "Quorum": grpc.unary_unary_rpc_method_handler(self._quorum),
                "Fence": grpc.unary_unary_rpc_method_handler(self._fence),
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        bind = f"[{o.host}]" if ":" in o.host else o.host
        cause: Exception | None = None
        unbound = (
            f"lighthouse could not bind {o.host}:{o.port} (address in use?); pick another "
            "--port, or 0 for any free one"
        )
        try:
            port = self._server.add_insecure_port(f"{bind}:{o.port}")
        except RuntimeError as e:  # recent grpcio raises where older ones returned port 0
            port, cause = 0, e
        if port == 0:
            await self.stop(0)
            raise OSError(unbound) from cause
        await self._server.start()
        self._ticker = asyncio.create_task(self._tick_forever(), name="lighthouse-tick")
        status = None
        if o.status_port is not None:
            self._status = StatusServer(self)
            try:
                status = await self._status.start(o.host, o.status_port)
            except OSError as e:
                self._status = None
                await self.stop(0)
                raise OSError(
                    f"lighthouse could not serve its status page on {o.host}:{o.status_port} "
                    f"({e.strerror or e}); pick another --status-port, or 0 for any free one"
                ) from e
        grpc_address = f"{bind}:{port}"
        logger.info("lighthouse incarnation %d serving gRPC at %s", self.incarnation, grpc_address)
        return ServingAddresses(grpc_address, status)

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for s in self._sessions.values():
            s.outbox.put_nowait(None)
        if self._status is not None:
            await self._status.stop()
        if self._server is not None:
            await self._server.stop(grace_s)

    # -- handlers ---------------------------------------------------------------------------

    async def _session(self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await self._authenticate(context)
        try:
            first = await asyncio.wait_for(context.read(), REGISTER_TIMEOUT_S)
            if first is grpc.aio.EOF:
                return
            reg = Register.decode(first)
        except (asyncio.TimeoutError, ProtocolError) as e:  # not the builtin before 3.11
            await self._reject(context, e if isinstance(e, ProtocolError) else ProtocolError(
                f"no Register message within {REGISTER_TIMEOUT_S:g}s of opening a session"))
            return
        serial, lost = self.membership.register(reg, time.monotonic())
        # Before the new session takes the replica id's slot, so the superseded session is
        # the one told it is fenced.
        self._handle_lost(lost)
        session = _Session(reg.replica_id, serial)
        self._sessions[reg.replica_id] = session
        self.metrics.sessions_open += 1
        logger.info("session %d opened by %s (%s) at step %d", serial, reg.replica_id, reg.address or "-", reg.step)
        reader = asyncio.create_task(self._read_heartbeats(session, context))
        get: asyncio.Future[Notice | None] | None = None
        try:
            await context.write(protocol.encode(Notice("registered", incarnation=self.incarnation, replica_id=reg.replica_id)))
            while True:
                get = asyncio.ensure_future(session.outbox.get())
                done, _ = await asyncio.wait({get, reader}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    break
                notice = get.result()
                if notice is None:
                    break
                await context.write(protocol.encode(notice))
                if notice.kind == "fenced":
                    break
        finally:
            reader.cancel()
            if get is not None:
                get.cancel()
            self.metrics.sessions_open -= 1
            if self._sessions.get(reg.replica_id) is session:
                del self._sessions[reg.replica_id]
            self._handle_lost(self.membership.close_session(reg.replica_id, serial, "session stream closed"))
            self._decide()

    async def _read_heartbeats(self, session: _Session, context: grpc.aio.ServicerContext) -> None:
        while True:
            raw = await context.read()
            if raw is grpc.aio.EOF:
                return
            try:
                hb = Heartbeat.decode(raw)
            except ProtocolError as e:
                self.metrics.rejected_requests += 1
                logger.warning("closing session of %s: %s", session.replica_id, e)
                return
            if hb.leaving:
                self._handle_lost(
                    self.membership.close_session(
                        session.replica_id, session.serial, "left cleanly after its last step", graceful=True
                    )
                )
                self._decide()
                return
            if not self.membership.heartbeat(session.replica_id, session.serial, hb, time.monotonic()):
                return

    async def _quorum(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        try:
            req = QuorumRequest.decode(raw)
        except ProtocolError as e:
            await self._reject(context, e)
        now = time.monotonic()
        if not self.membership.join(req, now):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"replica {req.replica_id!r} has no open session; open a Session before "
                "asking for a quorum",
            )
        previous = self._waiters.pop(req.replica_id, None)
        if previous is not None and not previous.done():
            previous.set_exception(ProtocolError(f"superseded by a newer Quorum call from {req.replica_id!r}"))
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiters[req.replica_id] = waiter
        if self._round_started is None:
            self._round_started = now
        if self.membership.may_form_now():
            self._decide()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), req.timeout_s)
        except asyncio.TimeoutError:
            reason = self.membership.last_decision.reason if self.membership.last_decision else ""
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no quorum with {req.replica_id!r} formed within {req.timeout_s:g}s: {reason}",
            )
        except ProtocolError as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        finally:
            if self._waiters.get(req.replica_id) is waiter:
                del self._waiters[req.replica_id]
                if not waiter.done():
                    self.membership.leave(req.replica_id, time.monotonic())
        raise AssertionError("unreachable")

    async def _fence(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        try:
            req = FenceRequest.decode(raw)
        except ProtocolError as e:
            await self._reject(context, e)
        return protocol.encode(self.membership.fence(req))

    # -- state-machine plumbing -------------------------------------------------------------

    def _decide(self) -> None:
        now = time.monotonic()
        previous_id = self.membership.current.quorum_id if self.membership.current else None
        quorum = self.membership.decide(now)
        if quorum is None:
            return
        self.metrics.quorums_formed += 1
        if self._round_started is not None:
            self.metrics.quorum_latency_s.observe(now - self._round_started)
        self._round_started = now if self._waiters.keys() - set(quorum.replica_ids) else None
        encoded = protocol.encode(quorum)
        for rid in quorum.replica_ids:
            waiter = self._waiters.pop(rid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(encoded)
        if quorum.quorum_id != previous_id:
            self.metrics.quorum_ids_issued += 1
            logger.info("quorum %d formed with %s (%s)", quorum.quorum_id, list(quorum.replica_ids),
                        self.membership.last_decision.reason if self.membership.last_decision else "")
            notice = Notice("quorum_formed", quorum_id=quorum.quorum_id, incarnation=self.incarnation)
            for rid in quorum.replica_ids:
                s = self._sessions.get(rid)
                if s is not None:
                    s.outbox.put_nowait(notice)

    def _handle_lost(self, lost: list[Lost]) -> None:
        for m in lost:
            if m.graceful:
                logger.info("member %s left (quorum %d)", m.replica_id, m.quorum_id)
            else:
                self.metrics.members_lost += 1
                logger.warning("member %s lost (quorum %d): %s", m.replica_id, m.quorum_id, m.reason)
            waiter = self._waiters.pop(m.replica_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(ProtocolError(f"replica {m.replica_id!r} was declared lost: {m.reason}"))
            own = self._sessions.get(m.replica_id)
            if own is not None and own.serial == m.session and not m.graceful:
                own.outbox.put_nowait(Notice("fenced", m.quorum_id, m.replica_id, m.reason, self.incarnation))
            kind = "member_left" if m.graceful else "member_lost"
            notice = Notice(kind, m.quorum_id, m.replica_id, m.reason, self.incarnation)
            for rid, s in self._sessions.items():
                if rid != m.replica_id:
                    s.outbox.put_nowait(notice)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.tick_s)
            try:
                self._handle_lost(self.membership.expire(time.monotonic()))
                self._decide()
            except Exception:
                logger.exception("lighthouse tick failed; continuing")

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        problem = token_problem(context.invocation_metadata(), self.options.token)
        if problem is not None:
            self.metrics.rejected_requests += 1
            logger.warning("rejected a call from %s: %s token", context.peer(), problem)
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{problem} {TOKEN_METADATA_KEY}; start the manager with the lighthouse's token "
                "(--token or REPLICAFT_TOKEN)",
            )

    async def _reject(self, context: grpc.aio.ServicerContext, error: ProtocolError) -> None:
        self.metrics.rejected_requests += 1
        logger.warning("rejected a message from %s: %s", context.peer(), error)
        code = grpc.StatusCode.FAILED_PRECONDITION if isinstance(error, VersionMismatch) else grpc.StatusCode.INVALID_ARGUMENT
        await context.abort(code, str(error))
