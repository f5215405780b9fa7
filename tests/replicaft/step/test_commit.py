"""The commit rule (replicaft/step/commit.py): every rank of a group, agreeing, ok, and not fenced."""

from __future__ import annotations

import pytest

from replicaft.step.commit import CommitDecision, Vote, check_votes, decide_commit


def ok(rank: int, step: int = 7, quorum_id: int = 3) -> Vote:
    return Vote(group_rank=rank, step=step, quorum_id=quorum_id, ok=True)


def no(rank: int, reason: str = "", step: int = 7, quorum_id: int = 3) -> Vote:
    return Vote(group_rank=rank, step=step, quorum_id=quorum_id, ok=False, reason=reason)


@pytest.mark.parametrize(
    ("votes", "world_size", "commit", "reason_parts"),
    [
        pytest.param([ok(0)], 1, True, ["every rank voted ok"], id="single_rank_ok"),
        pytest.param([ok(0), ok(1), ok(2)], 3, True, ["every rank voted ok"], id="all_ranks_ok"),
        pytest.param([ok(2), ok(0), ok(1)], 3, True, ["every rank voted ok"], id="any_vote_order"),
        pytest.param([ok(0), ok(1)], 3, False, ["votes from ranks [0, 1]", "expected 0..2"], id="rank_missing"),
        pytest.param([], 2, False, ["votes from ranks []", "expected 0..1"], id="no_votes"),
        pytest.param([ok(0), ok(0)], 2, False, ["votes from ranks [0, 0]"], id="duplicate_rank"),
        pytest.param([ok(0), ok(1), ok(2)], 2, False, ["votes from ranks [0, 1, 2]", "expected 0..1"], id="extra_rank"),
        pytest.param([ok(0), ok(5)], 2, False, ["votes from ranks [0, 5]"], id="rank_out_of_range"),
        pytest.param(
            [ok(0, step=7), ok(1, step=8)],
            2,
            False,
            ["disagree on the step or quorum", "rank 0: step 7 quorum 3", "rank 1: step 8 quorum 3"],
            id="steps_disagree",
        ),
        pytest.param(
            [ok(0, quorum_id=3), ok(1, quorum_id=4)],
            2,
            False,
            ["disagree on the step or quorum", "rank 1: step 7 quorum 4"],
            id="quorums_disagree",
        ),
        pytest.param(
            [ok(0), no(1, "allreduce timed out")],
            2,
            False,
            ["1 of 2 ranks voted no", "rank 1: allreduce timed out"],
            id="one_rank_no_with_reason",
        ),
        pytest.param(
            [no(0), ok(1)], 2, False, ["1 of 2 ranks voted no", "rank 0: not ok"], id="one_rank_no_without_reason"
        ),
        pytest.param(
            [no(0, "a"), no(1, "b")],
            2,
            False,
            ["2 of 2 ranks voted no", "rank 0: a", "rank 1: b"],
            id="every_rank_no",
        ),
        pytest.param(
            [no(0, step=7), ok(1, step=8)],
            2,
            False,
            ["disagree on the step or quorum"],
            id="disagreement_reported_before_no_votes",
        ),
    ],
)
def test_group_commits_only_when_every_rank_votes_ok_on_the_same_step(
    votes: list[Vote], world_size: int, commit: bool, reason_parts: list[str]
) -> None:
    decision = check_votes(votes, world_size)
    assert decision.commit is commit
    for part in reason_parts:
        assert part in decision.reason


@pytest.mark.parametrize(
    ("local", "fence_ok", "fence_reason", "expected"),
    [
        pytest.param(
            CommitDecision(True, "every rank voted ok"),
            True,
            "",
            CommitDecision(True, "every rank voted ok and the quorum is current"),
            id="ok_and_current_commits",
        ),
        pytest.param(
            CommitDecision(True, "every rank voted ok"),
            True,
            "within the commit lease",
            CommitDecision(True, "every rank voted ok and the quorum is current (within the commit lease)"),
            id="ok_within_the_commit_lease_says_so",
        ),
        pytest.param(
            CommitDecision(True, "every rank voted ok"),
            False,
            "quorum 3 superseded by 4",
            CommitDecision(False, "fenced: quorum 3 superseded by 4"),
            id="ok_but_fenced_does_not_commit",
        ),
        pytest.param(
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"),
            True,
            "",
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"),
            id="local_no_wins_over_a_current_fence",
        ),
        pytest.param(
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"),
            False,
            "lighthouse unreachable",
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"),
            id="local_no_reason_kept_when_also_fenced",
        ),
    ],
)
def test_fenced_or_local_no_does_not_commit(
    local: CommitDecision, fence_ok: bool, fence_reason: str, expected: CommitDecision
) -> None:
    assert decide_commit(local, fence_ok, fence_reason) == expected


def test_every_rank_gets_the_same_decision_whatever_the_vote_order() -> None:
    votes = [ok(0), no(1, "nan loss"), ok(2), ok(3)]
    decisions = {check_votes(order, 4) for order in (votes, votes[::-1], votes[1:] + votes[:1])}
    assert len({d.commit for d in decisions}) == 1
    assert not next(iter(decisions)).commit


# -- one rank's verdict, the "ok" flag, its vote and the step's outcome ------------------------

from replicaft.step.commit import (  # noqa: E402
    HOLD_FLAG,
    FlagReading,
    RankInputs,
    rank_verdict,
    rank_vote,
    read_flag,
    step_outcome,
)


