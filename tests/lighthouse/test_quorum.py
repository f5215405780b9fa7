"""The quorum rule (lighthouse/rules/quorum.py), table by table, with explicit ``now`` values.

The last sections drive :class:`Membership` with a fake clock for the scenarios that need
time to pass (the hung-member deadlock torchft has, a lighthouse restart), and check the
properties that must hold across any sequence of events with hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lighthouse.config.options import MembershipOptions
from lighthouse.rules.membership import Membership
from lighthouse.rules.plan import assign_stripes
from lighthouse.rules.quorum import QuorumRules, QuorumView, Waiting, decide_quorum
from lighthouse.wire.protocol import Heartbeat, QuorumRequest, Register


def view(
    healthy: str,
    waiting: dict[str, float | tuple[float, bool]],
    previous: str | None = None,
    newcomers: str = "",
) -> QuorumView:
    """``view("abc", {"a": 0.0, "b": (1.0, True)}, previous="ab")``: one letter per member;
    a waiting value is the time it joined, or (time, shrink_only)."""
    waits = {}
    for rid, value in waiting.items():
        since, shrink = value if isinstance(value, tuple) else (value, False)
        waits[rid] = Waiting(since, shrink)
    return QuorumView(
        healthy=frozenset(healthy),
        waiting=waits,
        previous=None if previous is None else tuple(previous),
        newcomers=frozenset(newcomers),
    )


@dataclass(frozen=True)
class Case:
    id: str
    view: QuorumView
    now: float
    expected: str | None
    """Participants as letters ("ab"), or None for "keep waiting"."""
    path: str = "none"
    reason: str = ""
    """A substring the decision's reason must contain."""
    min_replicas: int = 1
    join_timeout_s: float = 2.0


