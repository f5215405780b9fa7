"""What a client can hold of the lighthouse's status page (lighthouse/server/status.py, issue 19).

A real StatusServer on its own event loop thread, driven over real sockets, with its limits
shortened: connections past the cap are answered 503 at once, and a client that asks and
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


def test_a_connection_past_the_cap_is_answered_503_at_once_and_the_page_serves_again_after_issue_19() -> None:
    with (
        status_page(StatusServer(dict, metrics, max_connections=2, read_timeout_s=30.0)) as (server, address),
        ExitStack() as stack,
    ):
        silent = [stack.enter_context(socket.create_connection(address, timeout=WAIT_S)) for _ in range(2)]
        wait_for(lambda: server.num_connections == 2, "both silent connections being served")
        with socket.create_connection(address, timeout=WAIT_S) as third:
            asked = time.monotonic()
            reply = read_until_closed(third, asked + WAIT_S)
            assert time.monotonic() - asked < SLACK_S  # at once, not after the read timeout
        assert reply.startswith(b"HTTP/1.0 503 Service Unavailable") and server.num_refused == 1
        for sock in silent:
            sock.close()
        wait_for(lambda: server.num_connections == 0, "the silent connections' handlers ending")
        with socket.create_connection(address, timeout=WAIT_S) as sock:
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert read_until_closed(sock, time.monotonic() + WAIT_S).endswith(b"metric 1\n")


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
