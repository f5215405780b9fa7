"""Waits for what a server does to a socket, each with a deadline (the bounds tests' helpers:
test_state_server_bounds.py, test_status_page_bounds.py, test_group_server_bounds.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

WAIT_S = 5.0
"""The most any wait takes before the test fails: every bound tested is seconds at most."""


def read_until_closed(sock: socket.socket, deadline: float) -> bytes:
    """Everything the server sends until it closes the connection; fails at ``deadline``."""
    out = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the server did not close the connection within the deadline (got {bytes(out)[:80]!r})"
        sock.settimeout(remaining)
        try:
            piece = sock.recv(1 << 20)
        except ConnectionResetError:
            return bytes(out)
        if not piece:
            return bytes(out)
        out += piece


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S}s"
        time.sleep(0.01)