CASES = [
    # -- fast path ---------------------------------------------------------------------------
    Case(
        "fast_path_when_membership_unchanged",
        view("abc", {"a": 0.0, "b": 0.0, "c": 0.0}, previous="abc"),
        0.0,
        "abc",
        "fast",
        "every surviving member of the last quorum joined",
    ),
    Case(
        "fast_path_admits_joiners_waiting_at_the_boundary",
        view("abcd", {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}, previous="abc"),
        0.0,
        "abcd",
        "fast",
    ),
    Case(
        "fast_path_does_not_wait_for_registered_joiner_not_yet_asking",
        view("abcde", {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}, previous="abc"),
        0.0,
        "abcd",
        "fast",
    ),
    Case(
        "fast_path_without_lost_member_forms_at_once",
        view("ab", {"a": 0.0, "b": 0.0}, previous="abc"),
        0.0,
        "ab",
        "fast",
    ),
    Case(
        "fast_path_waits_for_surviving_member",
        view("abc", {"a": 0.0, "b": 0.0}, previous="abc"),
        1.0,
        None,
        "none",
        "waiting for ['c']",
    ),
    # -- min_replicas floor, both paths ------------------------------------------------------
    Case(
        "min_replicas_blocks_fast_path",
        view("ab", {"a": 0.0, "b": 0.0}, previous="ab"),
        0.0,
        None,
        "none",
        "2 waiting is below min_replicas=3",
        min_replicas=3,
    ),
    Case(
        "min_replicas_blocks_slow_path_after_join_timeout",
        view("ab", {"a": 0.0, "b": 0.0}),
        100.0,
        None,
        "none",
        "below min_replicas=3",
        min_replicas=3,
    ),
    Case(
        "min_replicas_met_exactly_forms",
        view("abc", {"a": 0.0, "b": 0.0, "c": 0.0}),
        0.0,
        "abc",
        "slow",
        min_replicas=3,
    ),
    # -- majority guard ----------------------------------------------------------------------
    Case(
        "majority_guard_blocks_half_of_healthy_after_join_timeout",
        view("abcd", {"a": 0.0, "b": 0.0}),
        100.0,
        None,
        "none",
        "2 waiting is not a majority of 4 healthy",
    ),
    Case(
        "majority_guard_blocks_one_of_two",
        view("ab", {"a": 0.0}, previous="ab"),
        100.0,
        None,
        "none",
        "not a majority of 2",
    ),
    Case(
        "majority_guard_blocks_fast_path_outnumbered_by_registered_joiners",
        view("abcde", {"a": 0.0, "b": 0.0}, previous="ab"),
        100.0,
        None,
        "none",
        "not a majority of 5",
    ),
    Case(
        "newcomer_not_waiting_does_not_block_the_fast_path",
        view("ab", {"a": 0.0}, previous="a", newcomers="b"),
        0.0,
        "a",
        "fast",
        "every surviving member",
    ),
    Case(
        "newcomers_not_waiting_are_waited_for_on_the_first_quorum",
        view("ab", {"a": 0.0}, newcomers="ab"),
        1.0,
        None,
        "none",
        "waiting for ['b'] to join",
    ),
    Case(
        "newcomers_not_waiting_are_left_after_join_timeout_on_the_first_quorum",
        view("ab", {"a": 0.0}, newcomers="ab"),
        100.0,
        "a",
        "slow",
        "join timeout",
    ),
    Case(
        "newcomers_that_wait_count_for_the_majority",
        view("abcde", {"c": 0.0, "d": 0.0}, previous="ab", newcomers="cde"),
        100.0,
        None,
        "none",
        "not a majority of 4 healthy",
    ),
    Case(
        "majority_of_healthy_forms_after_join_timeout",
        view("abcd", {"a": 0.0, "b": 0.0, "c": 0.0}),
        2.0,
        "abc",
        "slow",
        "join timeout 2s passed without ['d']",
    ),
    # -- slow path and the join timeout ------------------------------------------------------
    Case(
        "slow_path_forms_when_every_healthy_member_joined",
        view("ab", {"a": 0.0, "b": 0.5}),
        0.5,
        "ab",
        "slow",
        "every healthy member joined",
    ),
    Case(
        "join_timeout_not_reached_keeps_waiting_for_straggler",
        view("abc", {"a": 0.0, "b": 0.5}),
        1.99,
        None,
        "none",
        "waiting for ['c'] to join (1.99s of join_timeout 2s)",
    ),
    Case(
        "join_timeout_counts_from_first_waiter",
        view("abc", {"a": 0.0, "b": 1.5}),
        2.0,
        "ab",
        "slow",
        "join timeout 2s passed",
    ),
    Case(
        "join_timeout_for_straggling_member_of_last_quorum",
        view("abc", {"a": 10.0, "b": 10.0}, previous="abc"),
        12.0,
        "ab",
        "slow",
        "without ['c']",
    ),
    # -- shrink_only -------------------------------------------------------------------------
    Case(
        "shrink_only_excludes_joiners",
        view("abc", {"a": (0.0, True), "b": 0.0, "c": 0.0}, previous="ab"),
        0.0,
        "ab",
        "fast",
    ),
    Case(
        "without_shrink_only_joiners_are_admitted",
        view("abc", {"a": 0.0, "b": 0.0, "c": 0.0}, previous="ab"),
        0.0,
        "abc",
        "fast",
    ),
    Case(
        "shrink_only_waits_only_for_members_of_last_quorum",
        view("abcde", {"a": (0.0, True), "b": 0.0, "c": 0.0}, previous="abcd"),
        1.0,
        None,
        "none",
        "waiting for ['d'] to join",
    ),
    Case(
        "shrink_only_forms_without_straggler_at_join_timeout",
        view("abcde", {"a": (0.0, True), "b": 0.0, "c": 0.0}, previous="abcd"),
        2.0,
        "abc",
        "slow",
    ),
    Case(
        "shrink_only_with_only_joiners_waiting_forms_nothing",
        view("abc", {"c": (0.0, True)}, previous="ab"),
        100.0,
        None,
        "none",
        "no member is waiting",
    ),
    Case(
        "shrink_only_without_previous_quorum_still_waits_for_stragglers",
        view("abc", {"a": (0.0, True), "b": 0.0}),
        1.0,
        None,
        "none",
        "waiting for ['c']",
    ),
    Case(
        "shrink_only_without_previous_quorum_forms_at_join_timeout",
        view("abc", {"a": (0.0, True), "b": 0.0}),
        2.0,
        "ab",
        "slow",
    ),
    # -- bookkeeping -------------------------------------------------------------------------
    Case(
        "nobody_waiting_forms_nothing",
        view("ab", {}, previous="ab"),
        100.0,
        None,
        "none",
        "no member is waiting [0 waiting of 2 healthy]",
    ),
    Case(
        "waiter_without_healthy_session_is_ignored",
        view("ab", {"a": 0.0, "b": 0.0, "x": 0.0}, previous="ab"),
        0.0,
        "ab",
        "fast",
    ),
    Case("first_quorum_of_a_single_member", view("a", {"a": 0.0}), 0.0, "a", "slow"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide_quorum(case: Case) -> None:
    decision = decide_quorum(case.view, case.now, QuorumRules(case.min_replicas, case.join_timeout_s))
    expected = None if case.expected is None else tuple(case.expected)
    assert (decision.participants, decision.path) == (expected, case.path), decision.reason
    assert decision.formed == (expected is not None)
    assert case.reason in decision.reason


def test_reason_carries_the_counts_behind_the_decision() -> None:
    decision = decide_quorum(view("abcd", {"a": 0.0}), 0.0, QuorumRules(2, 1.0))
    assert "[1 waiting of 4 healthy][min_replicas=2][shrink_only=False]" in decision.reason


def test_moving_now_past_join_timeout_turns_wait_into_quorum() -> None:
    v = view("abc", {"a": 5.0, "b": 5.0})
    rules = QuorumRules(1, 2.0)
    assert [decide_quorum(v, now, rules).participants for now in (5.0, 6.0, 6.999, 7.0, 9.0)] == [
        None,
        None,
        None,
        ("a", "b"),
        ("a", "b"),
    ]


def test_the_join_timeout_runs_from_the_last_quorums_first_member_to_ask_not_an_earlier_waiter() -> None:
    """c, restarted mid-step, has waited since 0; a and b (the last quorum) finish their long step
    at 5 and just after. The timeout ran from c's arrival, so the quorum formed as a asked,
    without b, and b, left to wait a whole step, was the early waiter of the next round: one
    group out of every quorum (benchmarks/scale/left_out.py). It runs from a's ask now."""
    rules = QuorumRules(1, 2.0)
    v = view("abc", {"c": 0.0, "a": 5.0}, previous="ab")
    assert [decide_quorum(v, now, rules).participants for now in (5.0, 6.9, 7.0)] == [None, None, ("a", "c")]
    assert "waiting for ['b'] to join (0.00s of join_timeout 2s)" in decide_quorum(v, 5.0, rules).reason
    assert decide_quorum(view("abc", {"c": 0.0, "a": 5.0, "b": 5.1}, previous="ab"), 5.1, rules).participants == (
        "a",
        "b",
        "c",
    )
    # Nobody of the last quorum asking: the first waiter starts the clock, as before.
    assert decide_quorum(view("abcde", {"c": 0.0, "d": 1.0, "e": 1.5}, previous="ab"), 2.0, rules).participants == (
        "c",
        "d",
        "e",
    )


# -- scenarios through Membership with a fake clock -------------------------------------------


class FakeClock:
    """Monotonic time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def register(m: Membership, rid: str, now: float, *, last_quorum_id: int = -1, step: int = 0) -> int:
    session, lost = m.register(Register(rid, f"host-{rid}", 1, step, last_quorum_id), now)
    assert lost == []
    return session


def join(m: Membership, rid: str, now: float, *, step: int = 0) -> None:
    assert m.join(QuorumRequest(rid, step, f"host-{rid}", 1, 10.0), now)


def test_two_groups_one_hung_does_not_block_survivor() -> None:
    """torchft's deadlock: with two groups, one hung in a collective but still heartbeating,
    the majority guard blocks the survivor forever. Here the progress deadline drops the
    hung group, and the survivor forms a quorum alone."""
    options = MembershipOptions(heartbeat_timeout_s=1.0, progress_timeout_s=5.0, join_timeout_s=2.0)
    m = Membership(options, incarnation=1)
    clock = FakeClock()
    sessions = {rid: register(m, rid, clock.now) for rid in "ab"}
    join(m, "a", clock.now)
    join(m, "b", clock.now)
    first = m.decide(clock.now, now_unix_s=0.0)
    assert first is not None and first.replica_ids == ("a", "b")

    # b hangs in the step's collective: its heartbeat thread goes on, its step never changes.
    clock.advance(1.0)
    m.heartbeat("a", sessions["a"], Heartbeat(step=1, progress=1), clock.now)
    join(m, "a", clock.now, step=1)
    for tenth in range(11, 50):  # every 100 ms up to t=4.9
        clock.now = tenth / 10
        m.heartbeat("a", sessions["a"], Heartbeat(step=1, progress=1), clock.now)
        m.heartbeat("b", sessions["b"], Heartbeat(step=0, progress=0), clock.now)
        assert m.expire(clock.now) == []
        assert m.decide(clock.now) is None, "the survivor alone is not a majority of two"
    assert m.last_decision is not None and "not a majority of 2" in m.last_decision.reason

    clock.now = 5.1  # 5.1 s since b last progressed (its quorum formed at t=0)
    lost = m.expire(clock.now)
    assert [(x.replica_id, x.quorum_id) for x in lost] == [("b", first.quorum_id)]
    assert "no progress for 5.10s at step 0" in lost[0].reason
    survivor = m.decide(clock.now)
    assert survivor is not None and survivor.replica_ids == ("a",)
    assert survivor.quorum_id > first.quorum_id


def test_lighthouse_restart_continues_quorum_ids_above_what_members_saw() -> None:
    old = Membership(MembershipOptions(), incarnation=1)
    for rid in "ab":
        register(old, rid, 0.0)
    seen = []
    for now, members in ((0.0, "ab"), (1.0, "ab")):
        for rid in members:
            join(old, rid, now)
        quorum = old.decide(now)
        assert quorum is not None
        seen.append(quorum.quorum_id)
    old.close_session("b", 2, "test")
    join(old, "a", 2.0)
    quorum = old.decide(2.0)
    assert quorum is not None
    seen.append(quorum.quorum_id)
    highest = max(seen)

    # A new incarnation knows nothing; the members re-register with the last id they saw.
    new = Membership(MembershipOptions(), incarnation=2)
    register(new, "a", 0.0, last_quorum_id=highest)
    register(new, "b", 0.0, last_quorum_id=seen[0])
    assert new.current is None
    join(new, "a", 0.0)
    join(new, "b", 0.0)
    # A restarted lighthouse gives the members of the last quorum join_timeout to reconnect.
    assert new.decide(1.9) is None
    assert new.last_decision is not None and "restarted" in new.last_decision.reason
    resumed = new.decide(2.0)
    assert resumed is not None
    assert resumed.quorum_id == highest + 1
    assert resumed.incarnation == 2


def test_fresh_lighthouse_forms_its_first_quorum_at_once() -> None:
    fresh = Membership(MembershipOptions(), incarnation=1)
    for rid in "ab":
        register(fresh, rid, 0.0)
        join(fresh, rid, 0.0)
    assert fresh.decide(0.0) is not None


# -- properties ---------------------------------------------------------------------------------

REPLICAS = "abcd"

events = st.lists(
    st.one_of(
        st.tuples(st.just("register"), st.sampled_from(REPLICAS)),
        st.tuples(st.just("join"), st.sampled_from(REPLICAS), st.booleans(), st.integers(0, 1)),
        st.tuples(st.just("heartbeat"), st.sampled_from(REPLICAS), st.booleans()),
        st.tuples(st.just("close"), st.sampled_from(REPLICAS)),
        st.tuples(st.just("leave"), st.sampled_from(REPLICAS)),
        st.tuples(st.just("advance"), st.sampled_from([0.05, 0.5, 1.5, 3.0, 12.0])),
        st.tuples(st.just("expire")),
        st.tuples(st.just("decide")),
        st.tuples(st.just("restart")),
    ),
    max_size=80,
)


@dataclass
class Replica:
    """What a member's client remembers across sessions and lighthouse restarts."""

    last_quorum_id: int = -1
    session: int | None = None
    step: int = 0
    progress: int = 0


@dataclass
class World:
    options: MembershipOptions
    incarnation: int = 1
    now: float = 0.0
    replicas: dict[str, Replica] = field(default_factory=lambda: {rid: Replica() for rid in REPLICAS})
    formed: list[tuple[int, int, frozenset[tuple[str, int]]]] = field(default_factory=list)
    """(incarnation, quorum id, participant sessions) of every quorum, in order."""

    def __post_init__(self) -> None:
        self.membership = Membership(self.options, self.incarnation)

    def apply(self, event: tuple) -> None:
        m = self.membership
        kind = event[0]
        if kind == "register":
            r = self.replicas[event[1]]
            r.session, _ = m.register(Register(event[1], "", 1, r.step, r.last_quorum_id), self.now)
        elif kind == "join":
            _, rid, shrink_only, commit_failures = event
            r = self.replicas[rid]
            m.join(QuorumRequest(rid, r.step, "", 1, 10.0, shrink_only, commit_failures), self.now)
        elif kind == "heartbeat":
            _, rid, progressed = event
            r = self.replicas[rid]
            if r.session is not None:
                r.progress += progressed
                m.heartbeat(rid, r.session, Heartbeat(r.step, r.progress), self.now)
        elif kind == "close":
            r = self.replicas[event[1]]
            if r.session is not None:
                m.close_session(event[1], r.session, "closed")
        elif kind == "leave":
            m.leave(event[1], self.now)
        elif kind == "advance":
            self.now += event[1]
        elif kind == "expire":
            m.expire(self.now)
        elif kind == "decide":
            self.decide()
        elif kind == "restart":
            # A new lighthouse process; every client reconnects and re-registers.
            self.incarnation += 1
            self.membership = Membership(self.options, self.incarnation)
            for rid, r in self.replicas.items():
                r.session, _ = self.membership.register(Register(rid, "", 1, r.step, r.last_quorum_id), self.now)

    def decide(self) -> None:
        m = self.membership
        healthy = set(m.members)
        # Newcomers (never in a quorum) count for the majority only once they wait.
        voters = {rid for rid in healthy if not m.members[rid].newcomer or rid in m.waiting_ids()}
        quorum = m.decide(self.now, now_unix_s=0.0)
        if quorum is None:
            return
        participants = set(quorum.replica_ids)
        assert participants <= healthy
        assert len(participants) > len(voters) / 2, (participants, voters)
        assert len(participants) >= self.options.min_replicas
        sessions = frozenset((rid, m.members[rid].session) for rid in participants)
        self.formed.append((self.incarnation, quorum.quorum_id, sessions))
        for rid in participants:
            r = self.replicas[rid]
            r.last_quorum_id = max(r.last_quorum_id, quorum.quorum_id)
            r.step += 1


@settings(max_examples=300, deadline=None)
@given(events=events, min_replicas=st.integers(1, 3))
def test_quorum_ids_never_go_back_and_never_name_two_memberships(events: list[tuple], min_replicas: int) -> None:
    world = World(
        MembershipOptions(
            min_replicas=min_replicas, join_timeout_s=1.0, heartbeat_timeout_s=1.0, progress_timeout_s=2.0
        )
    )
    for event in events:
        world.apply(event)
        world.decide()

    issued: dict[int, tuple[int, frozenset[tuple[str, int]]]] = {}
    highest = 0
    for incarnation, quorum_id, sessions in world.formed:
        if quorum_id in issued:
            # Reusing an id is how "membership unchanged" is said; it must mean exactly that.
            assert issued[quorum_id] == (incarnation, sessions)
            assert quorum_id == highest, "only the current quorum's id may be reused"
        else:
            assert quorum_id > highest, f"new quorum id {quorum_id} is not above {highest}"
            issued[quorum_id] = (incarnation, sessions)
        highest = max(highest, quorum_id)


def quorum_views() -> st.SearchStrategy[tuple[QuorumView, QuorumView, float, float]]:
    """Two views over the same healthy members, differing in who waits and since when."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[QuorumView, QuorumView, float, float]:
        healthy = draw(st.sets(st.sampled_from("abcdefg"), min_size=1))

        def one_view() -> QuorumView:
            waiting = draw(
                st.dictionaries(
                    st.sampled_from(sorted(healthy) + ["x"]),
                    st.builds(Waiting, st.floats(0, 10), st.booleans()),
                )
            )
            previous = draw(st.none() | st.lists(st.sampled_from("abcdefgh"), unique=True).map(sorted).map(tuple))
            return QuorumView(frozenset(healthy), waiting, previous)

        return one_view(), one_view(), draw(st.floats(0, 20)), draw(st.floats(0, 20))

    return build()


@settings(max_examples=200)
@given(views=quorum_views(), min_replicas=st.integers(1, 4), join_timeout_s=st.floats(0.1, 5))
def test_two_quorums_over_same_healthy_members_always_overlap(
    views: tuple[QuorumView, QuorumView, float, float], min_replicas: int, join_timeout_s: float
) -> None:
    first_view, second_view, first_now, second_now = views
    rules = QuorumRules(min_replicas, join_timeout_s)
    first = decide_quorum(first_view, first_now, rules)
    second = decide_quorum(second_view, second_now, rules)
    for decision, v in ((first, first_view), (second, second_view)):
        if decision.participants is not None:
            assert len(decision.participants) > len(v.healthy) / 2
            assert set(decision.participants) <= v.healthy & set(v.waiting)
            assert list(decision.participants) == sorted(decision.participants)
            assert len(decision.participants) >= min_replicas
    if first.participants is not None and second.participants is not None:
        assert set(first.participants) & set(second.participants), "split brain"


@given(
    num_bytes=st.integers(0, 10**9),
    donors=st.lists(st.text("abcdef", min_size=1, max_size=3), min_size=1, max_size=8, unique=True),
    healer_index=st.integers(0, 20),
    min_stripe_bytes=st.integers(1, 10**8),
)
def test_stripes_cover_every_byte_once_in_order_from_given_donors(
    num_bytes: int, donors: list[str], healer_index: int, min_stripe_bytes: int
) -> None:
    stripes = assign_stripes(num_bytes, donors, healer_index=healer_index, min_stripe_bytes=min_stripe_bytes)
    position = 0
    for stripe in stripes:
        assert stripe.start == position and stripe.num_bytes > 0
        assert stripe.donor in donors
        position = stripe.stop
    assert position == num_bytes
