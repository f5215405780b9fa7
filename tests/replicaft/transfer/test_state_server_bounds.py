"""What a peer can hold of a state server (issue 19, "resource bounds"), over real sockets.

Each test runs a real StateServer with its limits shortened (``ServerLimits``) and drives it
with raw sockets: a client that trickles its handshake or a request, connections past the
caps, a frame announcing more than the limit. Waits are for observable events (the server
closing the socket, an error frame) with a deadline; no sleep is used to synchronise. The
admission rule itself is a pure function, tested by table.
"""

from __future__ import annotations

import select
import socket
import struct
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from support.socket_waits import WAIT_S, read_until_closed, wait_for
from support.transfer_donor import build_snapshot

from lighthouse.errors import ProtocolError
from lighthouse.tls.throwaway_ca import make_throwaway_ca
from replicaft.transfer.admission import Admission, ServerLimits, admit
from replicaft.transfer.client import fetch_state
from replicaft.transfer.donors import Donor
from replicaft.transfer.requests import fetch_manifest
from replicaft.transfer.server import MAX_ERROR_CHARS, StateServer
from replicaft.transfer.snapshot import Snapshot, tensors_from_buffer
from replicaft.transfer.wire import MAX_FRAME_BYTES, WIRE_VERSION, recv_frame

STEP = 7
TOKEN = "bounds-token"
SLACK_S = 1.0
"""How late past its deadline a cut may be observed on a loaded 2-core host."""

SNAPSHOT = build_snapshot(256 * 1024, STEP, "donor")
LONG = 30.0
"""A limit a test does not exercise: far longer than the test runs."""


@contextmanager
def serving(limits: ServerLimits, snapshot: Snapshot = SNAPSHOT) -> Iterator[tuple[StateServer, tuple[str, int]]]:
    server = StateServer("127.0.0.1", TOKEN, limits=limits)
    host, port = server.start().rsplit(":", 1)
    server.publish(snapshot)
    try:
        yield server, (host, int(port))
    finally:
        server.stop()


def frame(body: dict[str, Any]) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


def manifest_request(**fields: Any) -> bytes:
    return frame({"v": WIRE_VERSION, "token": TOKEN, "op": "manifest", "step": STEP, **fields})


def trickle_until_closed(sock: socket.socket, data: bytes, every_s: float, deadline: float) -> tuple[float, bytes]:
    """Send ``data`` one byte every ``every_s`` until the server closes the connection; the
    time it closed (monotonic) and what it sent before."""
    received = bytearray()
    for byte in data:
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic(), bytes(received)
        readable, _, _ = select.select([sock], [], [], every_s)
        if readable:
            received += read_until_closed(sock, deadline)
            return time.monotonic(), bytes(received)
        assert time.monotonic() < deadline, "the server let a trickling client go on past every deadline"
    raise AssertionError(f"the client sent all {len(data)} bytes, one every {every_s}s, without being cut")


def error_frame(raw: bytes) -> dict[str, Any]:
    (length,) = struct.unpack(">I", raw[:4])
    reply = msgpack.unpackb(raw[4 : 4 + length], raw=False)
    assert reply["ok"] is False, reply
    return reply


def authenticated(address: tuple[str, int]) -> socket.socket:
    """A connection that has sent a request with the token and read the answer, kept open."""
    sock = socket.create_connection(address, timeout=WAIT_S)
    sock.sendall(manifest_request())
    num_bytes = recv_frame(sock, "reply")["num_bytes"]
    got = 0
    while got < num_bytes:
        got += len(sock.recv(num_bytes - got))
    return sock


def assert_same_state(tensors: list[torch.Tensor], snapshot: Snapshot) -> None:
    for got, want in zip(tensors, tensors_from_buffer(snapshot.buffer, snapshot.manifest), strict=True):
        assert torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))


# -- time ---------------------------------------------------------------------------------------


def test_a_client_trickling_its_handshake_is_cut_at_the_handshake_deadline_issue_19() -> None:
    # One byte every 0.1 s: each recv waits far less than any per-recv timeout, so only a
    # deadline over the whole handshake cuts it (the old server waited 30 s per byte).
    limits = ServerLimits(handshake_timeout_s=0.5, request_timeout_s=LONG, idle_timeout_s=LONG)
    with serving(limits) as (server, address), socket.create_connection(address, timeout=WAIT_S) as sock:
        connected = time.monotonic()
        closed, sent_back = trickle_until_closed(sock, manifest_request(), 0.1, connected + WAIT_S)
        assert 0.5 - 0.05 <= closed - connected <= 0.5 + SLACK_S
        reply = error_frame(sent_back)
        assert reply["code"] == "timeout" and "handshake_timeout_s=0.5 after connecting" in reply["error"]
        wait_for(lambda: server.statistics().num_open == 0, "the connection's thread ending")
        assert server.statistics().num_handshake_timeouts == 1


