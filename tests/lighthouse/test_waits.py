"""The lighthouse's waits: one per replica, superseded, expired, answered in quorum order."""

from __future__ import annotations

from lighthouse.rules.waits import Waits
from lighthouse.server.session import Waiter


def _waiter(replica_id: str, failures: list[tuple[str, str, str]], timeout_s: float = 10.0) -> Waiter:
    return Waiter(
        replica_id,
        timeout_s,
        answer=lambda sent: None,
        fail=lambda code, reason: failures.append((replica_id, code, reason)),
    )


def test_newer_request_supersedes_the_older_wait_of_its_replica() -> None:
    failures: list[tuple[str, str, str]] = []
    waits = Waits()
    first, second = _waiter("a", failures), _waiter("a", failures)
    waits.add(first, now=1.0)
    waits.add(second, now=2.0)
    assert waits.by_replica == {"a": second}
    assert failures == [("a", "aborted", "superseded by a newer quorum request from 'a'")]
    assert not waits.discard(first) and waits.discard(second)


def test_quorum_takes_its_members_waits_in_its_order_and_times_the_round() -> None:
    waits = Waits()
    for rid in ("c", "a", "b"):
        waits.add(_waiter(rid, []), now=1.0)
    taken, took = waits.take(["b", "a"], now=1.5)
    assert [w.replica_id for w in taken] == ["b", "a"] and took == 0.5
    assert waits.round_started == 1.5  # c still waits: the next round began
    assert waits.take(["c"], now=2.0)[1] == 0.5 and waits.round_started is None


def test_expired_waits_are_removed_and_returned() -> None:
    waits = Waits()
    waits.add(_waiter("fast", [], timeout_s=1.0), now=0.0)
    waits.add(_waiter("slow", [], timeout_s=5.0), now=0.0)
    assert [w.replica_id for w in waits.expired(2.0)] == ["fast"]
    assert list(waits.by_replica) == ["slow"]
