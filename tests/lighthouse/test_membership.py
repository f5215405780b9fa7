"""The lighthouse's membership state machine (lighthouse/rules/membership.py) with a fake clock.

Time is an argument of every call, so each test writes down the instants it cares about.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lighthouse.config.options import MembershipOptions
from lighthouse.errors import DuplicateReplica, OptionsError, QuorumTooLarge
from lighthouse.rules.membership import QUORUM_BUDGET_BYTES, Membership
from lighthouse.rules.quorum import decide_quorum
from lighthouse.wire.envelope import MAX_DATA_BYTES, MAX_MESSAGE_BYTES, encode
from lighthouse.wire.fence import FenceRequest
from lighthouse.wire.protocol import Heartbeat, QuorumRequest, Register

OPTIONS = MembershipOptions(min_replicas=1, join_timeout_s=2.0, heartbeat_timeout_s=1.0, progress_timeout_s=5.0)


def new_membership(options: MembershipOptions = OPTIONS) -> Membership:
    return Membership(options, incarnation=7)


def register(
    m: Membership, rid: str, now: float = 0.0, *, step: int = 0, last_quorum_id: int = -1, interval_s: float = 0.1
) -> int:
    session, lost = m.register(
        Register(rid, f"host-{rid}", 1, step, last_quorum_id, heartbeat_interval_s=interval_s), now
    )
    assert lost == []
    return session


def request(
    rid: str,
    step: int = 0,
    *,
    address: str | None = None,
    world_size: int = 1,
    commit_failures: int = 0,
    data: dict[str, Any] | None = None,
    lease_s: float = 0.0,
) -> QuorumRequest:
    return QuorumRequest(
        rid,
        step,
        f"host-{rid}" if address is None else address,
        world_size,
        timeout_s=10.0,
        commit_failures=commit_failures,
        data=data or {},
        commit_lease_s=lease_s,
    )


def form(m: Membership, rids: str, now: float, *, step: int = 0) -> int:
    """Every replica in ``rids`` joins at ``now``; returns the id of the quorum that forms."""
    for rid in rids:
        assert m.join(request(rid, step), now)
    quorum = m.decide(now, now_unix_s=1000.0)
    assert quorum is not None, m.last_decision
    assert quorum.replica_ids == tuple(sorted(rids))
    return quorum.quorum_id


class TestOptions:
    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"min_replicas": 0}, "min_replicas=0 is outside [1, 65536]"),
            ({"join_timeout_s": 0.0}, "join_timeout_s=0.0 is outside [0.001, 86400]"),
            ({"heartbeat_timeout_s": -1.0}, "heartbeat_timeout_s=-1.0 is outside [0.001, 86400]"),
            (
                {"heartbeat_timeout_s": 5.0, "progress_timeout_s": 5.0},
                "progress_timeout_s=5.0 is not above heartbeat_timeout_s=5.0",
            ),
        ],
    )
    def test_invalid_options_rejected_naming_the_value(self, fields: dict[str, Any], message: str) -> None:
        with pytest.raises(OptionsError, match="^" + re.escape(message)):
            MembershipOptions(**fields)


class TestIdentity:
    """Issue 19: two processes with one replica id fenced each other ~15 times a second."""

    def test_second_process_with_a_live_replica_id_refused_and_first_kept(self) -> None:
        m = new_membership()
        first, _ = m.register(Register("g0", "host-1", 1, 0, instance="aaaa", heartbeat_interval_s=0.1), 0.0)
        m.heartbeat("g0", first, Heartbeat(step=3, progress=9), 0.4)
        with pytest.raises(DuplicateReplica) as raised:
            m.register(Register("g0", "host-2", 1, 0, instance="bbbb"), 0.5, peer="ipv4:127.0.0.1:5555")
        message = str(raised.value)
        assert "replica id 'g0' is already held by a live session (client instance 'aaaa', at 'host-1'" in message
        assert "instance 'bbbb', from ipv4:127.0.0.1:5555" in message
        assert "give each replica group its own REPLICAFT_REPLICA_ID" in message
        assert m.is_session_live("g0", first) and m.members["g0"].address == "host-1"

    def test_reconnect_of_the_same_instance_supersedes_its_old_session(self) -> None:
        m = new_membership()
        first, _ = m.register(Register("g0", "h", 1, 0, instance="aaaa", heartbeat_interval_s=0.1), 0.0)
        second, lost = m.register(Register("g0", "h", 1, 0, instance="aaaa", heartbeat_interval_s=0.1), 0.1)
        assert [x.session for x in lost] == [first] and m.is_session_live("g0", second)

    def test_restart_after_the_old_process_fell_silent_supersedes_it(self) -> None:
        m = new_membership(MembershipOptions(heartbeat_timeout_s=2.0, progress_timeout_s=10.0))
        first, _ = m.register(Register("g0", "h", 1, 0, instance="aaaa", heartbeat_interval_s=0.1), 0.0)
        for i in range(1, 11):
            m.heartbeat("g0", first, Heartbeat(step=1, progress=i), i * 0.1)
        second, lost = m.register(Register("g0", "h", 1, 0, instance="cccc"), 1.0 + 0.31)  # host gone: silent
        assert [x.session for x in lost] == [first] and m.is_session_live("g0", second)


class TestQuorumBudget:
    def test_members_data_never_makes_a_quorum_too_large_to_send_issue_19(self) -> None:
        """Bug 5: 300 members each within the 16 KiB data limit made a 4.5 MB quorum, over the
        4 MiB message limit. Joins past the budget are refused; every quorum formed fits."""
        m = new_membership()
        data = {"ranks": "x" * (MAX_DATA_BYTES - 64)}
        refused = []
        for i in range(300):
            rid = f"g{i:03d}"
            register(m, rid)
            try:
                m.join(request(rid, data=data), 0.0)
            except QuorumTooLarge as e:
                refused.append((rid, str(e)))
        assert len(refused) == 300 - 252, len(refused)
        rid, message = refused[0]
        assert rid == "g252"
        assert f"over the {QUORUM_BUDGET_BYTES}-byte budget that one gRPC message allows" in message
        assert "send less data per member" in message
        for rid, _ in refused:
            m.close_session(rid, m.members[rid].session, "gave up")
        quorum = m.decide(0.0)
        assert quorum is not None and len(quorum.replica_ids) == 252
        assert len(encode(quorum)) <= MAX_MESSAGE_BYTES

    def test_budget_freed_by_a_member_that_leaves(self) -> None:
        m = new_membership()
        data = {"ranks": "x" * (MAX_DATA_BYTES - 64)}
        for i in range(252):
            register(m, f"g{i:03d}")
            m.join(request(f"g{i:03d}", data=data), 0.0)
        register(m, "late")
        with pytest.raises(QuorumTooLarge):
            m.join(request("late", data=data), 0.0)
        m.close_session("g000", m.members["g000"].session, "gone")
        assert m.join(request("late", data=data), 0.0)


class TestLoss:
    def test_closed_session_lost_at_once(self) -> None:
        m = new_membership()
        session = register(m, "a")
        register(m, "b")
        quorum_id = form(m, "ab", 0.0)
        lost = m.close_session("a", session, "session stream closed")
        assert [(x.replica_id, x.session, x.quorum_id, x.reason) for x in lost] == [
            ("a", session, quorum_id, "session stream closed")
        ]
        assert set(m.members) == {"b"}

    def test_closing_a_superseded_session_changes_nothing(self) -> None:
        m = new_membership()
        old = register(m, "a")
        new, lost = m.register(Register("a", "", 1, 0), 0.0)
        assert [x.session for x in lost] == [old]
        assert m.close_session("a", old, "late close") == []
        assert m.is_session_live("a", new) and not m.is_session_live("a", old)

    def test_closed_session_withdraws_its_join(self) -> None:
        m = new_membership()
        session = register(m, "a")
        m.join(request("a"), 0.0)
        m.close_session("a", session, "gone")
        assert m.waiting_ids() == []
        assert m.decide(0.0) is None

    def test_silent_member_lost_after_heartbeat_timeout(self) -> None:
        m = new_membership()
        register(m, "a", now=10.0)
        assert m.expire(11.0) == []  # exactly the timeout: not yet
        lost = m.expire(11.01)
        assert [x.replica_id for x in lost] == ["a"]
        assert (
            "silent for 1.01s, beyond its limit of 1.00s (heartbeat_timeout_s=1, 0 of 8 gaps observed)"
            in lost[0].reason
        )
        assert m.members == {}

    def test_heartbeats_keep_member_alive(self) -> None:
        m = new_membership()
        session = register(m, "a", interval_s=0.5)
        for i in range(1, 40):
            now = i * 0.5
            assert m.heartbeat("a", session, Heartbeat(step=i, progress=i), now)
            assert m.expire(now + 0.9) == []

    def test_sigstopped_member_lost_after_three_times_its_cadence_not_the_heartbeat_timeout(self) -> None:
        m = new_membership(MembershipOptions(heartbeat_timeout_s=2.0, progress_timeout_s=10.0))
        session = register(m, "a")
        for i in range(1, 21):  # 0.1 s heartbeats, then SIGSTOP: nothing more
            assert m.heartbeat("a", session, Heartbeat(step=i, progress=i), i * 0.1)
        assert m.expire(2.0 + 0.29) == []
        lost = m.expire(2.0 + 0.31)
        assert [x.replica_id for x in lost] == ["a"]
        assert (
            "silent for 0.31s, beyond its limit of 0.30s (its longest gap 0.100s + 2 heartbeat intervals of 0.1s)"
            in lost[0].reason
        )

    def test_a_declared_healer_is_held_to_the_heartbeat_timeout_until_it_says_the_heal_is_over(self) -> None:
        """Loading gigabytes of healed state stalled a healer 0.40 s, past its 0.39 s adaptive
        limit: fenced, it healed again and was fenced again, every time (README, train_ddp.py)."""
        m = new_membership(MembershipOptions(heartbeat_timeout_s=2.0, progress_timeout_s=10.0))
        session = register(m, "a")
        for i in range(1, 21):
            assert m.heartbeat("a", session, Heartbeat(step=3, progress=i), i * 0.1)
        assert m.heartbeat("a", session, Heartbeat(step=3, progress=21, healing=True), 2.1)
        assert m.expire(2.1 + 1.5) == []  # stalled 1.5 s loading the state: still a member
        assert m.heartbeat("a", session, Heartbeat(step=4, progress=22), 3.6)
        lost = m.expire(3.6 + 1.71)  # the heal is over: its adaptive limit again
        assert "beyond its limit of 1.70s (its longest gap 1.500s" in lost[0].reason
        session = register(m, "a", now=6.0)
        assert m.heartbeat("a", session, Heartbeat(step=4, progress=23, healing=True), 6.0)
        lost = m.expire(6.0 + 2.01)  # a healer that really hangs: the ceiling still holds
        assert "beyond its limit of 2.00s (heartbeat_timeout_s=2, while it heals" in lost[0].reason

    def test_silence_limit_checked_on_a_tick_follows_the_next_gap_issue_24(self) -> None:
        """Each member's limit is kept between ticks (issue 24: recomputing it for 1,024 members
        took ~1.4 ms of every 20 ms tick); a later, longer gap must still raise it."""
        m = new_membership(MembershipOptions(heartbeat_timeout_s=2.0, progress_timeout_s=10.0))
        session = register(m, "a")
        for i in range(1, 21):
            assert m.heartbeat("a", session, Heartbeat(step=i, progress=i), i * 0.1)
        assert m.expire(2.0 + 0.28) == []  # limit 0.30 s (0.1 s gaps), now remembered
        assert m.heartbeat("a", session, Heartbeat(step=21, progress=21), 2.0 + 0.28)
        assert m.expire(2.28 + 0.45) == []  # limit 0.28 + 2 x 0.1 = 0.48 s, not the 0.30 s remembered
        lost = m.expire(2.28 + 0.49)
        assert "beyond its limit of 0.48s (its longest gap 0.280s" in lost[0].reason

    def test_slow_but_alive_member_never_dropped(self) -> None:
        """Steps of 5 s: quorum requests are rare, but the client's heartbeats fill the gaps."""
        m = new_membership(MembershipOptions(heartbeat_timeout_s=2.0, progress_timeout_s=10.0))
        session = register(m, "a")
        now = 0.0
        for step in range(12):
            m.join(request("a", step), now)
            assert m.decide(now) is not None
            for _ in range(50):
                now = round(now + 0.1, 6)
                assert m.heartbeat("a", session, Heartbeat(step=step, progress=step), now)
                assert m.expire(now + 0.09) == []
            m.members["a"].step = step + 1
        assert "a" in m.members

    def test_member_that_heartbeats_without_progress_lost_after_progress_timeout(self) -> None:
        m = new_membership()
        session = register(m, "a")
        for i in range(1, 11):  # heartbeats every 0.5 s, always at step 3, progress 4
            assert m.heartbeat("a", session, Heartbeat(step=3, progress=4), i * 0.5)
        assert m.expire(5.0) == []  # progressed at t=0.5, so 4.5 s stuck
        m.heartbeat("a", session, Heartbeat(step=3, progress=4), 5.5)
        lost = m.expire(5.51)
        assert [x.replica_id for x in lost] == ["a"]
        assert "alive but no progress for 5.01s at step 3 (progress_timeout_s=5)" in lost[0].reason

    def test_waiting_member_not_dropped_for_lack_of_progress(self) -> None:
        m = new_membership()
        session = register(m, "a")
        register(m, "b")
        form(m, "ab", 0.0)
        m.join(request("a"), 1.0)  # a waits for b, which is slow but progressing
        for i in range(2, 60):
            m.heartbeat("a", session, Heartbeat(step=0, progress=0), float(i))
            m.heartbeat("b", m.members["b"].session, Heartbeat(step=0, progress=i), float(i))
            assert m.expire(float(i)) == []
        assert m.waiting_ids() == ["a"]

    def test_waiting_member_that_stops_heartbeating_is_dropped(self) -> None:
        m = new_membership()
        register(m, "a")
        m.join(request("a"), 0.0)
        lost = m.expire(1.5)
        assert [x.replica_id for x in lost] == ["a"]
        assert m.waiting_ids() == []

    def test_member_that_waited_long_not_dropped_right_after_quorum_forms(self) -> None:
        """Waiting for min_replicas for longer than progress_timeout_s is not being hung."""
        m = new_membership(MembershipOptions(min_replicas=2, heartbeat_timeout_s=1.0, progress_timeout_s=5.0))
        a = register(m, "a")
        m.join(request("a"), 0.0)
        for i in range(1, 20):
            m.heartbeat("a", a, Heartbeat(step=0, progress=1), i * 0.5)
        register(m, "b", now=9.5)
        m.join(request("b"), 9.5)
        quorum = m.decide(9.5)
        assert quorum is not None
        # The training step takes a moment before the next heartbeat shows progress ...
        b = m.members["b"].session
        for i in range(20, 30):
            m.heartbeat("a", a, Heartbeat(step=0, progress=1), i * 0.5)
            m.heartbeat("b", b, Heartbeat(step=0, progress=0), i * 0.5)
            assert m.expire(i * 0.5) == []
        # ... but a step that never ends is still caught, counting from the quorum.
        m.heartbeat("a", a, Heartbeat(step=0, progress=1), 15.0)
        m.heartbeat("b", b, Heartbeat(step=0, progress=0), 15.0)
        lost = m.expire(15.0)
        assert sorted(x.replica_id for x in lost) == ["a", "b"]
        assert all("no progress for 5.50s" in x.reason for x in lost), lost

    def test_member_whose_wait_timed_out_gets_a_fresh_progress_deadline(self) -> None:
        m = new_membership(MembershipOptions(min_replicas=2, heartbeat_timeout_s=1.0, progress_timeout_s=5.0))
        a = register(m, "a")
        m.join(request("a"), 0.0)
        for i in range(1, 21):
            m.heartbeat("a", a, Heartbeat(step=0, progress=1), i * 0.5)
        m.leave("a", 10.0)  # the long poll's deadline passed; the client will ask again
        m.heartbeat("a", a, Heartbeat(step=0, progress=1), 10.5)
        assert m.expire(10.5) == []
        assert m.waiting_ids() == []

    def test_new_session_supersedes_old_one(self) -> None:
        m = new_membership()
        old = register(m, "a", now=0.0, step=5)
        quorum_id = form(m, "a", 0.0, step=5)
        m.join(request("a", step=6), 1.0)
        new, lost = m.register(Register("a", "restarted", 1, 0), 2.0)
        assert new != old
        assert [(x.replica_id, x.session, x.quorum_id) for x in lost] == [("a", old, quorum_id)]
        assert "new session registered under the same replica id" in lost[0].reason
        assert m.waiting_ids() == [], "the old session's join must not count for the new one"
        assert not m.heartbeat("a", old, Heartbeat(6, 1), 2.1), "old session's heartbeats are refused"
        assert m.heartbeat("a", new, Heartbeat(0, 1), 2.1)
        assert m.members["a"].address == "restarted" and m.members["a"].quorum_id == -1


