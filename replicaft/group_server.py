"""A replica group's manager server (in group rank 0) and the client every rank uses.

The server holds the group's one lighthouse session and turns the W ranks' per-step calls
into one lighthouse request and one commit decision:

* ``Quorum``: waits until every rank asked for the same step, sends one quorum request to the
  lighthouse carrying every rank's addresses, and answers all ranks with the same quorum.
  A rank on another step gets an error naming both steps (never "last rank wins").
* ``Vote``: collects one vote per rank, asks the lighthouse's fence when all are ok, and
  answers all ranks with the same decision (commit.py), and with whether any rank is
  leaving (SIGTERM), so that all of them stop after the same step.
* ``Watch``: streams lighthouse notices to ranks > 0 so they abandon in-flight collectives as
  fast as rank 0 does. The stream is also how the server learns that a rank died: its
  connection closes, and the pending quorum and vote fail at once with ``GroupBroken``
  (as does every later call), instead of waiting out their deadlines for a rank that will
  never ask. A group that lost a rank cannot commit again; it must be restarted whole.

It runs on its own event loop thread so a training thread holding the GIL in long C++ calls
does not starve the lighthouse session; state is touched only on that loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from lighthouse import envelope
from lighthouse.client import AsyncLighthouseClient
from lighthouse.errors import LighthouseError, ProtocolError
from lighthouse.options import TOKEN_METADATA_KEY, token_problem
from lighthouse.protocol import Notice, Quorum
from replicaft import group_protocol as gp
from replicaft.commit import CommitDecision, Vote, check_votes, decide_commit
from replicaft.errors import GroupBroken, GroupError, StepMismatch
from replicaft.options import ManagerOptions

logger = logging.getLogger(__name__)

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", envelope.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", envelope.MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclass
class _QuorumRound:
    step: int
    requests: dict[int, gp.GroupQuorumRequest] = field(default_factory=dict)
    result: asyncio.Future[bytes] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _VoteRound:
    step: int
    votes: dict[int, Vote] = field(default_factory=dict)
    leaving: bool = False
    result: asyncio.Future[CommitDecision] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupServer:
    """Build with options; ``start()`` returns the address ranks connect to."""

    def __init__(self, options: ManagerOptions, on_notice: Callable[[Notice], None]) -> None:
        self.options = options
        self._on_notice = on_notice
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self.lighthouse: AsyncLighthouseClient | None = None
        self._quorum_round: _QuorumRound | None = None
        self._vote_round: _VoteRound | None = None
        self._watchers: list[asyncio.Queue[Notice | None]] = []
        self._open_quorums: list[_QuorumRound] = []
        self._open_votes: list[_VoteRound] = []
        """Rounds not answered yet, including those waiting on the lighthouse."""
        self._stopping = False
        self._broken: str | None = None
        """Why the group cannot commit again (a rank's connection closed), once it happened."""

    def start(self) -> str:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replicaft-group-server", daemon=True)
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(self.options.connect_timeout_s)

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(5.0)
        except Exception:
            logger.exception("group server did not stop cleanly")
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(5.0)
        self._loop = None

    def record_progress(self, step: int) -> None:
        if self.lighthouse is not None:
            self.lighthouse.record_progress(step)

    async def _start(self) -> str:
        o = self.options
        self.lighthouse = AsyncLighthouseClient(
            o.lighthouse,
            o.replica_id,
            world_size=o.group_world_size,
            token=o.token,
            heartbeat_interval_s=o.heartbeat_interval_s,
            on_notice=self._notice,
        )
        await self.lighthouse.start()
        self._server = grpc.aio.server(options=_CHANNEL_OPTIONS[:2])
        handler = grpc.method_handlers_generic_handler(
            gp.SERVICE,
            {
                "Quorum": grpc.unary_unary_rpc_method_handler(self._quorum),
                "Vote": grpc.unary_unary_rpc_method_handler(self._vote),
                "Watch": grpc.unary_stream_rpc_method_handler(self._watch),
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        host = f"[{o.host}]" if ":" in o.host else o.host
        port = self._server.add_insecure_port(f"{host}:0")
        await self._server.start()
        return f"{host}:{port}"

    async def _stop(self) -> None:
        self._stopping = True
        for w in self._watchers:
            w.put_nowait(None)
        if self._server is not None:
            await self._server.stop(0.5)
        if self.lighthouse is not None:
            await self.lighthouse.close()

    def _notice(self, notice: Notice) -> None:
        self._on_notice(notice)
        for w in self._watchers:
            w.put_nowait(notice)

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        problem = token_problem(context.invocation_metadata(), self.options.token)
        if problem is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{problem} {TOKEN_METADATA_KEY}")

    async def _quorum(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        try:
            req = gp.GroupQuorumRequest.decode(raw)
        except ProtocolError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if self._broken is not None:
            await context.abort(grpc.StatusCode.ABORTED, self._broken)
        r = self._quorum_round
        if r is not None and r.step != req.step:
            message = (
                f"group {self.options.replica_id!r}: rank {req.group_rank} asked for a quorum at step "
                f"{req.step} while ranks {sorted(r.requests)} asked at step {r.step}; every rank of a "
                "group must run the same step"
            )
            if not r.result.done():
                r.result.set_exception(StepMismatch(message))
            self._quorum_round = None
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        if r is None:
            r = self._quorum_round = _QuorumRound(req.step)
            self._open_quorums = [*(q for q in self._open_quorums if not q.result.done()), r]
        r.requests[req.group_rank] = req
        if len(r.requests) == self.options.group_world_size:
            self._quorum_round = None
            asyncio.create_task(self._ask_lighthouse(r, req.timeout_s))
        try:
            return await asyncio.wait_for(asyncio.shield(r.result), req.timeout_s + 1.0)
        except TimeoutError:
            if self._quorum_round is r:
                self._quorum_round = None
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"ranks {sorted(set(range(self.options.group_world_size)) - set(r.requests))} of group "
                f"{self.options.replica_id!r} never asked for the quorum of step {r.step}",
            )
        except StepMismatch as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except GroupBroken as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        except LighthouseError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(e).__name__}: {e}")
        raise AssertionError("unreachable")

    async def _ask_lighthouse(self, r: _QuorumRound, timeout_s: float) -> None:
        assert self.lighthouse is not None
        ranks = [r.requests[i].rank_data for i in range(self.options.group_world_size)]
        try:
            quorum = await self.lighthouse.quorum(
                r.step,
                timeout_s,
                commit_failures=max(q.commit_failures for q in r.requests.values()),
                data={"ranks": ranks},
            )
            if not r.result.done():
                r.result.set_result(envelope.encode(quorum))
        except Exception as e:
            if not r.result.done():
                r.result.set_exception(e)

    async def _vote(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._authenticate(context)
        try:
            req = gp.VoteRequest.decode(raw)
        except ProtocolError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if self._broken is not None:
            return envelope.encode(gp.VoteResponse(False, self._broken))
        r = self._vote_round
        if r is None or r.step != req.step or req.group_rank in r.votes:
            if r is not None and not r.result.done():
                r.result.set_result(CommitDecision(False, f"rank {req.group_rank} voted for step {req.step} "
                                                   f"before ranks {sorted(r.votes)} finished step {r.step}"))
            r = self._vote_round = _VoteRound(req.step)
            self._open_votes = [*(v for v in self._open_votes if not v.result.done()), r]
        r.votes[req.group_rank] = Vote(req.group_rank, req.step, req.quorum_id, req.ok, req.reason)
        r.leaving |= req.leaving
        if len(r.votes) == self.options.group_world_size:
            self._vote_round = None
            asyncio.create_task(self._decide(r, req.timeout_s))
        try:
            decision = await asyncio.wait_for(asyncio.shield(r.result), req.timeout_s)
        except TimeoutError:
            if self._vote_round is r:
                self._vote_round = None
            decision = CommitDecision(False, f"not every rank voted within {req.timeout_s:g}s")
        return envelope.encode(gp.VoteResponse(decision.commit, decision.reason, r.leaving))

    async def _decide(self, r: _VoteRound, timeout_s: float) -> None:
        assert self.lighthouse is not None
        local = check_votes(list(r.votes.values()), self.options.group_world_size)
        if not local.commit:
            if not r.result.done():
                r.result.set_result(local)
            return
        vote = next(iter(r.votes.values()))
        fence = await self.lighthouse.fence(vote.quorum_id, vote.step, timeout_s)
        if not r.result.done():
            r.result.set_result(decide_commit(local, fence.ok, fence.reason))

    async def _watch(self, raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await self._authenticate(context)
        try:
            req = gp.WatchRequest.decode(raw)
        except ProtocolError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        outbox: asyncio.Queue[Notice | None] = asyncio.Queue()
        self._watchers.append(outbox)
        try:
            while (notice := await outbox.get()) is not None:
                yield envelope.encode(notice)
        finally:
            self._watchers.remove(outbox)
            if not self._stopping:
                self._rank_gone(req.group_rank)

    def _rank_gone(self, rank: int) -> None:
        """Rank ``rank``'s notice stream closed while the server runs: the rank exited or died."""
        if self._broken is not None:
            return
        self._broken = (f"rank {rank} of group {self.options.replica_id!r} is gone (its connection to the group "
                        "manager closed); the group cannot commit again and must be restarted whole")
        logger.warning("[%s] %s", self.options.replica_id, self._broken)
        self._quorum_round = self._vote_round = None
        for q in self._open_quorums:
            if not q.result.done():
                q.result.set_exception(GroupBroken(self._broken))
        for v in self._open_votes:
            if not v.result.done():
                v.result.set_result(CommitDecision(False, self._broken))


class GroupClient:
    """Every rank's blocking client of its group's manager server."""

    def __init__(self, address: str, group_rank: int, token: str | None) -> None:
        self.address = address
        self.group_rank = group_rank
        self._metadata = ((TOKEN_METADATA_KEY, token),) if token else ()
        self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._watch_thread: threading.Thread | None = None

    def close(self) -> None:
        self._channel.close()

    def quorum(self, step: int, timeout_s: float, *, commit_failures: int, rank_data: dict) -> Quorum:
        req = gp.GroupQuorumRequest(self.group_rank, step, timeout_s, commit_failures, rank_data)
        raw = self._call(gp.QUORUM_METHOD, envelope.encode(req), timeout_s + 2.0)
        return Quorum.decode(raw)

    def vote(self, step: int, quorum_id: int, ok: bool, reason: str, timeout_s: float, *, leaving: bool = False) -> gp.VoteResponse:
        req = gp.VoteRequest(self.group_rank, step, quorum_id, ok, reason, timeout_s, leaving)
        return gp.VoteResponse.decode(self._call(gp.VOTE_METHOD, envelope.encode(req), timeout_s + 2.0))

    def watch(self, on_notice: Callable[[Notice], None]) -> None:
        """Deliver the lighthouse's notices to ``on_notice`` from a background thread."""
        call = self._channel.unary_stream(gp.WATCH_METHOD)

        def pump() -> None:
            try:
                for raw in call(envelope.encode(gp.WatchRequest(self.group_rank)), metadata=self._metadata, wait_for_ready=True):
                    on_notice(Notice.decode(raw))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED:
                    logger.warning("notice stream from the group manager ended: %s", e.details())

        self._watch_thread = threading.Thread(target=pump, name="replicaft-group-watch", daemon=True)
        self._watch_thread.start()

    def _call(self, method: str, body: bytes, timeout_s: float) -> bytes:
        try:
            return self._channel.unary_unary(method)(body, timeout=timeout_s, metadata=self._metadata, wait_for_ready=True)
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                raise StepMismatch(details) from None
            if code == grpc.StatusCode.ABORTED:
                raise GroupBroken(details) from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise GroupError(f"group manager at {self.address}: {code.name}: {details}") from None
            raise GroupError(f"group manager at {self.address} refused {method}: {code.name}: {details}") from None

