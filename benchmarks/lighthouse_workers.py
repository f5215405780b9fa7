"""The programs the lighthouse benchmark runs as separate OS processes.

``python -m benchmarks.lighthouse_workers ROLE ...`` where ROLE is one of

* ``echo-server``: a trivial grpc.aio server with generic methods and no other work (its
  garbage collector tuned as the lighthouse's is, lighthouse/server/collector.py).
  ``Echo`` (unary) returns the request: one gRPC round trip through the same library, loop
  and loopback as a lighthouse call. ``Barrier`` (stream) holds each message until N
  messages (N is the body) have arrived on any of its streams, then answers each on its
  own stream: the fan-in/fan-out of a fast-path quorum as the lighthouse serves it (a
  reader task and an outbox per stream), with no membership, rules or validation, i.e. what
  gRPC alone costs. ``UnaryBarrier`` does the same with one unary call per member, as the
  lighthouse served quorums before protocol version 2.
* ``echo-client``: sequential ``Echo`` calls; reports every round-trip time.
* ``quorum-members``: many lighthouse members as coroutines of one process, each with its
  own :class:`AsyncLighthouseClient` (session, heartbeats; the clients of one process share
  a connection), plus a raw session stream to a second lighthouse and a raw stream and a
  channel to the barrier server, one connection each (raw streams: HTTP/2 frames on a
  socket, benchmarks/raw_streams.py, so that members cost the process next to nothing). On each ``go STEP MODE SIZE``
  line every member asks
  at once (MODE: one of ``benchmarks.lighthouse.RoundMode``; SIZE: the barrier's N) and
  the process reports when its first and last requests left and answers came back.
* ``notice-member``: one member in its own process that reports every notice it receives.

Protocol: commands are lines on stdin, reports are JSON lines on stdout with an ``"event"``
key. stdin closing means "exit", so a worker never outlives the benchmark driving it.

Times are ``time.monotonic()``, which on Linux is CLOCK_MONOTONIC: one clock for every
process on the machine, so the benchmark may subtract a child's timestamp from its own; and
unlike ``time.time()`` it cannot be stepped by NTP in the middle of a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from benchmarks.raw_streams import RawStream, Round
from lighthouse import AsyncLighthouseClient, Quorum
from lighthouse.server.collector import tune_for_server
from lighthouse.wire.envelope import encode
from lighthouse.wire.protocol import SESSION_METHOD, Notice, QuorumRequest, Register
from lighthouse.wire.replies import QuorumAnswer, QuorumFailed, QuorumUpdate, decode_session_reply

ECHO_METHOD = "/bench.Echo/Echo"
BARRIER_METHOD = "/bench.Echo/Barrier"
UNARY_BARRIER_METHOD = "/bench.Echo/UnaryBarrier"
ECHO_PAYLOAD = bytes(100)
"""About the size of an encoded QuorumRequest, so the baseline moves the same bytes up."""
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""gRPC shares one connection among every channel of a process with the same target and
options (its global subchannel pool): 128 members would ride one TCP connection, so the
server would see 2 peers, not 256. A local pool gives each channel its own connection."""
WAIT_S = 60.0
"""Deadline for registering and for each quorum: generous, because a missed deadline here
means a broken benchmark, and a slow round should be measured, not cut short."""


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines from stdin until it closes, read without blocking the event loop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield line.decode().strip()


async def _until_stdin_closes() -> None:
    async for _ in _stdin_lines():
        pass


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