class TestJoinAndDecide:
    def test_join_without_session_refused(self) -> None:
        m = new_membership()
        assert not m.join(request("ghost"), 0.0)
        assert m.waiting_ids() == []

    def test_quorum_carries_requests_and_is_recorded(self) -> None:
        m = new_membership()
        register(m, "b")
        register(m, "a")
        m.join(request("b", step=4, data={"store": "b:1"}, address="b-host", world_size=2), 0.0)
        m.join(request("a", step=3), 0.0)
        quorum = m.decide(0.0, now_unix_s=1234.5)
        assert quorum is not None
        assert quorum.incarnation == 7 and quorum.created_unix_s == 1234.5
        assert quorum.replica_ids == ("a", "b")
        b = quorum.member("b")
        assert b is not None and (b.step, b.address, b.world_size, b.data) == (4, "b-host", 2, {"store": "b:1"})
        assert m.current is quorum and m.waiting_ids() == []
        assert [(r.quorum_id, r.participants, r.path) for r in m.history] == [(quorum.quorum_id, ("a", "b"), "slow")]
        assert m.members["a"].step == 3

    def test_unchanged_membership_keeps_quorum_id(self) -> None:
        m = new_membership()
        register(m, "a")
        register(m, "b")
        assert form(m, "ab", 0.0) == form(m, "ab", 1.0) == form(m, "ab", 2.0)

    def test_membership_change_issues_new_quorum_id(self) -> None:
        m = new_membership()
        register(m, "a")
        first = form(m, "a", 0.0)
        register(m, "b")
        second = form(m, "ab", 1.0)
        assert second > first

    def test_rejoin_under_new_session_issues_new_quorum_id(self) -> None:
        m = new_membership()
        register(m, "a")
        first = form(m, "a", 0.0)
        m.register(Register("a", "", 1, 0), 1.0)
        assert form(m, "a", 1.0) > first

    def test_commit_failure_issues_new_quorum_id(self) -> None:
        """A failed commit means the process groups may be broken: rebuild them."""
        m = new_membership()
        register(m, "a")
        register(m, "b")
        first = form(m, "ab", 0.0)
        m.join(request("a", commit_failures=1), 1.0)
        m.join(request("b"), 1.0)
        quorum = m.decide(1.0)
        assert quorum is not None and quorum.quorum_id > first

    def test_registration_raises_next_quorum_id_above_last_seen(self) -> None:
        m = new_membership()
        register(m, "a", last_quorum_id=41)
        register(m, "b", last_quorum_id=3)
        # Members reporting earlier ids mean a restart: the first quorum waits join_timeout.
        assert form(m, "ab", OPTIONS.join_timeout_s) == 42

    def test_view_lists_healthy_waiting_and_previous(self) -> None:
        m = new_membership()
        register(m, "a")
        register(m, "b")
        form(m, "ab", 0.0)
        register(m, "c")
        m.join(request("c"), 3.0)
        v = m.view()
        assert v.healthy == {"a", "b", "c"} and set(v.waiting) == {"c"} and v.previous == ("a", "b")
        assert v.waiting["c"].since == 3.0


