"""The lighthouse benchmark's simulated members (benchmarks/raw_streams.py): gRPC streams in
hand-built HTTP/2 frames must meet a real grpc.aio server exactly as grpc.aio clients do, or
the 1,024-member figures would measure a different protocol. Servers run in this process on
loopback (grpc.aio's own server, and the real LighthouseServer), one event loop, no sleeps;
torchft's lighthouse and its members run as the benchmark runs them, in processes of their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from benchmarks.lighthouse_heartbeating import STEP_GAP_S, HeartbeatingSamples, heartbeating_rounds
from benchmarks.lighthouse_torchft import start_torchft
from benchmarks.lighthouse_workers import (
    BARRIER_METHOD,
    answer_to,
    raw_round,
    registered,
    same_as,
    start_echo_server,
)
from benchmarks.processes import ChildProcesses
from benchmarks.raw_streams import RawStream, StreamFailed
from lighthouse.config.options import LighthouseOptions, MembershipOptions
from lighthouse.server.grpc_server import LighthouseServer
from lighthouse.wire.envelope import encode
from lighthouse.wire.protocol import SESSION_METHOD, Quorum, QuorumRequest, Register
from lighthouse.wire.replies import QuorumAnswer, QuorumUpdate

pytestmark = pytest.mark.timeout(30)


def run_with_echo_server(test: Callable[[str], Awaitable[None]]) -> None:
    async def main() -> None:
        server, address = await start_echo_server()
        try:
            await test(address)
        finally:
            await server.stop(0)

    asyncio.run(main())


async def opened(address: str, method: str, count: int) -> list[RawStream]:
    streams = [RawStream(address, method) for _ in range(count)]
    await asyncio.gather(*(s.open() for s in streams))
    return streams


def test_raw_streams_are_released_together_by_the_barrier() -> None:
    async def rounds(address: str) -> None:
        streams = await opened(address, BARRIER_METHOD, 3)
        try:
            for _ in range(3):
                times, answer = await raw_round(streams, [b"3"] * 3, same_as(b"3"))
                assert answer == b"3"
                assert all(asked <= answered for asked, answered in times)
        finally:
            for s in streams:
                s.close()

    run_with_echo_server(rounds)


def test_raw_stream_honours_the_servers_flow_control_window() -> None:
    """100 KB through one stream: past HTTP/2's initial 64 KiB window only if the client takes
    the server's WINDOW_UPDATEs (and answers its SETTINGS and PINGs)."""
    body = b"1".ljust(1000)  # the barrier reads int(body) = 1: each message releases itself

    async def rounds(address: str) -> None:
        [stream] = await opened(address, BARRIER_METHOD, 1)
        try:
            for _ in range(100):
                _, answer = await raw_round([stream], [body], same_as(body))
                assert answer == body
        finally:
            stream.close()

    run_with_echo_server(rounds)


def test_raw_stream_to_an_unknown_method_fails_its_round() -> None:
    async def round_(address: str) -> None:
        streams = await opened(address, "/bench.Echo/NoSuchMethod", 1)
        with pytest.raises(StreamFailed, match="NoSuchMethod: the server ended the stream"):
            await raw_round(streams, [b"1"], same_as(b"1"))

    run_with_echo_server(round_)


def test_raw_sessions_register_and_get_whole_quorum_then_updates_from_the_lighthouse() -> None:
    ids = ["m0", "m1", "m2"]

    async def main() -> None:
        server = LighthouseServer(
            LighthouseOptions(
                port=0, membership=MembershipOptions(join_timeout_s=10, heartbeat_timeout_s=10, progress_timeout_s=20)
            )
        )
        address = (await server.start()).grpc
        sessions = await opened(address, SESSION_METHOD, len(ids))
        try:
            await raw_round(sessions, [encode(Register(rid, "", 1, 0)) for rid in ids], registered)
            replies = []
            for step in (1, 2):
                bodies = [
                    encode(QuorumRequest(replica_id=rid, step=step, address="", world_size=1, timeout_s=10, ask=step))
                    for rid in ids
                ]
                replies.append((await raw_round(sessions, bodies, answer_to(step)))[1])
            first, second = replies
            assert isinstance(first, QuorumAnswer) and Quorum.decode(first.quorum).replica_ids == tuple(ids)
            assert isinstance(second, QuorumUpdate) and second.ask == 2
        finally:
            for s in sessions:
                s.close()
            await server.stop(0)

    asyncio.run(main())


def test_torchft_members_get_whole_quorums_from_torchfts_lighthouse_round_after_round() -> None:
    """The torchft rows: its Rust lighthouse in a process of its own, members in two others;
    every round must answer all of them (the first by the slow path, the next by the fast)."""
    pytest.importorskip("torchft._torchft")
    ids = ["m0", "m1", "m2"]

    async def main() -> None:
        async with ChildProcesses() as children:
            deadline = time.monotonic() + 25
            server, members = await start_torchft(children, ids, 2, deadline)
            for step in (1, 2, 3):
                for m in members:
                    m.send_line(f"go {step} torchft {len(ids)}")
                reports = [await m.expect_event("round", deadline, step=step) for m in members]
                assert [r["size"] for r in reports] == [3, 3]
                assert all(r["first_send"] <= r["last_send"] <= r["last_recv"] for r in reports)
            assert server.cpu_seconds() > 0  # its CPU is read from /proc, as ours is

    asyncio.run(main())


def test_torchft_members_heartbeat_through_paced_steps_and_stop_when_told() -> None:
    """The heartbeating rows: torchft's members call LighthouseClient.heartbeat on threads of
    their own while they ask for quorums, and the paced phase counts what each sent."""
    pytest.importorskip("torchft._torchft")
    ids = ["m0", "m1", "m2"]

    async def main() -> None:
        async with ChildProcesses() as children:
            deadline = time.monotonic() + 25
            server, members = await start_torchft(children, ids, 2, deadline)
            step = 0

            async def one_round(mode: str) -> float:
                nonlocal step
                step += 1
                for m in members:
                    m.send_line(f"go {step} torchft {len(ids)}")
                reports = [await m.expect_event("round", deadline, step=step) for m in members]
                assert [r["size"] for r in reports] == [3, 3]
                return 1e3 * (max(r["last_recv"] for r in reports) - max(r["last_send"] for r in reports))

            hb = await heartbeating_rounds(one_round, {"client": server, "torchft": server}, members, steps=2)
            assert [len(hb.latency_ms[m]) for m in ("client", "torchft")] == [2, 2]
            # Two pauses of STEP_GAP_S at one heartbeat per member per 0.1 s: ~10 each, at least
            # a few on a loaded machine; none at all would mean the threads never ran.
            assert hb.torchft_heartbeats >= len(ids) * 2
            assert hb.wall_s >= 2 * STEP_GAP_S
            # Stopped: after one more round, a second stop finds no threads and no more sent
            # (the counts are cumulative and were 0 when the phase started them).
            await one_round("torchft")
            for m in members:
                m.send_line("heartbeat stop")
            after = [await m.expect_event("heartbeats", deadline, running=False) for m in members]
            assert sum(r["sent"] for r in after) == hb.torchft_heartbeats

    asyncio.run(main())


def test_cpu_per_round_of_a_paced_phase_is_its_whole_cpu_over_its_steps() -> None:
    hb = HeartbeatingSamples()
    hb.latency_ms["torchft"] += [1.0, 2.0, 3.0, 4.0]
    hb.server_cpu_s["torchft"] = 0.2
    assert hb.cpu_ms_per_round("torchft") == pytest.approx(50.0)
