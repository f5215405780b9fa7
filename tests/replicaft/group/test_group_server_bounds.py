"""What a peer without the group's secret can hold of the group manager's gRPC server
(replicaft/group/server.py, issue 19), over real sockets.

The server needs no lighthouse to accept connections, so its coordinator is built and never
started. Waits are for the server closing a socket, with a deadline.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from conftest import closed_within

from lighthouse.wire.progress import Progress
from replicaft.config.options import ManagerOptions
from replicaft.group.coordinator import GroupCoordinator
from replicaft.group.server import GroupServer, max_connections
from replicaft.process.threads import LoopThread

WAIT_S = 5.0
SLACK_S = 1.0
WORLD_SIZE = 2


@contextmanager
def group_server(handshake_timeout_s: float) -> Iterator[tuple[str, int]]:
    options = ManagerOptions(
        lighthouse="127.0.0.1:1", replica_id="g0", group_world_size=WORLD_SIZE, group_store="127.0.0.1:1"
    )
    loop = LoopThread("test-group-bounds")
    loop.start()
    server = GroupServer(
        GroupCoordinator(options, Progress(), lambda notice: None),
        loop,
        host="127.0.0.1",
        token="secret",
        handshake_timeout_s=handshake_timeout_s,
    )
    try:
        host, port = server.start(WAIT_S).rsplit(":", 1)
        yield host, int(port)
    finally:
        server.stop()
        loop.stop()


def test_a_connection_that_never_speaks_http2_is_closed_at_the_handshake_timeout_issue_19() -> None:
    # grpc's default kept it two minutes; a trickle of nothing holds a descriptor that long.
    with group_server(handshake_timeout_s=0.5) as address, socket.create_connection(address) as sock:
        connected = time.monotonic()
        assert closed_within(sock, WAIT_S)
        assert time.monotonic() - connected < 0.5 + SLACK_S


def test_connections_past_the_cap_are_closed_as_they_are_accepted_issue_19() -> None:
    with group_server(handshake_timeout_s=30.0) as address, ExitStack() as stack:
        held = [stack.enter_context(socket.create_connection(address)) for _ in range(max_connections(WORLD_SIZE))]
        assert not closed_within(held[-1], 0.2)
        with socket.create_connection(address) as one_more:
            assert closed_within(one_more, SLACK_S)
