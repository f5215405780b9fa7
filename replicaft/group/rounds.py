"""A replica group's rounds: the W ranks' calls of one step turned into one request and one decision.

Every rank of a group asks for the step's quorum, and later votes on the step. Group rank 0
collects them (coordinator.py) and answers every rank alike:

* **Quorum round**: complete when every rank asked for the same step; the group then sends one
  quorum request carrying every rank's addresses. A rank that asks for another step while a
  round is open fails the round for every rank with an error naming both steps (never "last
  rank wins": ranks on different steps are a bug in the training script, or a rank that
  restarted alone).
* **Vote round**: complete when every rank voted on the same step; the local verdict is
  ``check_votes`` (commit.py), which the coordinator combines with the lighthouse's fence. A
  vote for another step, or a second vote from one rank, supersedes the open round, which
  answers "no" to the ranks that voted in it.
* **Watches**: ranks 1..W-1 each hold one notice stream. A stream that closes while the group
  runs means its rank is gone: the group is **broken** for good, every open round fails at
  once, and every later call is refused. So a rank number is checked against the group's
  width and each rank may watch once: a stray caller must not be able to break a group
  (issue 19).

Pure: no sockets, no event loop, no clock. Calls return what the caller must do (which rounds
to fail, whether to ask the lighthouse now); the caller owns the futures the ranks wait on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from replicaft.group.protocol import GroupQuorumRequest, VoteRequest
from replicaft.step.commit import CommitDecision, Vote, check_votes

RefusalCode = Literal["invalid", "mismatch", "broken", "expired"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a rank's call is answered with an error (``code`` maps to a gRPC status)."""

    code: RefusalCode
    message: str


@dataclass(eq=False)
class QuorumRound:
    step: int
    asks: dict[int, GroupQuorumRequest] = field(default_factory=dict)

    def lighthouse_request(self, world_size: int) -> tuple[int, dict[str, object]]:
        """(commit failures, data) of the group's one quorum request: the most failures any rank
        counted, and every rank's addresses in group-rank order."""
        failures = max(a.commit_failures for a in self.asks.values())
        return failures, {"ranks": [self.asks[r].rank_data for r in range(world_size)]}


@dataclass(eq=False)
class VoteRound:
    step: int
    votes: dict[int, Vote] = field(default_factory=dict)
    leaving: bool = False
    """Some rank was asked to stop (SIGTERM): every rank leaves after this step."""


@dataclass(frozen=True, slots=True)
class QuorumJoin:
    round: QuorumRound | None
    """The round the ask joined, whose answer the rank waits for (None when refused)."""
    refusal: Refusal | None = None
    complete: bool = False
    """This ask completed the round: ask the lighthouse now."""
    failed: tuple[tuple[QuorumRound, Refusal], ...] = ()
    """Rounds that fail because of this ask (ranks waiting in them get the refusal)."""


@dataclass(frozen=True, slots=True)
class VoteJoin:
    round: VoteRound | None
    """The round the vote joined (None: answered at once with ``decision``)."""
    decision: CommitDecision | None = None
    complete: bool = False
    """This vote completed the round: decide it now (``decide_locally``, then the fence)."""
    superseded: tuple[tuple[VoteRound, CommitDecision], ...] = ()


