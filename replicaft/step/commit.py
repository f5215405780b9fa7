"""The commit rule: from the votes of a group's ranks and the lighthouse's fence, commit or not.

All ranks of a group commit or none: the group's manager server collects one vote per rank
and answers every rank with the same decision. A rank votes "ok" only if every collective of
its step succeeded, including the exchange of the cross-group "ok" flag (replicaft/column/flag.py),
so where that exchange succeeds every group decides alike.

The fence closes the remaining gap: a group that the lighthouse declared lost (hung, then
resumed; partitioned) must not commit the step it was in, even if its collectives later
complete, because the survivors have moved on without it. The manager asks the lighthouse
whether its quorum is still current; an unreachable lighthouse means "no" (safe: the step
is retried, and a group whose step falls behind heals at the next quorum).

Before a rank votes, its own verdict (``rank_verdict``) and the column's "ok" flag decide what
it votes; after the vote, ``step_outcome`` says what the step driver does with the decision.
Both are pure functions over named inputs, so every case is a row of a table test.

Healers. A healer contributed zeros, so nothing it does taints anyone's update: it never
vetoes the donors' commit (its own vote says whether it commits, which it does only once its
heal arrived), unless its catch-up *holds* the donors until its fetch has arrived
(heal/catchup.py). A step a healer did not commit because it is still catching up, or one a
donor did not commit because a healer held it, is no failure: counted as one, it would make
the lighthouse form a new quorum id, and every group rebuild its process group, each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lighthouse.rules.plan import StepPlan


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
    return CommitDecision(
        True, "every rank voted ok and the quorum is current" + (f" ({fence_reason})" if fence_reason else "")
    )


HOLD_FLAG = 1.0 / 1024
"""A holding healer's share of the "ok" flag sum: exact in binary floating point and, for fewer than 1024
holding ranks, summing to less than one failure (``read_flag``)."""


@dataclass(frozen=True, slots=True)
class RankInputs:
    """What one rank knows at the end of its step, before the "ok" flag is reduced."""

    has_plan: bool
    """The step's quorum formed (False: it failed, or the step never got a plan)."""
    healing: bool
    caught_up: bool
    """A healer's fetch arrived, verified, and leads to the donors' step (True for a donor)."""
    holding: bool
    """A healer's catch-up holds the donors until its fetch has arrived."""
    enough_replicas: bool
    """At least ``min_replicas`` groups took part."""
    error: str | None
    """Why this rank's step failed (a collective, the quorum, a heal), if it did."""

    @classmethod
    def of(
        cls, plan: StepPlan | None, *, caught_up: bool, holding: bool, min_replicas: int, error: Exception | None
    ) -> RankInputs:
        healing = plan is not None and plan.healing
        return cls(
            has_plan=plan is not None,
            healing=healing,
            caught_up=caught_up or not healing,
            holding=holding,
            enough_replicas=plan is not None and plan.num_replicas >= min_replicas,
            error=None if error is None else str(error),
        )


@dataclass(frozen=True, slots=True)
class RankVerdict:
    ok: bool
    """This rank may commit, as far as it alone knows."""
    flag: float
    """What it adds to the column's "ok" flag: 0 (no objection), ``HOLD_FLAG`` (a healer holding
    the donors) or 1 (its step failed)."""
    catching_up: bool
    """A healer whose fetch has not arrived yet (and nothing failed)."""


def rank_verdict(i: RankInputs) -> RankVerdict:
    ok = i.error is None and i.has_plan and i.enough_replicas and i.caught_up
    catching_up = i.has_plan and i.healing and not i.caught_up and i.error is None
    hold = catching_up and i.holding
    no_objection = ok or (i.healing and not hold)
    return RankVerdict(ok, 0.0 if no_objection else HOLD_FLAG if hold else 1.0, catching_up)


@dataclass(frozen=True, slots=True)
class FlagReading:
    ok: bool
    """No rank of the column objected."""
    held: bool
    """Some healer holds the donors (and no rank failed)."""
    failures: int


def read_flag(total: float) -> FlagReading:
    """The column's reduced "ok" flag: a sum of 1 or more counts failed ranks, a sum strictly
    between 0 and 1 is holds only."""
    if total >= 1.0:
        return FlagReading(False, False, int(total))
    return FlagReading(total == 0.0, total > 0.0, 0)


@dataclass(frozen=True, slots=True)
class RankVote:
    ok: bool
    reason: str


def rank_vote(i: RankInputs, v: RankVerdict, flag: FlagReading | None, error: str | None) -> RankVote:
    """What this rank votes, given the flag (None: not reduced, as without a plan or a usable
    column) and its error after the reduction (which a failed reduction sets)."""
    ok = v.ok and (flag is None or flag.ok) and error is None
    if ok:
        return RankVote(True, "")
    if error is not None:
        return RankVote(False, error)
    if not i.caught_up:
        return RankVote(False, "catching up")
    if flag is not None and flag.held:
        return RankVote(False, "held: a healer is receiving its base state")
    return RankVote(False, "fewer groups than min_replicas")


@dataclass(frozen=True, slots=True)
class StepOutcome:
    commit: bool
    apply_heal: bool
    """A healer applies its heal: base state, then the recorded steps."""
    record: bool
    """A healer whose fetch is still running keeps what this step did, to replay it."""
    failed: bool
    """Counts as a failed commit (reported with the next quorum request)."""


def step_outcome(healing: bool, v: RankVerdict, flag: FlagReading | None, commit: bool) -> StepOutcome:
    """What to do with the group's decision. A healer records a step only if the flag went
    through (the donors took it): recorded after the vote, so that a rank whose own fetch is
    done still records a step its group could not commit (another rank was not ready), and
    every rank's records stay in line with the group's step."""
    flag_ok = flag is not None and flag.ok
    expected = (flag is not None and flag.held) or (v.catching_up and flag_ok)
    return StepOutcome(
        commit=commit,
        apply_heal=commit and healing,
        record=healing and flag_ok and not commit,
        failed=not commit and not expected,
    )