class TestFence:
    def setup_method(self) -> None:
        self.m = new_membership()
        self.sessions = {rid: register(self.m, rid) for rid in "ab"}
        self.quorum_id = form(self.m, "ab", 0.0)

    def test_member_of_current_quorum_may_commit(self) -> None:
        verdict = self.m.fence(FenceRequest("a", self.quorum_id, 0))
        assert verdict.ok and verdict.reason == ""

    def test_lost_member_fenced(self) -> None:
        self.m.close_session("a", self.sessions["a"], "gone")
        verdict = self.m.fence(FenceRequest("a", self.quorum_id, 0))
        assert not verdict.ok
        assert verdict.reason == "replica 'a' has no live session (declared lost)"

    def test_replaced_quorum_fenced(self) -> None:
        self.m.close_session("b", self.sessions["b"], "gone")
        newer = form(self.m, "a", 1.0)
        verdict = self.m.fence(FenceRequest("a", self.quorum_id, 0))
        assert not verdict.ok
        assert verdict.reason == f"quorum {self.quorum_id} is not current (current: {newer})"

    def test_restarted_member_fenced_for_quorum_of_its_old_session(self) -> None:
        self.m.register(Register("a", "", 1, 0), 1.0)
        verdict = self.m.fence(FenceRequest("a", self.quorum_id, 0))
        assert not verdict.ok
        assert verdict.reason == f"replica 'a' is not a member of quorum {self.quorum_id}"

    def test_member_outside_current_quorum_fenced(self) -> None:
        register(self.m, "c")
        verdict = self.m.fence(FenceRequest("c", self.quorum_id, 0))
        assert not verdict.ok
        assert verdict.reason == f"replica 'c' is not a member of quorum {self.quorum_id}"

    def test_no_quorum_yet_fenced(self) -> None:
        m = new_membership()
        register(m, "a")
        verdict = m.fence(FenceRequest("a", 1, 0))
        assert not verdict.ok and verdict.reason == "quorum 1 is not current (current: None)"


