"""The commit rule (replicaft/commit.py): every rank of a group, agreeing, ok, and not fenced."""

from __future__ import annotations

import pytest

from replicaft.commit import CommitDecision, Vote, check_votes, decide_commit


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
            [ok(0, step=7), ok(1, step=8)], 2, False,
            ["disagree on the step or quorum", "rank 0: step 7 quorum 3", "rank 1: step 8 quorum 3"],
            id="steps_disagree",
        ),
        pytest.param(
            [ok(0, quorum_id=3), ok(1, quorum_id=4)], 2, False,
            ["disagree on the step or quorum", "rank 1: step 7 quorum 4"],
            id="quorums_disagree",
        ),
        pytest.param(
            [ok(0), no(1, "allreduce timed out")], 2, False,
            ["1 of 2 ranks voted no", "rank 1: allreduce timed out"],
            id="one_rank_no_with_reason",
        ),
        pytest.param([no(0), ok(1)], 2, False, ["1 of 2 ranks voted no", "rank 0: not ok"], id="one_rank_no_without_reason"),
        pytest.param(
            [no(0, "a"), no(1, "b")], 2, False, ["2 of 2 ranks voted no", "rank 0: a", "rank 1: b"],
            id="every_rank_no",
        ),
        pytest.param(
            [no(0, step=7), ok(1, step=8)], 2, False, ["disagree on the step or quorum"],
            id="disagreement_reported_before_no_votes",
        ),
    ],
)
def test_group_commits_only_when_every_rank_votes_ok_on_the_same_step(votes: list[Vote], world_size: int, commit: bool, reason_parts: list[str]) -> None:
    decision = check_votes(votes, world_size)
    assert decision.commit is commit
    for part in reason_parts:
        assert part in decision.reason


@pytest.mark.parametrize(
    ("local", "fence_ok", "fence_reason", "expected"),
    [
        pytest.param(
            CommitDecision(True, "every rank voted ok"), True, "",
            CommitDecision(True, "every rank voted ok and the quorum is current"),
            id="ok_and_current_commits",
        ),
        pytest.param(
            CommitDecision(True, "every rank voted ok"), False, "quorum 3 superseded by 4",
            CommitDecision(False, "fenced: quorum 3 superseded by 4"),
            id="ok_but_fenced_does_not_commit",
        ),
        pytest.param(
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"), True, "",
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"),
            id="local_no_wins_over_a_current_fence",
        ),
        pytest.param(
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"), False, "lighthouse unreachable",
            CommitDecision(False, "1 of 2 ranks voted no (rank 1: x)"),
            id="local_no_reason_kept_when_also_fenced",
        ),
    ],
)
def test_fenced_or_local_no_does_not_commit(local: CommitDecision, fence_ok: bool, fence_reason: str, expected: CommitDecision) -> None:
    assert decide_commit(local, fence_ok, fence_reason) == expected


def test_every_rank_gets_the_same_decision_whatever_the_vote_order() -> None:
    votes = [ok(0), no(1, "nan loss"), ok(2), ok(3)]
    decisions = {check_votes(order, 4) for order in (votes, votes[::-1], votes[1:] + votes[:1])}
    assert len({d.commit for d in decisions}) == 1
    assert not next(iter(decisions)).commit