class _Barrier:
    """Answer in groups: the message (or unary call) that makes N waiting releases all N."""

    def __init__(self) -> None:
        self._waiting: dict[bytes, list[Callable[[bytes], None]]] = {}

    def arrive(self, request: bytes, answer: Callable[[bytes], None]) -> None:
        group = self._waiting.setdefault(request, [])
        group.append(answer)
        if len(group) == int(request):
            del self._waiting[request]
            for release in group:
                release(request)

    async def unary(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.arrive(request, answer.set_result)
        return await answer

    async def stream(self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        outbox: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def read() -> None:
            while (request := await context.read()) is not grpc.aio.EOF:
                self.arrive(request, outbox.put_nowait)

        reader = asyncio.create_task(read())
        reader.add_done_callback(lambda _: outbox.put_nowait(None))
        try:
            while (reply := await outbox.get()) is not None:
                await context.write(reply)
        finally:
            reader.cancel()


async def start_echo_server() -> tuple[grpc.aio.Server, str]:
    """The echo server (``Echo``, ``Barrier``, ``UnaryBarrier``) serving on a free loopback port."""
    barrier = _Barrier()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Echo",
                {
                    "Echo": grpc.unary_unary_rpc_method_handler(_echo),
                    "Barrier": grpc.stream_stream_rpc_method_handler(barrier.stream),
                    "UnaryBarrier": grpc.unary_unary_rpc_method_handler(barrier.unary),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def echo_server() -> None:
    server, address = await start_echo_server()
    _emit("serving", address=address)
    try:
        await _until_stdin_closes()
    finally:
        await server.stop(0)


async def echo_client(address: str, num_calls: int, num_warmup: int) -> None:
    """Sequential echo calls, made the way the lighthouse client makes its unary calls."""
    samples_ms: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), WAIT_S)
        call = channel.unary_unary(ECHO_METHOD)
        for i in range(num_warmup + num_calls):
            start = time.monotonic()
            await call(ECHO_PAYLOAD, timeout=WAIT_S, wait_for_ready=True)
            if i >= num_warmup:
                samples_ms.append((time.monotonic() - start) * 1e3)
    _emit("samples", ms=samples_ms)


async def quorum_members(address: str, wire_address: str, barrier_address: str, replica_ids: list[str]) -> None:
    """Register every member, report ``ready``, then run one round per ``go`` command.

    Besides its client, each member opens a raw session stream to the ``wire`` lighthouse and
    one to the barrier server (raw_streams.py: HTTP/2 frames on a socket, so the members cost
    the process microseconds, not grpc.aio's per-message Python), and a grpc.aio channel for
    the unary barrier, each on a connection of its own (:data:`OWN_CONNECTION`), as a real
    deployment (one manager per group, one host each) would have. The clients' own channels
    cannot be given that option, so their sessions share one connection per process.
    """
    clients = [AsyncLighthouseClient(address, rid) for rid in replica_ids]
    sessions = [RawStream(wire_address, SESSION_METHOD) for _ in replica_ids]
    barrier_streams = [RawStream(barrier_address, BARRIER_METHOD) for _ in replica_ids]
    unary_channels = [grpc.aio.insecure_channel(barrier_address, options=OWN_CONNECTION) for _ in replica_ids]
    try:
        for client in clients:
            await client.start()
        await asyncio.gather(*(c.wait_registered(WAIT_S) for c in clients))
        await asyncio.wait_for(
            asyncio.gather(
                *(s.open() for s in [*sessions, *barrier_streams]), *(ch.channel_ready() for ch in unary_channels)
            ),
            WAIT_S,
        )
        await raw_round(sessions, [encode(Register(rid, "", 1, 0)) for rid in replica_ids], registered)
        unary_barriers = [ch.unary_unary(UNARY_BARRIER_METHOD) for ch in unary_channels]
        _emit("ready", members=len(clients))
        wire_roster = 0
        async for line in _stdin_lines():
            _, step_text, mode, size_text = line.split()
            step, size = int(step_text), int(size_text)
            if mode == "client":
                times, answered = await _client_round(clients, step)
            elif mode == "wire":
                bodies = [
                    encode(
                        QuorumRequest(replica_id=rid, step=step, address="", world_size=1, timeout_s=WAIT_S, ask=step)
                    )
                    for rid in replica_ids
                ]
                times, reply = await raw_round(sessions, bodies, answer_to(step))
                if isinstance(reply, QuorumAnswer):  # the first round, or a new roster
                    wire_roster = len(Quorum.decode(reply.quorum).replica_ids)
                answered = wire_roster
            elif mode == "barrier":
                body = str(size).encode()
                times, raw = await raw_round(barrier_streams, [body] * len(barrier_streams), same_as(body))
                answered = int(raw)
            else:
                times, raw = await _unary_round(unary_barriers, str(size).encode())
                answered = int(raw)
            sends, recvs = [t[0] for t in times], [t[1] for t in times]
            _emit(
                "round",
                step=step,
                mode=mode,
                size=answered,
                first_send=min(sends),
                last_send=max(sends),
                first_recv=min(recvs),
                last_recv=max(recvs),
            )
    finally:
        for stream in [*sessions, *barrier_streams]:
            stream.close()
        await asyncio.gather(*(c.close() for c in clients))
        await asyncio.gather(*(ch.close() for ch in unary_channels))


def registered(raw: bytes) -> Notice:
    """The ``registered`` notice a raw session's Register is answered with (anything else: an error)."""
    reply = decode_session_reply(raw)
    if not isinstance(reply, Notice) or reply.kind != "registered":
        raise RuntimeError(f"expected a 'registered' notice after Register, got {reply!r}")
    return reply


def same_as(body: bytes) -> Callable[[bytes], bytes | None]:
    """The barrier's answer: the message it released (the same bytes)."""
    return lambda raw: raw if raw == body else None


def answer_to(ask: int) -> Callable[[bytes], QuorumAnswer | QuorumUpdate | None]:
    """The reply if ``raw`` answers request ``ask``, else None (a notice): only the envelope
    is decoded (a few dozen bytes in a steady round), the quorum of a whole answer only after
    the clock stopped."""

    def answer(raw: bytes) -> QuorumAnswer | QuorumUpdate | None:
        reply = decode_session_reply(raw)
        if isinstance(reply, QuorumFailed):
            raise RuntimeError(f"quorum request {ask} failed: {reply.code}: {reply.reason}")
        return reply if isinstance(reply, (QuorumAnswer, QuorumUpdate)) and reply.ask == ask else None

    return answer


async def _client_round(clients: list[AsyncLighthouseClient], step: int) -> tuple[list[tuple[float, float]], int]:
    async def ask(client: AsyncLighthouseClient) -> tuple[float, float, Quorum]:
        start = time.monotonic()
        quorum = await client.quorum(step, WAIT_S)
        return start, time.monotonic(), quorum

    answers = await asyncio.gather(*(ask(c) for c in clients))
    return [(a[0], a[1]) for a in answers], len(answers[0][2].replica_ids)


async def raw_round(
    streams: list[RawStream], bodies: list[bytes], accept: Callable[[bytes], Any]
) -> tuple[list[tuple[float, float]], Any]:
    """Every member writes its message, one after another without yielding (a few µs each),
    then the event loop reads until ``accept`` took an answer on every stream; returns
    (asked, answered) times and one accepted answer."""
    round_ = Round(len(streams))
    for stream, body in zip(streams, bodies, strict=True):
        stream.ask(body, accept, round_)
    await asyncio.wait_for(round_.done, WAIT_S)
    return [(s.asked_at, s.answered_at) for s in streams], streams[0].answer


async def _unary_round(
    calls: list[grpc.aio.UnaryUnaryMultiCallable], body: bytes
) -> tuple[list[tuple[float, float]], bytes]:
    async def ask(call: grpc.aio.UnaryUnaryMultiCallable) -> tuple[float, float, bytes]:
        start = time.monotonic()
        raw = await call(body, timeout=WAIT_S + 1, wait_for_ready=True)
        return start, time.monotonic(), raw

    answers = await asyncio.gather(*(ask(c) for c in calls))
    return [(a[0], a[1]) for a in answers], answers[0][2]


async def notice_member(address: str, replica_id: str) -> None:
    """One member; prints each notice with its arrival time, on the client's event loop."""

    def on_notice(notice: Notice) -> None:
        _emit("notice", t=time.monotonic(), kind=notice.kind, subject=notice.replica_id)

    client = AsyncLighthouseClient(address, replica_id, on_notice=on_notice)
    await client.start()
    try:
        await client.wait_registered(WAIT_S)
        _emit("ready", replica_id=replica_id)
        await _until_stdin_closes()
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lighthouse_workers")
    roles = p.add_subparsers(dest="role", required=True)
    roles.add_parser("echo-server")
    ec = roles.add_parser("echo-client")
    ec.add_argument("--address", required=True)
    ec.add_argument("--calls", type=int, required=True)
    ec.add_argument("--warmup", type=int, default=50)
    qm = roles.add_parser("quorum-members")
    qm.add_argument("--address", required=True)
    qm.add_argument("--wire-address", required=True)
    qm.add_argument("--barrier-address", required=True)
    qm.add_argument("--ids", required=True, help="comma-separated replica ids")
    nm = roles.add_parser("notice-member")
    nm.add_argument("--address", required=True)
    nm.add_argument("--id", required=True)
    args = p.parse_args(argv)
    if args.role == "echo-server":
        tune_for_server()  # the collector as the lighthouse runs it, so the floor is measured the same way
        asyncio.run(echo_server())
    elif args.role == "echo-client":
        asyncio.run(echo_client(args.address, args.calls, args.warmup))
    elif args.role == "quorum-members":
        asyncio.run(quorum_members(args.address, args.wire_address, args.barrier_address, args.ids.split(",")))
    else:
        asyncio.run(notice_member(args.address, args.id))


if __name__ == "__main__":
    main()
