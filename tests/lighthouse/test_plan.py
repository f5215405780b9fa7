"""The step plan every manager derives from a quorum (lighthouse/rules/plan.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lighthouse.rules.plan import (
    MIN_STRIPE_BYTES,
    STRIPES_PER_DONOR,
    Stripe,
    assign_stripes,
    plan_step,
)
from lighthouse.wire.protocol import Member, Notice, Quorum


def quorum(steps: dict[str, int], *, quorum_id: int = 5, incarnation: int = 9) -> Quorum:
    """A quorum whose participants are given in the order of ``steps`` (not sorted)."""
    return Quorum.of(quorum_id, incarnation, 0.0, (Member(rid, f"host-{rid}", step, 1) for rid, step in steps.items()))


class TestPlanStep:
    def test_replica_rank_is_position_in_sorted_replica_ids(self) -> None:
        q = quorum({"c": 3, "a": 3, "b": 3})
        assert {rid: plan_step(q, rid).replica_rank for rid in "abc"} == {"a": 0, "b": 1, "c": 2}

    def test_members_behind_max_step_heal_from_those_at_it(self) -> None:
        q = quorum({"d": 7, "b": 10, "a": 4, "c": 10})
        plan = plan_step(q, "a")
        assert plan.max_step == 10 and plan.step == 4
        assert plan.donors == ("b", "c")
        assert plan.healers == ("a", "d")
        assert plan.healing and not plan_step(q, "b").healing
        assert plan.num_contributors == 2
        assert plan.num_replicas == 4

    def test_everyone_at_same_step_means_no_healer(self) -> None:
        plan = plan_step(quorum({"a": 2, "b": 2}), "b")
        assert plan.healers == () and plan.donors == ("a", "b") and plan.num_contributors == 2

    def test_every_member_derives_the_same_shared_facts(self) -> None:
        q = quorum({"c": 1, "a": 3, "b": 3})
        plans = [plan_step(q, rid) for rid in "abc"]
        shared = [
            (p.quorum_id, p.incarnation, p.max_step, p.donors, p.healers, p.store_prefix, p.participants) for p in plans
        ]
        assert shared[0] == shared[1] == shared[2]
        assert sorted(p.replica_rank for p in plans) == [0, 1, 2]

    def test_non_participant_rejected_naming_replica_and_quorum(self) -> None:
        with pytest.raises(ValueError, match=r"replica 'z' is not in quorum 5 \(\['a', 'b'\]\)"):
            plan_step(quorum({"a": 0, "b": 0}), "z")

    def test_store_prefix_names_incarnation_and_quorum(self) -> None:
        assert plan_step(quorum({"a": 0}, quorum_id=23, incarnation=1), "a").store_prefix == "replicaft/1/23"

    @given(
        first=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
        second=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
    )
    def test_store_prefix_unique_per_incarnation_and_quorum(
        self, first: tuple[int, int], second: tuple[int, int]
    ) -> None:
        prefixes = [
            plan_step(quorum({"a": 0}, incarnation=incarnation, quorum_id=quorum_id), "a").store_prefix
            for incarnation, quorum_id in (first, second)
        ]
        assert (prefixes[0] == prefixes[1]) == (first == second)

    def test_column_store_owner_rotates_over_donors(self) -> None:
        plan = plan_step(quorum({"a": 1, "b": 9, "c": 9, "d": 9}), "a")
        assert [plan.column_store_owner(r).replica_id for r in range(5)] == ["b", "c", "d", "b", "c"]

    @given(
        steps=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 3), min_size=1), group_rank=st.integers(0, 64)
    )
    def test_column_store_owner_never_a_healer(self, steps: dict[str, int], group_rank: int) -> None:
        q = quorum(steps)
        plans = [plan_step(q, rid) for rid in steps]
        owners = {p.column_store_owner(group_rank).replica_id for p in plans}
        assert len(owners) == 1, "every member must agree on the owner"
        owner = owners.pop()
        assert owner in plans[0].donors and owner not in plans[0].healers
        assert steps[owner] == max(steps.values())


class TestAssignStripes:
    def test_empty_state_needs_no_stripes(self) -> None:
        assert assign_stripes(0, ["a"]) == ()

    def test_small_state_is_one_stripe(self) -> None:
        assert assign_stripes(100, ["a", "b"]) == (Stripe("a", 0, 100),)

    def test_large_state_split_evenly_across_donors(self) -> None:
        num_bytes = 10 * STRIPES_PER_DONOR * MIN_STRIPE_BYTES
        stripes = assign_stripes(num_bytes, ["a", "b"])
        assert len(stripes) == 2 * STRIPES_PER_DONOR
        assert [s.donor for s in stripes] == ["a", "b"] * STRIPES_PER_DONOR
        assert {s.num_bytes for s in stripes} == {num_bytes // len(stripes)}

    def test_uneven_split_differs_by_at_most_one_byte(self) -> None:
        stripes = assign_stripes(10, ["a", "b", "c"], min_stripe_bytes=1)
        assert [s.num_bytes for s in stripes] == [1] * 10
        stripes = assign_stripes(100, ["a", "b", "c"], min_stripe_bytes=1)
        assert [s.num_bytes for s in stripes] == [9] * 4 + [8] * 8

    def test_healer_index_rotates_the_first_donor(self) -> None:
        stripes = assign_stripes(3, ["a", "b", "c"], healer_index=1, min_stripe_bytes=1)
        assert [s.donor for s in stripes] == ["b", "c", "a"]

    def test_no_donor_rejected(self) -> None:
        with pytest.raises(ValueError, match="no donors"):
            assign_stripes(10, [])

    def test_negative_size_rejected(self) -> None:
        with pytest.raises(ValueError, match="num_bytes=-1"):
            assign_stripes(-1, ["a"])


class TestLostParticipant:
    def test_a_loss_in_the_plans_quorum_or_a_later_one_is_a_participants(self) -> None:
        plan = plan_step(quorum({"a": 3, "b": 3}, quorum_id=5), "a")
        assert plan.lost_participant(Notice("member_lost", 5, "b"))
        assert plan.lost_participant(Notice("member_lost", 6, "b"))
        assert not plan.lost_participant(Notice("member_lost", 5, "c"))

    def test_a_late_notice_about_a_restarted_groups_old_process_is_not(self) -> None:
        """b's old process was lost in quorum 4; quorum 5 has b's restarted process."""
        plan = plan_step(quorum({"a": 3, "b": 0}, quorum_id=5), "a")
        assert not plan.lost_participant(Notice("member_lost", 4, "b"))

    def test_a_member_lost_before_any_quorum_of_another_incarnation_counts_as_a_participant(self) -> None:
        # After a lighthouse restart a reconnected member is in no quorum of its new session yet.
        plan = plan_step(quorum({"a": 3, "b": 3}, quorum_id=5, incarnation=9), "a")
        assert plan.lost_participant(Notice("member_lost", -1, "b", incarnation=10))

    def test_a_member_lost_before_any_quorum_of_the_plans_incarnation_is_not(self) -> None:
        """b was fenced while it started, before its first quorum; quorum 5 of the same
        lighthouse formed with b's next session."""
        plan = plan_step(quorum({"a": 3, "b": 3}, quorum_id=5, incarnation=9), "a")
        assert not plan.lost_participant(Notice("member_lost", -1, "b", incarnation=9))
