"""What a group's heartbeats report: its step and a count of calls (lighthouse/client/async_client.py sends them)."""

from __future__ import annotations


class Progress:
    """A group's training progress, as its heartbeats report it: the step and a count of calls.

    Shared on purpose between the training thread, which records (``record``), and the
    session's heartbeats on the client's loop, which read: each is one attribute store or load,
    atomic under the GIL, and a lost increment when both record at once still changes the
    count, which is all the lighthouse needs to see a group progressing.
    """

    __slots__ = ("step", "count", "healing")

    def __init__(self) -> None:
        self.step = 0
        self.count = 0
        self.healing = False
        """The group is healing: its next heartbeat says so at once (liveness.py)."""

    def record(self, step: int) -> None:
        self.step = step
        self.count += 1