class GroupRounds:
    """The rounds of group ``replica_id`` (``world_size`` ranks). One owner thread or loop."""

    def __init__(self, replica_id: str, world_size: int) -> None:
        self.replica_id = replica_id
        self.world_size = world_size
        self.broken: str | None = None
        """Why the group cannot commit again (a rank's notice stream closed), once it happened."""
        self._quorum: QuorumRound | None = None
        self._vote: VoteRound | None = None
        self._watching: set[int] = set()

    @property
    def watching(self) -> frozenset[int]:
        """The ranks whose notice stream is open."""
        return frozenset(self._watching)

    def join_quorum(self, ask: GroupQuorumRequest) -> QuorumJoin:
        bad = self._rank_problem(ask.group_rank, "asked for a quorum")
        if bad is not None:
            return QuorumJoin(None, bad)
        if self.broken is not None:
            return QuorumJoin(None, Refusal("broken", self.broken))
        r = self._quorum
        if r is not None and r.step != ask.step:
            refusal = Refusal(
                "mismatch",
                f"group {self.replica_id!r}: rank {ask.group_rank} asked for a quorum at step {ask.step} while "
                f"ranks {sorted(r.asks)} asked at step {r.step}; every rank of a group must run the same step",
            )
            self._quorum = None
            return QuorumJoin(None, refusal, failed=((r, refusal),))
        if r is None:
            r = self._quorum = QuorumRound(ask.step)
        r.asks[ask.group_rank] = ask
        complete = len(r.asks) == self.world_size
        if complete:
            self._quorum = None
        return QuorumJoin(r, complete=complete)

    def quorum_expired(self, r: QuorumRound) -> Refusal:
        """A rank's wait for round ``r`` ran out: the ranks that never asked are named, or, when
        every rank asked, the lighthouse's missing answer (it blamed no rank as "ranks []")."""
        if self._quorum is r:
            self._quorum = None
        missing = sorted(set(range(self.world_size)) - set(r.asks))
        if not missing:
            return Refusal(
                "expired",
                f"group {self.replica_id!r} asked the lighthouse for the quorum of step {r.step} "
                "and had no answer by the deadline (too few groups asked: min_replicas, or the others "
                "left or ran ahead)",
            )
        return Refusal(
            "expired", f"ranks {missing} of group {self.replica_id!r} never asked for the quorum of step {r.step}"
        )

    def join_vote(self, req: VoteRequest) -> VoteJoin:
        bad = self._rank_problem(req.group_rank, "voted")
        if bad is not None:
            return VoteJoin(None, CommitDecision(False, bad.message))
        if self.broken is not None:
            return VoteJoin(None, CommitDecision(False, self.broken))
        superseded: tuple[tuple[VoteRound, CommitDecision], ...] = ()
        r = self._vote
        if r is None or r.step != req.step or req.group_rank in r.votes:
            if r is not None:
                superseded = (
                    (
                        r,
                        CommitDecision(
                            False,
                            f"rank {req.group_rank} voted for step {req.step} before "
                            f"ranks {sorted(r.votes)} finished step {r.step}",
                        ),
                    ),
                )
            r = self._vote = VoteRound(req.step)
        r.votes[req.group_rank] = Vote(req.group_rank, req.step, req.quorum_id, req.ok, req.reason)
        r.leaving |= req.leaving
        complete = len(r.votes) == self.world_size
        if complete:
            self._vote = None
        return VoteJoin(r, complete=complete, superseded=superseded)

    def vote_expired(self, r: VoteRound, timeout_s: float) -> CommitDecision:
        if self._vote is r:
            self._vote = None
        return CommitDecision(False, f"not every rank voted within {timeout_s:g}s")

    def decide_locally(self, r: VoteRound) -> CommitDecision:
        return check_votes(list(r.votes.values()), self.world_size)

    def watch(self, rank: int) -> Refusal | None:
        """Rank ``rank`` opens its notice stream; refused for a rank the group lacks, for rank 0
        (it is the coordinator's own), and for a second stream of one rank."""
        bad = self._rank_problem(rank, "opened a notice stream")
        if bad is not None:
            return bad
        if rank == 0:
            return Refusal(
                "invalid", f"group {self.replica_id!r}: rank 0 hosts the group manager and has no notice stream"
            )
        if rank in self._watching:
            return Refusal(
                "invalid",
                f"group {self.replica_id!r}: rank {rank} already has a notice stream; "
                "is a second process running with its RANK?",
            )
        self._watching.add(rank)
        return None

    def watch_closed(self, rank: int) -> str | None:
        """Rank ``rank``'s stream closed while the group runs: returns why the group is now
        broken (the caller fails every open round with it), or None if it already was."""
        self._watching.discard(rank)
        if self.broken is not None:
            return None
        self.broken = (
            f"rank {rank} of group {self.replica_id!r} is gone (its connection to the group manager "
            "closed); the group cannot commit again and must be restarted whole"
        )
        self._quorum = self._vote = None
        return self.broken

    def _rank_problem(self, rank: int, what: str) -> Refusal | None:
        if 0 <= rank < self.world_size:
            return None
        return Refusal(
            "invalid",
            f"group {self.replica_id!r}: rank {rank} {what}, but the group has "
            f"{self.world_size} rank(s) (0..{self.world_size - 1}); check RANK and WORLD_SIZE",
        )
