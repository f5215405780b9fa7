"""The programs the lighthouse benchmark runs as separate OS processes.

``python -m benchmarks.lighthouse_workers ROLE ...`` where ROLE is one of

* ``echo-server``: a trivial grpc.aio server with two generic unary methods and no other
  work. ``Echo`` returns the request: one gRPC round trip through the same library, loop
  and loopback as a lighthouse call. ``Barrier`` holds each call until N calls (N is the
  request body) are waiting, then answers them all: the fan-in/fan-out pattern of a
  fast-path quorum with no membership, rules or validation, i.e. what gRPC alone costs.
* ``echo-client``: sequential ``Echo`` calls; reports every round-trip time.
* ``quorum-members``: many lighthouse members as coroutines of one process, each with its
  own :class:`AsyncLighthouseClient` (session, heartbeats) on its own connection. On each
  ``go STEP MODE SIZE`` line from stdin, every member asks at once (MODE: see
  ``benchmarks.lighthouse.RoundMode``; SIZE: the barrier's N) and
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
from collections.abc import AsyncIterator
from typing import Any

import grpc

from lighthouse import AsyncLighthouseClient, Quorum
from lighthouse.protocol import QUORUM_METHOD, Notice, QuorumRequest, encode

ECHO_METHOD = "/bench.Echo/Echo"
BARRIER_METHOD = "/bench.Echo/Barrier"
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
    """Answer calls in groups: the call that makes N waiting releases all N."""

    def __init__(self) -> None:
        self._waiting: dict[bytes, list[asyncio.Future[bytes]]] = {}

    async def answer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        group = self._waiting.setdefault(request, [])
        group.append(answer)
        if len(group) == int(request):
            del self._waiting[request]
            for waiter in group:
                waiter.set_result(request)
        return await answer


async def echo_server() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("bench.Echo", {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Barrier": grpc.unary_unary_rpc_method_handler(_Barrier().answer),
        }),
    ))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _emit("serving", address=f"127.0.0.1:{port}")
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


async def quorum_members(address: str, barrier_address: str, replica_ids: list[str]) -> None:
    """Register every member, report ``ready``, then run one round per ``go`` command.

    Each member also opens two plain channels, to the lighthouse and to the barrier server,
    each on a connection of its own (:data:`OWN_CONNECTION`), as a real deployment (one
    manager per group, one host each) would have. The clients' own channels cannot be
    given that option, so their sessions and ``client``-mode calls share one connection
    per process.
    """
    clients = [AsyncLighthouseClient(address, rid) for rid in replica_ids]
    wire_channels = [grpc.aio.insecure_channel(address, options=OWN_CONNECTION) for _ in replica_ids]
    barrier_channels = [grpc.aio.insecure_channel(barrier_address, options=OWN_CONNECTION) for _ in replica_ids]
    channels = wire_channels + barrier_channels
    try:
        for client in clients:
            await client.start()
        await asyncio.gather(*(c.wait_registered(WAIT_S) for c in clients))
        await asyncio.wait_for(asyncio.gather(*(ch.channel_ready() for ch in channels)), WAIT_S)
        wire_calls = [ch.unary_unary(QUORUM_METHOD) for ch in wire_channels]
        barrier_calls = [ch.unary_unary(BARRIER_METHOD) for ch in barrier_channels]
        _emit("ready", members=len(clients))
        async for line in _stdin_lines():
            _, step_text, mode, size_text = line.split()
            step, size = int(step_text), int(size_text)
            if mode == "client":
                times, answered = await _client_round(clients, step)
            elif mode == "wire":
                bodies = [
                    encode(QuorumRequest(replica_id=rid, step=step, address="", world_size=1, timeout_s=WAIT_S))
                    for rid in replica_ids
                ]
                times, raw = await _raw_round(wire_calls, bodies)
                answered = len(Quorum.decode(raw).participants)
            else:
                times, raw = await _raw_round(barrier_calls, [str(size).encode()] * len(barrier_calls))
                answered = int(raw)
            sends, recvs = [t[0] for t in times], [t[1] for t in times]
            _emit("round", step=step, mode=mode, size=answered, first_send=min(sends), last_send=max(sends),
                  first_recv=min(recvs), last_recv=max(recvs))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
        await asyncio.gather(*(ch.close() for ch in channels))


async def _client_round(clients: list[AsyncLighthouseClient], step: int) -> tuple[list[tuple[float, float]], int]:
    async def ask(client: AsyncLighthouseClient) -> tuple[float, float, Quorum]:
        start = time.monotonic()
        quorum = await client.quorum(step, WAIT_S)
        return start, time.monotonic(), quorum

    answers = await asyncio.gather(*(ask(c) for c in clients))
    return [(a[0], a[1]) for a in answers], len(answers[0][2].participants)


async def _raw_round(
    calls: list[grpc.aio.UnaryUnaryMultiCallable], bodies: list[bytes]
) -> tuple[list[tuple[float, float]], bytes]:
    """Every member makes its call at once; returns (asked, answered) times and one reply.

    The reply is checked by the caller after the clock stopped: decoding all of them would
    put back the O(N^2) client work this mode exists to leave out.
    """
    async def ask(call: grpc.aio.UnaryUnaryMultiCallable, body: bytes) -> tuple[float, float, bytes]:
        start = time.monotonic()
        raw = await call(body, timeout=WAIT_S + 1, wait_for_ready=True)
        return start, time.monotonic(), raw

    answers = await asyncio.gather(*(ask(c, b) for c, b in zip(calls, bodies, strict=True)))
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
    qm.add_argument("--barrier-address", required=True)
    qm.add_argument("--ids", required=True, help="comma-separated replica ids")
    nm = roles.add_parser("notice-member")
    nm.add_argument("--address", required=True)
    nm.add_argument("--id", required=True)
    args = p.parse_args(argv)
    if args.role == "echo-server":
        asyncio.run(echo_server())
    elif args.role == "echo-client":
        asyncio.run(echo_client(args.address, args.calls, args.warmup))
    elif args.role == "quorum-members":
        asyncio.run(quorum_members(args.address, args.barrier_address, args.ids.split(",")))
    else:
        asyncio.run(notice_member(args.address, args.id))


if __name__ == "__main__":
    main()
