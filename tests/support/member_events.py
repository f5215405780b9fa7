"""Reading what tests/support/lighthouse_member.py reports, for the lighthouse's integration tests
(tests/lighthouse/test_lighthouse_server.py, tests/lighthouse/test_replicated_lighthouse.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import ManagedProcess

MEMBER_SCRIPT = str(Path(__file__).with_name("lighthouse_member.py"))
EVENT_TIMEOUT_S = 10.0
"""Deadline for events that normally take milliseconds; generous for a loaded 2-core box."""


def wait_quorum(
    member: ManagedProcess, participants: list[str], *, after: int = 0, timeout_s: float = EVENT_TIMEOUT_S
) -> tuple[float, dict[str, Any]]:
    """Wait until ``member`` reports a quorum with exactly ``participants``; (read_at, line)."""
    line, obj = member.wait_for_json(
        lambda o: o["event"] == "quorum" and o["participants"] == participants,
        timeout_s,
        after=after,
        what=f"a quorum of {participants}",
    )
    return line.read_at, obj


def wait_notice(
    member: ManagedProcess, kind: str, subject: str, *, after: int = 0, timeout_s: float = EVENT_TIMEOUT_S
) -> dict[str, Any]:
    _, obj = member.wait_for_json(
        lambda o: o["event"] == "notice" and o["kind"] == kind and o["subject"] == subject,
        timeout_s,
        after=after,
        what=f"a {kind} notice about {subject}",
    )
    return obj