class TestCommitLease:
    """commit_lease.py: no quorum forms without a member whose commit lease still runs."""

    def setup_method(self) -> None:
        self.m = new_membership(
            MembershipOptions(
                join_timeout_s=2.0, heartbeat_timeout_s=1.0, progress_timeout_s=5.0, max_commit_lease_s=0.1
            )
        )
        self.sessions = {rid: register(self.m, rid) for rid in "ab"}
        for rid, lease_s in (("a", 0.04), ("b", 0.5)):  # b asks for more than the lighthouse grants
            assert self.m.join(request(rid, lease_s=lease_s), 1.0)
        quorum = self.m.decide(1.0)
        assert quorum is not None and quorum.max_commit_lease_s == 0.1
        self.quorum_id = quorum.quorum_id

    def test_a_lost_members_lease_holds_the_survivors_next_quorum_until_it_runs_out(self) -> None:
        self.m.close_session("b", self.sessions["b"], "SIGKILL")  # b may still be committing: its lease runs
        assert self.m.join(request("a", 1), 1.05)
        assert self.m.decide(1.05) is None
        assert self.m.last_decision is not None
        assert self.m.last_decision.reason.startswith("waiting 0.050s for the commit lease of 'b' to run out")
        assert self.m.decide(1.0999) is None
        assert self.m.decide(1.1) is not None  # granted 0.1 s, not the 0.5 it asked for

    def test_a_restarted_members_old_session_holds_too(self) -> None:
        new, _ = self.m.register(Register("b", "host-b", 1, 0), 1.01)
        for rid in "ab":
            assert self.m.join(request(rid, 1), 1.02)
        assert self.m.decide(1.02) is None  # the old process of b may still commit under its lease
        quorum = self.m.decide(1.1)
        assert quorum is not None and quorum.quorum_id != self.quorum_id

    def test_members_that_ask_again_have_ended_their_step_and_form_at_once(self) -> None:
        for rid in "ab":
            assert self.m.join(request(rid, 1), 1.01)
        quorum = self.m.decide(1.01)
        assert quorum is not None and quorum.quorum_id == self.quorum_id

    def test_a_member_that_asked_for_none_holds_nothing(self) -> None:
        assert self.m.join(request("a", 1), 1.01) and self.m.join(request("b", 1, lease_s=0.0), 1.01)
        assert self.m.decide(1.01) is not None
        self.m.close_session("b", self.sessions["b"], "SIGKILL")
        assert self.m.join(request("a", 2), 1.02)
        assert self.m.decide(1.02) is not None

    def test_a_lighthouse_that_grants_none_says_so_with_the_quorum(self) -> None:
        m = new_membership(
            MembershipOptions(
                join_timeout_s=2.0, heartbeat_timeout_s=1.0, progress_timeout_s=5.0, max_commit_lease_s=0.0
            )
        )
        session = register(m, "a")
        register(m, "b")
        for rid in "ab":
            assert m.join(request(rid, lease_s=0.05), 1.0)
        quorum = m.decide(1.0)
        assert quorum is not None and quorum.max_commit_lease_s == 0.0
        m.close_session("a", session, "SIGKILL")
        assert m.join(request("b", 1), 1.0) and m.decide(1.0) is not None

    def test_a_restarted_lighthouse_waits_out_a_lease_longer_than_its_join_timeout(self) -> None:
        m = new_membership(
            MembershipOptions(
                join_timeout_s=0.05, heartbeat_timeout_s=1.0, progress_timeout_s=5.0, max_commit_lease_s=0.2
            )
        )
        register(m, "a", now=0.0, last_quorum_id=40)
        assert m.join(request("a"), 0.0)
        assert m.decide(0.1) is None  # past join_timeout, within a lease the last incarnation granted
        assert m.decide(0.2) is not None


