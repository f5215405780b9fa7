"""The line ``python -m lighthouse`` prints once it serves: how whoever started it learns its address.

One format, written here and read here, so a supervisor (``replicaft-launch``, the chaos
runner, the tests) never carries its own copy of the pattern. Started with ``--port 0``, the
lighthouse picks a free port; this line is the only place the port is told.
"""

from __future__ import annotations

import re

GRPC_LINE = re.compile(r"^lighthouse serving gRPC at (\S+)$", re.MULTILINE)
"""Matches the announcement in one line or in a whole output (``re.MULTILINE``); group 1 is host:port."""


def grpc_line(address: str) -> str:
    """The announcement of a lighthouse serving gRPC at ``address`` (host:port)."""
    return f"lighthouse serving gRPC at {address}"


def grpc_address(text: str) -> str | None:
    """The address announced in ``text`` (a line or a whole output), or None if there is none."""
    match = GRPC_LINE.search(text)
    return match.group(1) if match else None
