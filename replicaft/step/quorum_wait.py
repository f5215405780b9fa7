"""Waiting for a step's quorum on the training thread, without giving up the thread's duties.

The quorum forms on another thread (the group coordinator's loop, or gRPC) and arrives as a
future; the training thread waits for it in short slices, because meanwhile it must keep
recording progress (the lighthouse's progress deadline) and notice what ends the wait early:
SIGTERM, or a heal finished because its donors all left (replicaft/heal/departure.py).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

from replicaft.group.client import QuorumAnswer

POLL_S = 0.02
"""How often a wait for the quorum runs ``still_waiting``."""


def wait_for_answer(
    future: concurrent.futures.Future[QuorumAnswer], timeout_s: float, still_waiting: Callable[[], str | None]
) -> QuorumAnswer | str:
    """The quorum's answer (raising what forming it raised), or why the wait stopped: a reason
    ``still_waiting`` gave (it runs every ``POLL_S``), or no answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return future.result(POLL_S)
        except concurrent.futures.TimeoutError:
            pass
        why = still_waiting()
        if why is not None:
            return why
        if time.monotonic() > deadline:
            return "the group's coordinator did not answer the quorum in time"