def inputs(
    *,
    plan: bool = True,
    healing: bool = False,
    caught_up: bool = True,
    holding: bool = False,
    enough: bool = True,
    error: str | None = None,
) -> RankInputs:
    return RankInputs(
        has_plan=plan, healing=healing, caught_up=caught_up, holding=holding, enough_replicas=enough, error=error
    )


@pytest.mark.parametrize(
    ("case", "ok", "flag", "catching_up"),
    [
        pytest.param(inputs(), True, 0.0, False, id="donor_all_well"),
        pytest.param(inputs(error="allreduce failed"), False, 1.0, False, id="donor_failed_vetoes"),
        pytest.param(inputs(enough=False), False, 1.0, False, id="too_few_groups_vetoes"),
        pytest.param(inputs(plan=False, error="no quorum"), False, 1.0, False, id="no_plan"),
        pytest.param(inputs(healing=True), True, 0.0, False, id="healer_caught_up"),
        pytest.param(inputs(healing=True, caught_up=False), False, 0.0, True, id="healer_catching_up_never_vetoes"),
        pytest.param(
            inputs(healing=True, caught_up=False, error="heal failed"),
            False,
            0.0,
            False,
            id="healer_failed_still_never_vetoes_donors",
        ),
        pytest.param(
            inputs(healing=True, caught_up=False, holding=True), False, HOLD_FLAG, True, id="holding_healer_holds"
        ),
        pytest.param(inputs(healing=True, caught_up=True, holding=True), True, 0.0, False, id="held_fetch_arrived"),
    ],
)
def test_rank_verdict_table(case: RankInputs, ok: bool, flag: float, catching_up: bool) -> None:
    v = rank_verdict(case)
    assert (v.ok, v.flag, v.catching_up) == (ok, flag, catching_up)


@pytest.mark.parametrize(
    ("total", "reading"),
    [
        (0.0, FlagReading(True, False, 0)),
        (HOLD_FLAG, FlagReading(False, True, 0)),
        (3 * HOLD_FLAG, FlagReading(False, True, 0)),
        (1.0, FlagReading(False, False, 1)),
        (2.0 + HOLD_FLAG, FlagReading(False, False, 2)),
    ],
)
def test_read_flag_counts_failures_and_tells_holds_apart(total: float, reading: FlagReading) -> None:
    assert read_flag(total) == reading


def test_1023_holds_stay_below_one_failure() -> None:
    assert read_flag(1023 * HOLD_FLAG).held and not read_flag(1023 * HOLD_FLAG).failures


@pytest.mark.parametrize(
    ("case", "flag", "error", "ok", "reason"),
    [
        pytest.param(inputs(), read_flag(0.0), None, True, "", id="commit"),
        pytest.param(
            inputs(),
            read_flag(1.0),
            "1 participant rank(s) failed",
            False,
            "1 participant rank(s) failed",
            id="another_rank_failed",
        ),
        pytest.param(
            inputs(),
            read_flag(HOLD_FLAG),
            None,
            False,
            "held: a healer is receiving its base state",
            id="held_by_a_healer",
        ),
        pytest.param(inputs(enough=False), read_flag(1.0), None, False, "fewer groups than min_replicas", id="too_few"),
        pytest.param(
            inputs(healing=True, caught_up=False), read_flag(0.0), None, False, "catching up", id="catching_up"
        ),
        pytest.param(inputs(error="boom"), None, "boom", False, "boom", id="flag_not_reduced"),
    ],
)
def test_rank_vote_table(case: RankInputs, flag: FlagReading | None, error: str | None, ok: bool, reason: str) -> None:
    vote = rank_vote(case, rank_verdict(case), flag, error)
    assert (vote.ok, vote.reason) == (ok, reason)


@pytest.mark.parametrize(
    ("healing", "case", "flag", "commit", "apply_heal", "record", "failed"),
    [
        pytest.param(False, inputs(), read_flag(0.0), True, False, False, False, id="donor_commits"),
        pytest.param(False, inputs(), read_flag(1.0), False, False, False, True, id="donor_aborts_a_failure"),
        pytest.param(False, inputs(), read_flag(HOLD_FLAG), False, False, False, False, id="donor_held_is_no_failure"),
        pytest.param(False, inputs(), None, False, False, False, True, id="flag_lost_is_a_failure"),
        pytest.param(True, inputs(healing=True), read_flag(0.0), True, True, False, False, id="healer_applies"),
        pytest.param(
            True,
            inputs(healing=True, caught_up=False),
            read_flag(0.0),
            False,
            False,
            True,
            False,
            id="healer_records_while_fetching",
        ),
        pytest.param(
            True,
            inputs(healing=True),
            read_flag(0.0),
            False,
            False,
            True,
            True,
            id="caught_up_healer_records_a_step_its_group_did_not_commit",
        ),
        pytest.param(
            True,
            inputs(healing=True, caught_up=False, holding=True),
            read_flag(HOLD_FLAG),
            False,
            False,
            False,
            False,
            id="holding_healer_records_nothing",
        ),
        pytest.param(
            True,
            inputs(healing=True, caught_up=False),
            read_flag(1.0),
            False,
            False,
            False,
            True,
            id="healer_step_failed_elsewhere",
        ),
    ],
)
def test_step_outcome_table(
    healing: bool,
    case: RankInputs,
    flag: FlagReading | None,
    commit: bool,
    apply_heal: bool,
    record: bool,
    failed: bool,
) -> None:
    out = step_outcome(healing, rank_verdict(case), flag, commit)
    assert (out.commit, out.apply_heal, out.record, out.failed) == (commit, apply_heal, record, failed)
