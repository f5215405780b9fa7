"""Standing quorums (lighthouse/rules/standing.py) and the leases stretched over them
(lighthouse/rules/commit_lease.py): the pure rules, and the lighthouse's membership granting and
ending them, with a fake clock."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import LighthouseProcess, start_lighthouse
from support.training_events import assert_digests_agree, assert_samples_exactly_once, start_group

from lighthouse.client.async_client import AsyncLighthouseClient
from lighthouse.config.options import MembershipOptions
from lighthouse.rules.commit_lease import CommitLease, MemberLease, lease_s
from lighthouse.rules.membership import Membership
from lighthouse.rules.standing import MAX_STANDING_STEPS, StandingQuorum, standing_steps
from lighthouse.wire.protocol import Member, Notice, Quorum, QuorumRequest, Register
from replicaft.process.threads import LoopThread

LEASE_MAX_S = 0.1
TIMEOUT_S = 10.0


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        pytest.param([0.02, 0.02], 8, id="10_ms_steps_fill_the_cap"),
        pytest.param([0.03, 0.02], 4, id="the_slowest_member_counts:_15_ms_fit_6_less_the_lease's_2"),
        pytest.param([0.05], 2, id="25_ms_steps_stand_2"),
        pytest.param([0.08], 0, id="40_ms_steps_fit_only_the_lease"),
        pytest.param([0.5], 0, id="slow_steps_stand_none"),
        pytest.param([0.02, 0.0], 0, id="a_member_without_an_interval_yet"),
        pytest.param([], 0, id="nobody"),
    ],
)
def test_standing_steps_fit_in_the_longest_lease_at_the_slowest_interval(asked: list[float], expected: int) -> None:
    assert standing_steps(asked, LEASE_MAX_S) == expected


def test_a_lighthouse_granting_no_lease_grants_no_standing() -> None:
    assert standing_steps([0.001], 0.0) == 0
    assert standing_steps([1e-6], 10.0) == MAX_STANDING_STEPS


def test_a_standing_quorum_gets_the_longest_lease_and_a_quorum_round_what_it_asked() -> None:
    assert lease_s(0.02, 0, LEASE_MAX_S) == 0.02
    assert lease_s(0.5, 0, LEASE_MAX_S) == LEASE_MAX_S
    assert lease_s(0.02, 1, LEASE_MAX_S) == LEASE_MAX_S


def quorum(step: int, standing: int, ids: tuple[str, ...] = ("a", "b")) -> Quorum:
    return Quorum.of(5, 1, 1000.0, (Member(rid, f"host-{rid}", step, 1, {}) for rid in ids), standing_steps=standing)


class TestStandingQuorum:
    def test_answers_the_next_steps_in_order_then_asks(self) -> None:
        standing = StandingQuorum.granted(quorum(10, 3), 10)
        assert standing is not None
        for step in (11, 12, 13):
            answered = standing.answer(step, 0)
            assert answered is not None
            assert (answered.quorum_id, answered.steps, answered.standing_steps) == (5, (step, step), 0)
        assert standing.answer(14, 0) is None

    def test_a_step_out_of_order_or_after_a_failed_one_asks(self) -> None:
        standing = StandingQuorum.granted(quorum(10, 3), 10)
        assert standing is not None
        assert standing.answer(10, 0) is None  # the step did not commit: asked again
        assert standing.answer(12, 0) is None
        assert standing.answer(11, 1) is None
        assert standing.answer(11, 0) is not None

    def test_a_quorum_without_standing_grants_none(self) -> None:
        assert StandingQuorum.granted(quorum(10, 0), 10) is None


def test_a_lease_covers_its_step_and_the_standing_ones_until_it_ends() -> None:
    lease = CommitLease(quorum_id=5, step=10, last_step=13, until=2.0)
    assert lease.covers(5, 10, 1.0) and lease.covers(5, 13, 1.99)
    assert not lease.covers(5, 14, 1.0) and not lease.covers(5, 9, 1.0)
    assert not lease.covers(6, 11, 1.0) and not lease.covers(5, 11, 2.0)


def test_a_member_measures_its_interval_per_step_across_standing_steps() -> None:
    lease = MemberLease()
    assert lease.ask(1.0, 0) == 0.0
    assert lease.ask(1.02, 1) == pytest.approx(0.04)  # one step of 20 ms: two intervals
    assert lease.ask(1.10, 5) == pytest.approx(0.04)  # four steps (three standing) in 80 ms
    assert lease.ask(1.15, 5) == pytest.approx(0.10)  # the step asked again: 50 ms since
    lease.granted(5, 5, 0.04, 3, LEASE_MAX_S, sent_at=1.15)
    assert lease.held == CommitLease(5, 5, 8, pytest.approx(1.25))
    lease.granted(6, 9, 0.04, 0, LEASE_MAX_S, sent_at=1.3)
    assert lease.held == CommitLease(6, 9, 9, pytest.approx(1.34))


OPTIONS = MembershipOptions(
    min_replicas=1, join_timeout_s=2.0, heartbeat_timeout_s=1.0, progress_timeout_s=5.0, max_commit_lease_s=LEASE_MAX_S
)


def ask(rid: str, step: int, lease: float = 0.04, failures: int = 0) -> QuorumRequest:
    return QuorumRequest(rid, step, f"host-{rid}", 1, timeout_s=10.0, commit_failures=failures, commit_lease_s=lease)


class TestMembershipStanding:
    def setup_method(self) -> None:
        self.m = Membership(OPTIONS, incarnation=7)
        self.sessions = {rid: self.m.register(Register(rid, f"host-{rid}", 1, 0), 0.0)[0] for rid in "ab"}

    def round(self, step: int, now: float, rids: str = "ab", **kwargs: float) -> Quorum:
        for rid in rids:
            assert self.m.join(ask(rid, step, **kwargs), now)
        formed = self.m.decide(now)
        assert formed is not None, self.m.last_decision
        return formed

    def test_a_roster_that_held_a_round_stands_and_its_members_ask_after_the_standing(self) -> None:
        first = self.round(0, 1.0)
        assert first.standing_steps == 0  # a new quorum id: nothing known to hold yet
        second = self.round(1, 1.02)
        assert (second.quorum_id, second.standing_steps) == (first.quorum_id, 3)  # 0.1 s fit 5 of 20 ms, less 2
        assert self.m.end_standing(ask("a", 5)) is None  # the step after the standing: an ordinary round
        third = self.round(5, 1.10)
        assert third.standing_steps == 3

    def test_a_member_asking_within_the_standing_ends_it_once(self) -> None:
        self.round(0, 1.0)
        self.round(1, 1.02)
        assert self.m.end_standing(ask("a", 3)) is self.m.current
        assert self.m.end_standing(ask("b", 3)) is None  # told once
        assert self.m.end_standing(ask("c", 2)) is None  # not a member of the quorum
        before = self.m.current
        assert before is not None
        after = self.round(3, 1.04)
        assert after.quorum_id > before.quorum_id  # the notice named the old one: it cannot abort a step of this

    def test_healing_a_newcomer_or_a_failed_step_grants_none(self) -> None:
        self.round(0, 1.0)
        for rid, step in (("a", 4), ("b", 1)):  # b is behind: it heals
            assert self.m.join(ask(rid, step), 1.02)
        healing = self.m.decide(1.02)
        assert healing is not None and healing.standing_steps == 0
        assert self.round(4, 1.04).standing_steps == 3
        self.m.register(Register("c", "host-c", 1, 0), 1.05)  # a member outside the quorum
        assert self.round(5, 1.06, "ab").standing_steps == 0
        assert self.round(6, 1.08, "abc").standing_steps == 0  # a new roster
        assert self.round(7, 1.10, "abc", failures=1).standing_steps == 0

    def test_a_lost_member_ends_the_standing_without_a_notice(self) -> None:
        self.round(0, 1.0)
        self.round(1, 1.02)
        self.m.close_session("b", self.sessions["b"], "SIGKILL")
        assert self.m.end_standing(ask("a", 2)) is None  # the survivors were told it was lost

    def test_the_leases_of_a_standing_quorum_hold_its_members_for_the_standing_steps(self) -> None:
        self.round(0, 1.0)
        self.round(1, 1.02)  # standing: each granted the longest lease, 0.1 s
        self.m.close_session("b", self.sessions["b"], "SIGKILL")
        assert self.m.join(ask("a", 2, failures=1), 1.03)
        assert self.m.decide(1.1199) is None
        assert self.m.decide(1.12) is not None


def test_a_member_asking_within_the_standing_ends_it_for_the_others_with_a_notice() -> None:
    """A real lighthouse: the second round of a steady roster stands; a member asking again
    within it makes the lighthouse tell the other (``standing_ended``, naming the quorum), and
    the next quorum, formed once both asked, has a new id."""
    lighthouse = start_lighthouse("--min-replicas", "2", "--join-timeout", "5", "--max-commit-lease", "5")
    loop = LoopThread("standing-test")
    loop.start()
    told: list[Notice] = []
    clients = {rid: AsyncLighthouseClient(lighthouse.grpc_address, rid, on_notice=told.append) for rid in "ab"}

    def round_of(step: int, rids: str = "ab") -> dict[str, Quorum]:
        futures = {rid: loop.submit(clients[rid].quorum(step, TIMEOUT_S)) for rid in rids}
        return {rid: f.result(TIMEOUT_S + 1) for rid, f in futures.items()}

    try:
        for client in clients.values():
            loop.call(client.start(), TIMEOUT_S)
        first = round_of(0)["a"]
        second = round_of(1)["a"]
        assert second.quorum_id == first.quorum_id and second.standing_steps >= 1
        early = loop.submit(clients["a"].quorum(2, TIMEOUT_S))  # within the standing, as after a failed step
        deadline = time.monotonic() + TIMEOUT_S
        while not any(n.kind == "standing_ended" for n in told):
            assert time.monotonic() < deadline, f"no standing_ended notice; told {told}"
            time.sleep(0.01)
        ended = next(n for n in told if n.kind == "standing_ended")
        assert (ended.quorum_id, ended.replica_id) == (second.quorum_id, "a")
        assert not early.done()  # the lighthouse waits for b, which the notice sends asking
        third = round_of(2, "b")["b"]
        assert early.result(TIMEOUT_S).quorum_id == third.quorum_id > second.quorum_id
        assert _metric(lighthouse, "standing_ended") == 1 and _metric(lighthouse, "quorums_standing") == 1
    finally:
        for client in clients.values():
            loop.call(client.close(), TIMEOUT_S)
        loop.stop()


def _metric(lighthouse: LighthouseProcess, name: str) -> float:
    assert lighthouse.status_url is not None
    with urllib.request.urlopen(lighthouse.status_url + "metrics", timeout=TIMEOUT_S) as response:
        found = re.search(rf"^replicaft_lighthouse_{name}_total ([\d.]+)$", response.read().decode(), re.M)
    assert found is not None
    return float(found.group(1))


@pytest.mark.timeout(180)
def test_groups_train_on_standing_quorums_asking_the_lighthouse_a_fraction_of_their_steps(tmp_path: Path) -> None:
    lighthouse = start_lighthouse("--heartbeat-timeout", "30", "--progress-timeout", "60")
    groups = [start_group(lighthouse.grpc_address, rid, tmp_path, "--steps", "80") for rid in ("g0", "g1")]
    for group in groups:
        assert group.wait_exit(120) == 0, group.output_tail()
    assert _metric(lighthouse, "quorums_standing") >= 1
    # Fewer quorums formed than steps taken: some steps asked nothing. How few is a figure for
    # the benchmarks (step_overhead, chaos standing), not a bound for a test on a loaded machine:
    # under < 60 it failed once here with two other jobs running beside it.
    assert _metric(lighthouse, "quorums_formed") < 80
    assert_digests_agree(tmp_path, min_steps=80)
    assert_samples_exactly_once(tmp_path, min_steps=80)
