"""A restarted lighthouse's first quorum (lighthouse/rules/reconnects.py), with a fake clock.

The members report the last quorum they were in when they register (``Register.last_quorum_id``
and ``last_quorum_members``, kept by lighthouse/client/last_quorum.py). Once every member of the
highest one reported is back and asks, the first quorum forms at once, not a join timeout later:
before, the lighthouse kill cost every group of the demo ~4 s. It never forms before
``max_commit_lease_s``, the longest a lease of the dead lighthouse may still run.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from lighthouse.client.last_quorum import LastQuorum
from lighthouse.config.options import MembershipOptions
from lighthouse.rules.membership import Membership
from lighthouse.rules.reconnects import ReconnectGrace
from lighthouse.wire.protocol import Member, Quorum, QuorumRequest, Register

JOIN_TIMEOUT_S = 2.0
LEASE_S = 0.1
OPTIONS = MembershipOptions(
    min_replicas=1,
    join_timeout_s=JOIN_TIMEOUT_S,
    heartbeat_timeout_s=1.0,
    progress_timeout_s=5.0,
    max_commit_lease_s=LEASE_S,
)


def restarted() -> Membership:
    return Membership(OPTIONS, incarnation=2)


def back(m: Membership, rid: str, now: float, last_id: int, members: Iterable[str], *, step: int = 10) -> int:
    """``rid`` registers with the restarted lighthouse, reporting its last quorum, and asks to join."""
    session, _ = m.register(Register(rid, f"host-{rid}", 1, step, last_id, tuple(members)), now)
    assert m.join(QuorumRequest(rid, step, f"host-{rid}", 1, timeout_s=10.0), now)
    return session


def reason(m: Membership) -> str:
    assert m.last_decision is not None
    return m.last_decision.reason


class TestEveryMemberBack:
    def test_forms_as_soon_as_the_commit_lease_floor_has_passed_not_a_join_timeout_later(self) -> None:
        m = restarted()
        for i, rid in enumerate("abc"):
            back(m, rid, 0.01 * i, 7, "abc")
        assert m.decide(0.05) is None
        assert "every member of the last quorum 7 is back; waiting 0.050s more for a commit lease" in reason(m)
        quorum = m.decide(LEASE_S)
        assert quorum is not None and quorum.replica_ids == ("a", "b", "c") and quorum.quorum_id == 8

    def test_a_lease_longer_than_the_join_timeout_is_waited_out_even_with_everyone_back(self) -> None:
        m = Membership(
            MembershipOptions(
                join_timeout_s=0.05, heartbeat_timeout_s=1.0, progress_timeout_s=5.0, max_commit_lease_s=0.2
            ),
            incarnation=2,
        )
        back(m, "a", 0.0, 7, "a")
        assert m.decide(0.1) is None
        assert m.decide(0.2) is not None

    def test_a_member_back_but_not_asking_yet_is_waited_for(self) -> None:
        m = restarted()
        back(m, "a", 0.0, 7, "abc")
        back(m, "b", 0.0, 7, "abc")
        m.register(Register("c", "host-c", 1, 10, 7, ("a", "b", "c")), 0.0)  # registered, still in its step
        assert m.decide(0.5) is None and "waiting for ['c'] to join" in reason(m)
        assert m.join(QuorumRequest("c", 10, "host-c", 1, timeout_s=10.0), 0.6)
        quorum = m.decide(0.6)
        assert quorum is not None and quorum.replica_ids == ("a", "b", "c")

    def test_a_newcomer_that_is_not_asking_does_not_hold_the_last_quorums_members_back(self) -> None:
        """The last quorum is the previous one of the rules (quorum.py's fast path): a new group
        still building its model joins the next round, as it would with a standing lighthouse."""
        m = restarted()
        back(m, "a", 0.0, 7, "ab")
        back(m, "b", 0.0, 7, "ab")
        m.register(Register("n", "host-n", 1, 0), 0.0)
        quorum = m.decide(LEASE_S)
        assert quorum is not None and quorum.replica_ids == ("a", "b")

    def test_without_a_lease_the_join_that_completes_the_last_quorum_forms_it(self) -> None:
        """The server decides on a join only when ``may_form_now`` says so: before the first
        quorum it counts the reported last quorum's members, as the rules do."""
        m = Membership(
            MembershipOptions(
                join_timeout_s=2.0, heartbeat_timeout_s=1.0, progress_timeout_s=5.0, max_commit_lease_s=0.0
            ),
            incarnation=2,
        )
        m.register(Register("n", "host-n", 1, 0), 0.0)  # a newcomer, not asking
        back(m, "a", 0.0, 7, "ab")
        m.register(Register("b", "host-b", 1, 10, 7, ("a", "b")), 0.01)
        assert not m.may_form_now()
        assert m.join(QuorumRequest("b", 10, "host-b", 1, timeout_s=10.0), 0.01)
        assert m.may_form_now()
        quorum = m.decide(0.01)
        assert quorum is not None and quorum.replica_ids == ("a", "b")


class TestMemberMissing:
    def test_one_missing_is_waited_for_the_join_timeout_then_left_out(self) -> None:
        m = restarted()
        back(m, "a", 0.0, 7, "abc")
        back(m, "b", 0.02, 7, "abc")
        assert m.decide(LEASE_S) is None
        assert m.decide(JOIN_TIMEOUT_S - 0.01) is None
        assert "waiting join_timeout 2s for the members of the last quorum 7" in reason(m)
        assert "missing ['c']" in reason(m)
        quorum = m.decide(JOIN_TIMEOUT_S)
        assert quorum is not None and quorum.replica_ids == ("a", "b")

    def test_the_missing_member_arriving_ends_the_wait(self) -> None:
        m = restarted()
        back(m, "a", 0.0, 7, "ab")
        assert m.decide(0.5) is None
        back(m, "b", 0.8, 7, "ab")
        quorum = m.decide(0.8)
        assert quorum is not None and quorum.replica_ids == ("a", "b")

    @pytest.mark.parametrize(
        "reports",
        [
            pytest.param({"a": (7, ""), "b": (7, "")}, id="no member names the quorum's members"),
            pytest.param({"a": (7, "ab"), "b": (7, "abc")}, id="two lists for one quorum"),
        ],
    )
    def test_members_unknown_or_in_dispute_wait_the_join_timeout_as_before(
        self, reports: dict[str, tuple[int, str]]
    ) -> None:
        m = restarted()
        for rid, (last_id, members) in reports.items():
            back(m, rid, 0.0, last_id, members)
        assert m.decide(JOIN_TIMEOUT_S - 0.01) is None
        assert "its members unknown" in reason(m)
        assert m.decide(JOIN_TIMEOUT_S) is not None


class TestConflictingReports:
    """Members report different last quorums: the highest id is the last quorum. A member that
    reports a lower one was left out of it (ids only grow): it is behind, and heals."""

    def test_the_highest_id_wins_and_a_member_of_an_older_quorum_is_not_waited_for(self) -> None:
        m = restarted()
        back(m, "c", 0.0, 6, "abc", step=8)  # left out of quorum 7 (lost, say), two steps behind
        back(m, "a", 0.01, 7, "ab")
        assert m.decide(0.05) is None
        back(m, "b", 0.02, 7, "ab")
        quorum = m.decide(LEASE_S)
        assert quorum is not None and quorum.quorum_id == 8
        assert quorum.replica_ids == ("a", "b", "c") and max(quorum.steps) == 10  # c heals to step 10

    def test_an_older_report_after_the_newest_changes_nothing(self) -> None:
        m = restarted()
        back(m, "a", 0.0, 7, "ab")
        back(m, "b", 0.0, 7, "ab")
        m.register(Register("c", "host-c", 1, 8, 6, ("a", "b", "c")), 0.05)  # back, not asking
        quorum = m.decide(LEASE_S)
        assert quorum is not None and quorum.replica_ids == ("a", "b")

    def test_a_member_of_the_newest_quorum_still_missing_is_waited_for(self) -> None:
        """a and b were in quorum 6; c and a formed quorum 7 after b was lost. b, back first,
        does not prove anything about quorum 7: its members are waited for."""
        m = restarted()
        back(m, "b", 0.0, 6, "ab")
        back(m, "a", 0.01, 7, "ac")
        assert m.decide(1.0) is None and "missing ['c']" in reason(m)
        back(m, "c", 1.1, 7, "ac")
        quorum = m.decide(1.1)
        assert quorum is not None and quorum.replica_ids == ("a", "b", "c")

    def test_a_member_of_an_older_quorum_ahead_is_still_waited_for_by_the_history_guard(self) -> None:
        m = restarted()
        back(m, "a", 0.0, 7, "ab", step=10)
        back(m, "b", 0.0, 7, "ab", step=10)
        m.register(Register("c", "host-c", 1, 20, 6, ("a", "b", "c")), 0.0)  # ahead, not asking
        assert m.decide(0.5) is None and "waiting for 'c', at step 20" in reason(m)


def test_a_fresh_lighthouse_waits_for_nobody() -> None:
    m = restarted()
    m.register(Register("a", "host-a", 1, 0), 0.0)
    assert m.join(QuorumRequest("a", 0, "host-a", 1, timeout_s=10.0), 0.0)
    assert m.decide(0.0) is not None


def test_a_newer_quorum_whose_members_nobody_names_voids_an_older_list() -> None:
    grace = ReconnectGrace(JOIN_TIMEOUT_S, LEASE_S)
    grace.registered(7, ("a", "b"), 0.0)
    grace.registered(9, (), 0.0)
    assert grace.previous(None) is None  # quorum 9's members unknown: 7's list says nothing about them
    assert grace.holdout(("a", "b"), ("a", "b"), 1.0) is not None
    assert grace.holdout(("a", "b"), ("a", "b"), JOIN_TIMEOUT_S) is None


class TestMemberSide:
    """What a member reports (lighthouse/client/last_quorum.py)."""

    @staticmethod
    def quorum(quorum_id: int, rids: str) -> Quorum:
        return Quorum.of(quorum_id, 1, 0.0, (Member(rid, "", 0, 1) for rid in rids))

    def test_a_member_reports_its_last_quorum_while_it_has_not_registered_since(self) -> None:
        last = LastQuorum()
        assert last.report(0) == (-1, ())
        last.seen(self.quorum(3, "ab"), session_epoch=1)
        assert last.report(1) == (3, ("a", "b"))  # the lighthouse died: the next registration says who

    def test_once_registered_again_it_reports_the_id_alone_until_its_next_quorum(self) -> None:
        """A lighthouse it registered with since may have gone on without it."""
        last = LastQuorum()
        last.seen(self.quorum(3, "ab"), session_epoch=1)
        assert last.report(2) == (3, ())
        last.seen(self.quorum(5, "abc"), session_epoch=2)
        assert last.report(2) == (5, ("a", "b", "c"))
