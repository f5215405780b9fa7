"""What a peer can hold of the lighthouse's gRPC server before it speaks (lighthouse/server/binding.py):
a connection that never finishes its handshake, and connections past the cap. A real
``python -m lighthouse`` process and raw sockets; every wait is for the server closing a
socket, or for a quorum, with a deadline.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import closed_within, start_lighthouse

from lighthouse.client.async_client import AsyncLighthouseClient

pytestmark = pytest.mark.timeout(60)

WAIT_S = 5.0
SLACK_S = 1.0
CAP = 8


def address_of(grpc_address: str) -> tuple[str, int]:
    host, port = grpc_address.rsplit(":", 1)
    return host, int(port)


def joins_alone(grpc_address: str) -> tuple[str, ...]:
    """A real member's quorum of one: the lighthouse still serves after the abuse."""

    async def join() -> tuple[str, ...]:
        client = AsyncLighthouseClient(grpc_address, "member")
        await client.start()
        try:
            await client.wait_registered(WAIT_S)
            return (await client.quorum(0, WAIT_S)).replica_ids
        finally:
            await client.close()

    return asyncio.run(join())


def test_a_connection_that_never_speaks_http2_is_closed_at_the_handshake_timeout() -> None:
    # grpc's default held it two minutes: a few thousand silent sockets took the lighthouse's
    # descriptors while every member waited.
    lighthouse = start_lighthouse("--handshake-timeout", "0.5", status=False)
    with socket.create_connection(address_of(lighthouse.grpc_address)) as sock:
        connected = time.monotonic()
        assert closed_within(sock, WAIT_S)
        assert time.monotonic() - connected < 0.5 + SLACK_S


def test_connections_past_the_cap_are_closed_and_members_join_once_the_flood_is_cut() -> None:
    lighthouse = start_lighthouse("--max-connections", str(CAP), "--handshake-timeout", "1", status=False)
    address = address_of(lighthouse.grpc_address)
    with ExitStack() as stack:
        held = [stack.enter_context(socket.create_connection(address)) for _ in range(CAP)]
        assert not closed_within(held[-1], 0.2)
        with socket.create_connection(address) as one_more:
            assert closed_within(one_more, SLACK_S)
        assert all(closed_within(sock, WAIT_S) for sock in held)  # the handshake timeout frees them
    assert joins_alone(lighthouse.grpc_address) == ("member",)


def test_the_cli_refuses_a_cap_of_zero_naming_it() -> None:
    # The options' own checks are table-tested with every other option in test_options.py.
    cli = subprocess.run(
        [sys.executable, "-m", "lighthouse", "--port", "0", "--max-connections", "0"],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 4,
    )
    assert cli.returncode == 2 and "max_connections=0" in cli.stderr


# Starts the CLI with a soft open-file limit of 512 (as many distributions set 1,024).
LOW_LIMIT_LIGHTHOUSE = (
    "-c",
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
    "sys.argv[0] = 'lighthouse'; runpy.run_module('lighthouse', run_name='__main__')",
)


def test_the_lighthouse_raises_its_open_file_limit_for_a_thousand_members() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 512:
        pytest.skip(f"the hard open-file limit here is {hard}: nothing to raise to")
    lighthouse = start_lighthouse(status=False, python_args=LOW_LIMIT_LIGHTHOUSE)
    limits = Path(f"/proc/{lighthouse.process.popen.pid}/limits").read_text()
    soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
    assert soft == ("unlimited" if hard == resource.RLIM_INFINITY else str(hard))