@settings(max_examples=300, deadline=None)
@given(
    members=st.sets(st.sampled_from("abcdefgh"), min_size=1),
    previous=st.one_of(st.none(), st.sets(st.sampled_from("abcdefgh"), min_size=1)),
    lost=st.sets(st.sampled_from("abcdefgh")),
    waiting=st.lists(st.sampled_from("abcdefgh"), unique=True),
    min_replicas=st.integers(1, 3),
)
def test_may_form_now_is_never_false_when_a_join_makes_a_quorum_without_a_deadline(
    members: set[str], previous: set[str] | None, lost: set[str], waiting: list[str], min_replicas: int
) -> None:
    """The server skips the full decision on a join when ``may_form_now`` says no: that must
    never hide a quorum the rules would form at once (deadline-driven ones come from the tick)."""
    m = new_membership(
        MembershipOptions(
            min_replicas=min_replicas, join_timeout_s=2.0, heartbeat_timeout_s=1.0, progress_timeout_s=5.0
        )
    )
    for rid in sorted(members | (previous or set())):
        register(m, rid)
    if previous is not None:
        for rid in previous:
            assert m.join(request(rid), 0.0)
        if m.decide(0.0) is None:
            return  # the rules did not form this previous quorum; nothing to check from here
    for rid in lost:
        if rid in m.members:
            m.close_session(rid, m.members[rid].session, "killed")
    for i, rid in enumerate(w for w in waiting if w in m.members):
        m.join(request(rid), 1.0 + i * 0.01)
        formed_at_once = decide_quorum(m.view(), 1.0 + i * 0.01, m.rules).participants is not None
        if formed_at_once:
            assert m.may_form_now(), (sorted(m.members), m.waiting_ids(), m.current)


