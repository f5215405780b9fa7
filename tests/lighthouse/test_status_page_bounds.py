"""What a client can hold of the lighthouse's status page (lighthouse/server/status.py, issue 19).

A real StatusServer on its own event loop thread, driven over real sockets, with its limits
shortened: at the cap a new connection evicts the oldest one still reading its request, one
past the cap of connections being answered is answered 503 at once, and a client that asks and
never reads its reply is cut after the write timeout. Waits have deadlines; nothing sleeps
to synchronise.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from support.socket_waits import WAIT_S, read_until_closed, wait_for

from lighthouse.server.status import StatusServer
from replicaft.process.threads import LoopThread

SLACK_S = 1.0


def metrics() -> str:
    return "metric 1\n"


@contextmanager
def status_page(server: StatusServer) -> Iterator[tuple[StatusServer, tuple[str, int]]]:
    """``server`` serving on a loop thread of its own, and its address; stopped on exit."""
    loop = LoopThread("test-status-page")
    loop.start()
    try:
        url = loop.call(server.start("127.0.0.1", 0), WAIT_S)
        host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        yield server, (host, int(port))
    finally:
        loop.call(server.stop(), WAIT_S)
        loop.stop()


def test_at_the_cap_a_new_connection_takes_the_place_of_the_oldest_one_still_reading_issue_37() -> None:
    """A slowloris: connections that send part of a request, or nothing, hold every slot. A
    scraper arriving then was answered 503 while they lasted; now the oldest is closed for it."""
    with (
        status_page(StatusServer(dict, metrics, max_connections=3, read_timeout_s=30.0)) as (server, address),
        ExitStack() as stack,
    ):
        trickling: list[socket.socket] = []

        def hold_every_slot() -> None:
            while len(trickling) - server.num_evicted < 3:
                sock = stack.enter_context(socket.create_connection(address, timeout=WAIT_S))
                sock.sendall(b"GET /metr")  # never finished
                trickling.append(sock)
                wait_for(lambda: server.num_connections == len(trickling) - server.num_evicted, "a slow connection")

        for n in range(1, 3):  # two scrapers in turn: each evicts the oldest slow connection left
            hold_every_slot()
            with socket.create_connection(address, timeout=WAIT_S) as scraper:
                scraper.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                reply = read_until_closed(scraper, time.monotonic() + WAIT_S)
            assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"metric 1\n"), reply[:80]
            assert read_until_closed(trickling[n - 1], time.monotonic() + WAIT_S) == b""  # closed, unanswered
            assert server.num_evicted == n and server.num_refused == 0
        assert server.num_connections == 2  # the slow ones not evicted
        for sock in trickling:
            sock.close()
        wait_for(lambda: server.num_connections == 0, "the slow connections' handlers ending")


def test_a_connection_past_the_cap_of_connections_being_answered_is_answered_503_at_once_issue_19() -> None:
    """Every connection is being answered (its client does not read the reply): nobody is still
    reading a request, so the newcomer is told 503 at once, and served again afterwards."""
    big = "m " * (16 << 20)  # 32 MB: more than loopback's socket buffers hold
    with (
        status_page(StatusServer(dict, lambda: big, max_connections=2, write_timeout_s=30.0)) as (server, address),
        ExitStack() as stack,
    ):
        stalled = []
        for k in range(2):
            sock = stack.enter_context(socket.create_connection(address, timeout=WAIT_S))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            stalled.append(sock)
            wait_for(lambda k=k: server.num_connections == k + 1, f"stalled reply {k} being sent")
        with socket.create_connection(address, timeout=WAIT_S) as third:
            asked = time.monotonic()
            reply = read_until_closed(third, asked + WAIT_S)
            assert time.monotonic() - asked < SLACK_S  # at once, not after a timeout
        assert reply.startswith(b"HTTP/1.0 503 Service Unavailable") and server.num_refused == 1
        for sock in stalled:
            sock.close()
        wait_for(lambda: server.num_connections == 0, "the stalled replies being given up")


def test_a_client_that_asks_and_never_reads_is_cut_after_the_write_timeout_issue_19() -> None:
    big = "m " * (16 << 20)  # 32 MB: more than loopback's socket buffers hold
    with (
        status_page(StatusServer(dict, lambda: big, write_timeout_s=0.3)) as (server, address),
        socket.create_connection(address, timeout=WAIT_S) as sock,
    ):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        wait_for(lambda: server.num_connections == 1, "the request being served")
        asked = time.monotonic()
        wait_for(lambda: server.num_connections == 0, "the stalled reply being given up")
        assert time.monotonic() - asked < 0.3 + SLACK_S
        assert len(read_until_closed(sock, time.monotonic() + WAIT_S)) < len(big)
