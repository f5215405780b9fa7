"""The commit rule: from the votes of a group's ranks and the lighthouse's fence, commit or not.

All ranks of a group commit or none: the group's manager server collects one vote per rank
and answers every rank with the same decision. A rank votes "ok" only if every collective of
its step succeeded, including the all-reduce of the cross-group "ok" flag, so where that
flag's collective succeeds every group decides alike.

The fence closes the remaining gap: a group that the lighthouse declared lost (hung, then
resumed; partitioned) must not commit the step it was in, even if its collectives later
complete, because the survivors have moved on without it. The manager asks the lighthouse
whether its quorum is still current; an unreachable lighthouse means "no" (safe: the step
is retried, and a group whose step falls behind heals at the next quorum).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Vote:
    group_rank: int
    step: int
    quorum_id: int
    ok: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CommitDecision:
    commit: bool
    reason: str


def check_votes(votes: Sequence[Vote], world_size: int) -> CommitDecision:
    """The group-local half of the rule: every rank present, agreeing on step and quorum, ok."""
    ranks = sorted(v.group_rank for v in votes)
    if ranks != list(range(world_size)):
        return CommitDecision(False, f"votes from ranks {ranks}, expected 0..{world_size - 1}")
    steps = {v.step for v in votes}
    quorums = {v.quorum_id for v in votes}
    if len(steps) > 1 or len(quorums) > 1:
        detail = ", ".join(f"rank {v.group_rank}: step {v.step} quorum {v.quorum_id}" for v in votes)
        return CommitDecision(False, f"ranks disagree on the step or quorum ({detail})")
    failed = [v for v in votes if not v.ok]
    if failed:
        detail = "; ".join(f"rank {v.group_rank}: {v.reason or 'not ok'}" for v in failed)
        return CommitDecision(False, f"{len(failed)} of {world_size} ranks voted no ({detail})")
    return CommitDecision(True, "every rank voted ok")


def decide_commit(local: CommitDecision, fence_ok: bool, fence_reason: str) -> CommitDecision:
    """Combine the group's verdict with the lighthouse fence (asked only when the group is ok)."""
    if not local.commit:
        return local
    if not fence_ok:
        return CommitDecision(False, f"fenced: {fence_reason}")
    return CommitDecision(True, "every rank voted ok and the quorum is current")
