"""The members waiting for a quorum, one wait each, and when the current round began.

The server's rounds (lighthouse/server/rounds.py) add a wait when a member asks, hand the
waits of a formed quorum their answer, and fail the rest: superseded by a newer request, past their deadline, their
member lost, the lighthouse no longer leading. Event-loop only, like all the server's state.
"""

from __future__ import annotations

from collections.abc import Iterable

from lighthouse.server.session import Waiter


class Waits:
    def __init__(self) -> None:
        self.by_replica: dict[str, Waiter] = {}
        self.round_started: float | None = None
        """When the first wait of the round now forming arrived (the quorum latency metric)."""

    def add(self, waiter: Waiter, now: float) -> None:
        """``waiter`` becomes its replica's one wait, until its timeout; a previous one fails."""
        previous = self.by_replica.pop(waiter.replica_id, None)
        if previous is not None:
            previous.fail("aborted", f"superseded by a newer quorum request from {waiter.replica_id!r}")
        waiter.deadline = now + waiter.timeout_s
        self.by_replica[waiter.replica_id] = waiter
        if self.round_started is None:
            self.round_started = now

    def discard(self, waiter: Waiter) -> bool:
        """Forget ``waiter`` if it is still its replica's wait (its caller went away); True if it was."""
        if self.by_replica.get(waiter.replica_id) is not waiter:
            return False
        del self.by_replica[waiter.replica_id]
        return True

    def take(self, replica_ids: Iterable[str], now: float) -> tuple[list[Waiter], float | None]:
        """The waits a quorum of ``replica_ids`` answers, and how long its round took; the next
        round starts now if others still wait."""
        ids = list(replica_ids)
        took = None if self.round_started is None else now - self.round_started
        self.round_started = now if self.by_replica.keys() - set(ids) else None
        return [w for rid in ids if (w := self.by_replica.pop(rid, None)) is not None], took

    def expired(self, now: float) -> list[Waiter]:
        """Remove and return the waits past their deadline (the caller fails them)."""
        gone = [w for w in self.by_replica.values() if w.deadline <= now]
        for w in gone:
            del self.by_replica[w.replica_id]
        return gone

    def fail(self, replica_id: str, reason: str) -> None:
        waiter = self.by_replica.pop(replica_id, None)
        if waiter is not None:
            waiter.fail("aborted", reason)

    def fail_all(self, reason: str) -> None:
        for waiter in list(self.by_replica.values()):
            waiter.fail("aborted", reason)
        self.by_replica.clear()
        self.round_started = None