class TestNewLeader:
    """A replicated lighthouse's new leader, restored from etcd (Membership.restore)."""

    def test_first_quorum_forms_as_soon_as_the_last_quorums_members_are_back(self) -> None:
        m = new_membership()
        m.restore(("a", "b"), next_quorum_id=8, now=0.0)
        for rid in ("a", "b"):
            register(m, rid, now=0.01, last_quorum_id=7)
            m.join(request(rid), 0.01)
        quorum = m.decide(0.02)
        assert quorum is not None and quorum.quorum_id == 8 and quorum.replica_ids == ("a", "b")

    def test_a_missing_member_of_the_last_quorum_is_waited_for_up_to_the_join_timeout(self) -> None:
        m = new_membership()
        m.restore(("a", "b"), next_quorum_id=8, now=0.0)
        register(m, "a", now=0.01, last_quorum_id=7)
        m.join(request("a"), 0.01)
        assert m.decide(1.0) is None
        assert m.last_decision is not None and "waiting for the last quorum's members ['b']" in m.last_decision.reason
        assert m.decide(2.01) is not None

    def test_no_recorded_quorum_waits_like_a_restarted_lighthouse(self) -> None:
        """etcd's data lost: members reporting quorums it never saw are waited for."""
        m = new_membership()
        m.restore(None, next_quorum_id=1, now=0.0)
        register(m, "a", now=0.0, last_quorum_id=40)
        m.join(request("a"), 0.0)
        assert m.decide(1.0) is None
        quorum = m.decide(2.01)
        assert quorum is not None and quorum.quorum_id == 41