def test_an_authenticated_client_trickling_a_request_is_cut_at_the_request_deadline_issue_19() -> None:
    limits = ServerLimits(handshake_timeout_s=LONG, request_timeout_s=0.5, idle_timeout_s=LONG)
    with serving(limits) as (server, address), authenticated(address) as sock:
        started = time.monotonic()
        closed, sent_back = trickle_until_closed(sock, manifest_request(), 0.1, started + WAIT_S)
        assert 0.5 - 0.05 <= closed - started <= 0.5 + SLACK_S
        reply = error_frame(sent_back)
        assert reply["code"] == "timeout" and "request_timeout_s=0.5" in reply["error"]
        assert server.statistics().num_request_timeouts == 1


def test_a_client_trickling_a_tls_handshake_is_cut_at_the_handshake_deadline(tmp_path: Path) -> None:
    # Half a TLS ClientHello, one byte every 0.1 s: the handshake has one deadline, as the request does.
    ca = make_throwaway_ca(tmp_path)
    limits = ServerLimits(handshake_timeout_s=0.5, request_timeout_s=LONG, idle_timeout_s=LONG)
    server = StateServer("127.0.0.1", TOKEN, tls=ca.server_context(), limits=limits)
    host, port = server.start().rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
            connected = time.monotonic()
            hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(500)
            closed, _ = trickle_until_closed(sock, hello, 0.1, connected + WAIT_S)
            assert 0.5 - 0.05 <= closed - connected <= 0.5 + SLACK_S
        wait_for(lambda: server.statistics().num_open == 0, "the connection's thread ending")
        assert server.statistics().num_handshake_timeouts == 1
    finally:
        server.stop()


def test_an_idle_authenticated_client_is_closed_quietly_after_the_idle_timeout() -> None:
    limits = ServerLimits(handshake_timeout_s=LONG, request_timeout_s=LONG, idle_timeout_s=0.5)
    with serving(limits) as (server, address), authenticated(address) as sock:
        idle_since = time.monotonic()
        assert read_until_closed(sock, idle_since + WAIT_S) == b""
        assert 0.5 - 0.05 <= time.monotonic() - idle_since <= 0.5 + SLACK_S
        assert server.statistics().num_request_timeouts == 0


def range_request(stop: int) -> bytes:
    return frame({"v": WIRE_VERSION, "token": TOKEN, "op": "range", "step": STEP, "start": 0, "stop": stop})


BIG = build_snapshot(64 * 1024 * 1024, STEP, "donor")
"""Far more than the socket buffers hold, so that a reader that stops holds the sender."""


@pytest.mark.parametrize("reads_every_s", [None, 0.05], ids=["stops_reading", "trickles"])
def test_a_healer_that_stops_or_trickles_reading_a_range_is_cut_after_the_idle_timeout(
    reads_every_s: float | None,
) -> None:
    """The donor sends a range blocking in the kernel (wire.send_bytes), each piece within
    idle_timeout_s in total: a reader taking 64 KiB every 50 ms, under any per-send timeout,
    is cut as one that reads nothing is."""
    limits = ServerLimits(handshake_timeout_s=LONG, request_timeout_s=LONG, idle_timeout_s=0.5)
    with serving(limits, BIG) as (server, address), authenticated(address) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        asked = time.monotonic()
        sock.sendall(range_request(BIG.manifest.total_bytes))
        received = 0
        while server.statistics().num_open:
            assert time.monotonic() < asked + WAIT_S, "the donor went on sending to a stalled healer"
            time.sleep(reads_every_s or 0.01)  # the healer's pace (or none), not a synchronisation
            readable, _, _ = select.select([sock], [], [], 0)
            if reads_every_s is not None and readable:
                received += len(sock.recv(64 * 1024))
        assert 0.5 - 0.05 <= time.monotonic() - asked <= 0.5 + SLACK_S + 0.5  # one piece's bound, then the next
        assert received < BIG.manifest.total_bytes // 4


# -- connections --------------------------------------------------------------------------------


def test_unauthenticated_connections_past_the_cap_are_closed_oldest_first_while_a_heal_succeeds_issue_19() -> None:
    limits = ServerLimits(max_connections=8, max_unauthenticated=3, handshake_timeout_s=LONG, idle_timeout_s=LONG)
    with serving(limits) as (server, address), ExitStack() as stack:
        # Six clients that connect and send nothing, as a slowloris does: past the third, each
        # newcomer closes the oldest, which is told why.
        silent = [stack.enter_context(socket.create_connection(address, timeout=WAIT_S)) for _ in range(6)]
        for sock in silent[:3]:
            reply = error_frame(read_until_closed(sock, time.monotonic() + WAIT_S))
            assert reply["code"] == "busy" and "max_unauthenticated=3" in reply["error"]
        assert server.statistics().num_evicted == 3
        wait_for(lambda: server.statistics().num_open == 3, "the evicted connections' threads ending")

        # The three still held do not keep a healer out: its connections evict them in turn.
        result = fetch_state(
            [Donor("donor", f"{address[0]}:{address[1]}")], STEP, token=TOKEN, timeout_s=WAIT_S, connections=2
        )
        assert_same_state(result.tensors, SNAPSHOT)
        assert server.statistics().num_refused == 0


