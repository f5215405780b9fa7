"""A replica group's rounds (replicaft/group/rounds.py): pure, table-driven, no event loop."""

from __future__ import annotations

import pytest

from replicaft.group.protocol import GroupQuorumRequest, VoteRequest
from replicaft.group.rounds import GroupRounds


def ask(rank: int, step: int = 5, failures: int = 0) -> GroupQuorumRequest:
    return GroupQuorumRequest(rank, step, 10.0, failures, {"store": f"h:{rank}"})


def vote(rank: int, step: int = 5, ok: bool = True, leaving: bool = False) -> VoteRequest:
    return VoteRequest(rank, step, 3, ok, "" if ok else "allreduce failed", 10.0, leaving)


def test_quorum_round_completes_when_every_rank_asked_for_the_same_step() -> None:
    rounds = GroupRounds("g0", 3)
    first, second = rounds.join_quorum(ask(2, failures=1)), rounds.join_quorum(ask(0))
    assert not first.complete and not second.complete and first.round is second.round
    last = rounds.join_quorum(ask(1, failures=4))
    assert last.complete and last.round is first.round
    assert last.round.lighthouse_request(3) == (4, {"ranks": [{"store": "h:0"}, {"store": "h:1"}, {"store": "h:2"}]})
    assert not rounds.join_quorum(ask(0, step=6)).complete  # the next step opens a new round


def test_single_rank_group_completes_its_round_at_once() -> None:
    join = GroupRounds("g0", 1).join_quorum(ask(0))
    assert join.complete and join.refusal is None and not join.failed


def test_rank_asking_for_another_step_fails_the_open_round_naming_both_steps() -> None:
    rounds = GroupRounds("g0", 2)
    opened = rounds.join_quorum(ask(0, step=5))
    stray = rounds.join_quorum(ask(1, step=7))
    assert stray.round is None and stray.refusal is not None and stray.refusal.code == "mismatch"
    assert "rank 1 asked for a quorum at step 7 while ranks [0] asked at step 5" in stray.refusal.message
    assert stray.failed == ((opened.round, stray.refusal),)
    assert rounds.join_quorum(ask(0, step=7)).round is not opened.round  # a fresh round afterwards


@pytest.mark.parametrize("rank", [-1, 2, 7, 65535])
def test_rank_the_group_does_not_have_is_refused_without_touching_the_open_round_issue_19(rank: int) -> None:
    rounds = GroupRounds("g0", 2)
    opened = rounds.join_quorum(ask(0))
    stray = rounds.join_quorum(ask(rank))
    assert stray.refusal is not None and stray.refusal.code == "invalid" and not stray.failed
    assert f"rank {rank} asked for a quorum, but the group has 2 rank(s) (0..1)" in stray.refusal.message
    assert rounds.join_quorum(ask(1)).round is opened.round
    assert not rounds.join_vote(vote(rank)).decision.commit  # a stray vote is answered "no" at once
    assert rounds.watch(rank) is not None
    assert rounds.broken is None


def test_expired_round_names_the_ranks_that_never_asked() -> None:
    rounds = GroupRounds("g0", 4)
    r = rounds.join_quorum(ask(1)).round
    rounds.join_quorum(ask(3))
    refusal = rounds.quorum_expired(r)
    assert (
        refusal.code == "expired"
        and "ranks [0, 2] of group 'g0' never asked for the quorum of step 5" in refusal.message
    )
    assert rounds.join_quorum(ask(0)).round is not r


def test_expired_round_that_every_rank_joined_names_the_lighthouse_not_the_ranks() -> None:
    rounds = GroupRounds("g0", 2)
    r = rounds.join_quorum(ask(0)).round
    assert rounds.join_quorum(ask(1)).complete
    refusal = rounds.quorum_expired(r)
    assert refusal.code == "expired" and "ranks []" not in refusal.message
    assert "group 'g0' asked the lighthouse for the quorum of step 5 and had no answer" in refusal.message


def test_vote_round_decides_once_every_rank_voted_and_carries_a_leaving_rank() -> None:
    rounds = GroupRounds("g0", 2)
    first = rounds.join_vote(vote(1, leaving=True))
    last = rounds.join_vote(vote(0))
    assert not first.complete and last.complete and last.round is first.round and last.round.leaving
    assert rounds.decide_locally(last.round).commit


def test_a_rank_voting_no_makes_the_group_decide_no_with_its_reason() -> None:
    rounds = GroupRounds("g0", 2)
    rounds.join_vote(vote(0))
    r = rounds.join_vote(vote(1, ok=False)).round
    decision = rounds.decide_locally(r)
    assert not decision.commit and "rank 1: allreduce failed" in decision.reason


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (vote(0, step=6), "rank 0 voted for step 6 before ranks [0] finished step 5"),
        (vote(0), "rank 0 voted for step 5 before ranks [0] finished step 5"),
    ],
)
def test_a_vote_for_another_step_or_a_second_vote_supersedes_the_open_round(second: VoteRequest, why: str) -> None:
    rounds = GroupRounds("g0", 2)
    opened = rounds.join_vote(vote(0)).round
    join = rounds.join_vote(second)
    assert len(join.superseded) == 1 and join.superseded[0][0] is opened
    assert not join.superseded[0][1].commit and why in join.superseded[0][1].reason
    assert join.round is not opened


def test_watches_are_for_ranks_1_to_w_minus_1_once_each() -> None:
    rounds = GroupRounds("g0", 3)
    assert rounds.watch(1) is None and rounds.watch(2) is None
    assert "rank 0 hosts the group manager" in rounds.watch(0).message
    assert "rank 1 already has a notice stream" in rounds.watch(1).message
    assert rounds.broken is None


def test_a_closed_watch_breaks_the_group_once_and_every_later_call_is_refused() -> None:
    rounds = GroupRounds("g0", 2)
    rounds.watch(1)
    rounds.join_quorum(ask(0))
    broken = rounds.watch_closed(1)
    assert broken is not None and "rank 1 of group 'g0' is gone" in broken and rounds.broken == broken
    assert rounds.watch_closed(1) is None
    refused = rounds.join_quorum(ask(0))
    assert refused.refusal is not None and refused.refusal.code == "broken"
    decision = rounds.join_vote(vote(0)).decision
    assert decision is not None and not decision.commit and "is gone" in decision.reason