class TestHistory:
    """No quorum forms behind a member that holds later committed steps (lighthouse/rules/history.py).

    The Ray test of torchft's example (min_replicas=1) found it: both survivors declared hung
    within a second; the first had committed ten steps alone before, and the second, back
    first at its older step, formed a quorum of its own there: two histories of those steps."""

    def setup_method(self) -> None:
        self.m = new_membership()  # min_replicas=1, join_timeout_s=2, heartbeat_timeout_s=1
        self.sessions = {rid: register(self.m, rid, now=0.0) for rid in "ab"}
        form(self.m, "ab", 0.0, step=10)
        # b falls silent (SIGSTOP, load) and is declared hung; a trains on alone to step 20 ...
        self.m.heartbeat("a", self.sessions["a"], Heartbeat(10, 1), 0.5)
        assert [x.replica_id for x in self.m.expire(1.2)] == ["b"]
        form(self.m, "a", 1.2, step=10)
        self.m.heartbeat("a", self.sessions["a"], Heartbeat(20, 2), 1.5)
        # ... and is declared hung in its turn, at step 20.
        assert [x.replica_id for x in self.m.expire(2.6)] == ["a"]

    def come_back(self, rid: str, now: float, step: int) -> None:
        self.sessions[rid] = register(self.m, rid, now=now, step=step, last_quorum_id=2)
        assert self.m.join(request(rid, step), now)

    def test_the_member_behind_waits_for_the_one_ahead_and_heals_from_it(self) -> None:
        self.come_back("b", 2.7, step=10)
        assert self.m.decide(2.7) is None
        assert self.m.last_decision is not None
        assert "for 'a', lost at step 20, ahead of every member asking (they reach step 10)" in (
            self.m.last_decision.reason
        )
        self.come_back("a", 2.9, step=20)
        quorum = self.m.decide(2.9)
        assert quorum is not None and quorum.replica_ids == ("a", "b") and max(quorum.steps) == 20

    def test_after_the_join_timeout_the_ones_behind_go_on_and_say_what_is_given_up(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        self.come_back("b", 2.7, step=10)
        assert self.m.decide(4.5) is None  # a was lost at 2.6: 1.9 s of its 2 s
        with caplog.at_level("WARNING", logger="lighthouse.rules.history"):
            quorum = self.m.decide(4.61)
        assert quorum is not None and quorum.replica_ids == ("b",) and max(quorum.steps) == 10
        assert "replica a, lost at step 20, did not come back within 2s" in caplog.text

    def test_a_member_whose_stream_closed_is_dead_and_not_waited_for(self) -> None:
        m = new_membership()
        sessions = {rid: register(m, rid, now=0.0) for rid in "ab"}
        form(m, "ab", 0.0, step=10)
        m.heartbeat("a", sessions["a"], Heartbeat(20, 1), 0.5)  # a alone ahead (b still at 10)
        m.close_session("a", sessions["a"], "session stream closed")  # SIGKILL: its steps died with it
        assert m.join(request("b", 10), 0.6)
        quorum = m.decide(0.6)
        assert quorum is not None and quorum.replica_ids == ("b",)

    def test_a_healthy_member_ahead_is_waited_for_past_the_join_timeout_until_it_asks(self) -> None:
        """b and c, back from a SIGSTOP at step 10, are a majority; a, which trained on alone to
        step 30, is in the middle of a long step: they wait for it, not the join timeout."""
        m = new_membership()
        sessions = {rid: register(m, rid, now=0.0) for rid in "abc"}
        form(m, "abc", 0.0, step=10)
        m.heartbeat("a", sessions["a"], Heartbeat(10, 1), 0.5)
        assert sorted(x.replica_id for x in m.expire(1.2)) == ["b", "c"]
        form(m, "a", 1.2, step=10)
        for rid in "bc":
            sessions[rid] = register(m, rid, now=1.3, step=10, last_quorum_id=2)
            assert m.join(request(rid, 10), 1.3)
        for t in (1.5, 2.0, 2.5, 3.0, 3.5, 4.0):  # a heartbeats, progressing, at step 30
            m.heartbeat("a", sessions["a"], Heartbeat(30, int(t * 10)), t)
        assert m.decide(4.0) is None
        assert m.last_decision is not None and "waiting for 'a', at step 30" in m.last_decision.reason
        assert m.join(request("a", 30), 4.1)
        quorum = m.decide(4.1)
        assert quorum is not None and quorum.replica_ids == ("a", "b", "c") and max(quorum.steps) == 30

    def test_a_quorum_behind_a_member_that_left_is_formed_at_once_and_the_second_history_named(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """a finished its run at step 20 and left; b, frozen meanwhile, comes back at step 10:
        nobody will return with a's steps, so b is not held, but what it trains is said."""
        m = new_membership()
        sessions = {rid: register(m, rid, now=0.0) for rid in "ab"}
        form(m, "ab", 0.0, step=10)
        m.heartbeat("a", sessions["a"], Heartbeat(20, 1), 0.5)
        m.close_session("a", sessions["a"], "left", graceful=True)
        assert m.join(request("b", 10), 0.6)
        with caplog.at_level("WARNING", logger="lighthouse.rules.history"):
            quorum = m.decide(0.6)
        assert quorum is not None and quorum.replica_ids == ("b",)
        assert "behind step 20 that replica a left at: steps 11 to 20 are trained a second time" in caplog.text
        caplog.clear()
        with caplog.at_level("WARNING", logger="lighthouse.rules.history"):
            form(m, "b", 0.7, step=11)
        assert "second time" not in caplog.text  # said once