def test_a_connection_past_the_cap_of_authenticated_ones_is_refused_at_once_with_a_busy_frame_issue_19() -> None:
    limits = ServerLimits(max_connections=3, max_unauthenticated=2, handshake_timeout_s=LONG, idle_timeout_s=LONG)
    with serving(limits) as (server, address), ExitStack() as stack:
        for _ in range(3):
            stack.enter_context(authenticated(address))
        with socket.create_connection(address, timeout=WAIT_S) as sock:
            asked = time.monotonic()
            reply = error_frame(read_until_closed(sock, asked + WAIT_S))
            assert time.monotonic() - asked < SLACK_S  # at once, not after any timeout
        assert reply["code"] == "busy" and "max_connections=3" in reply["error"]
        # The heal client reads it as a refusal naming the limit.
        with pytest.raises(ProtocolError, match=r"manifest from donor refused: .*\(max_connections=3\)"):
            fetch_manifest(Donor("donor", f"{address[0]}:{address[1]}"), STEP, TOKEN, time.monotonic() + WAIT_S)
        assert server.statistics().num_refused == 2


@pytest.mark.parametrize(
    ("num_open", "num_unauthenticated", "action"),
    [
        (0, 0, "accept"),
        (7, 2, "accept"),
        (5, 3, "evict_oldest"),  # the unauthenticated cap
        (8, 1, "evict_oldest"),  # the connection cap, with an unauthenticated one to close
        (8, 0, "refuse"),  # every open connection authenticated
    ],
)
def test_admission_accepts_evicts_the_oldest_unauthenticated_or_refuses(
    num_open: int, num_unauthenticated: int, action: str
) -> None:
    decision = admit(num_open, num_unauthenticated, ServerLimits(max_connections=8, max_unauthenticated=3))
    assert isinstance(decision, Admission) and decision.action == action
    assert (decision.reason == "") == (action == "accept")


def test_limits_that_cannot_hold_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="max_unauthenticated=9 with max_connections=8"):
        ServerLimits(max_connections=8, max_unauthenticated=9)
    with pytest.raises(ValueError, match="handshake_timeout_s=0"):
        ServerLimits(handshake_timeout_s=0)


# -- memory -------------------------------------------------------------------------------------


def test_an_oversized_frame_length_is_refused_from_its_header_without_allocating() -> None:
    # Pins the bound wire.recv_frame already had: refused from the 4 header bytes, with no body
    # sent and nothing the size of the announced frame allocated.
    with serving(ServerLimits()) as (_, address), socket.create_connection(address, timeout=WAIT_S) as sock:
        tracemalloc.start()
        try:
            sock.sendall(struct.pack(">I", 2**32 - 1))
            reply = error_frame(read_until_closed(sock, time.monotonic() + WAIT_S))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert f"state request frame is {2**32 - 1} bytes; the limit is {MAX_FRAME_BYTES}" in reply["error"]
    assert peak < 64 << 20  # the test's own 1 MiB receive buffer included; the frame announced 4 GiB


def test_a_huge_value_in_a_request_is_not_echoed_back_or_logged_in_full_issue_19(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The version check quoted the peer's value: 60 KB in, 60 KB back and into the log, per request.
    with serving(ServerLimits()) as (_, address), socket.create_connection(address, timeout=WAIT_S) as sock:
        sock.sendall(manifest_request(v="x" * 60_000))
        reply = error_frame(read_until_closed(sock, time.monotonic() + WAIT_S))
    assert reply["error"].startswith("StateRequest speaks version 'xxx")
    assert len(reply["error"]) < MAX_ERROR_CHARS + 40
    assert all(len(r.getMessage()) < MAX_ERROR_CHARS + 200 for r in caplog.records)


def test_bad_first_requests_are_counted_and_logged_once_per_interval_not_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serving(ServerLimits()) as (server, address):
        for _ in range(5):
            with socket.create_connection(address, timeout=WAIT_S) as sock:
                sock.sendall(manifest_request(token="guessed"))
                assert (
                    error_frame(read_until_closed(sock, time.monotonic() + WAIT_S))["error"]
                    == "StateRequest: wrong token"
                )
        assert server.statistics().num_rejected == 5
    assert sum("rejected a first request" in r.getMessage() for r in caplog.records) == 1
