"""Group rank 0's side of its replica group: the one lighthouse session, the rounds, the notices.

Runs on an event loop of its own (``LoopThread``), so a training thread holding the GIL in a
long C++ call delays it but never stops it from answering the lighthouse, and all its state is
touched on that one loop. Rank 0 reaches it in-process (client.py, ``LocalGroupChannel``):
a group of one rank, the common case, makes no RPC to itself, and votes without coming here
at all (fence.py). Ranks 1..W-1 reach it through
the gRPC server (server.py), which only decodes, authenticates and calls in here.

The rules of the rounds live in rounds.py; this file waits for them: each rank's call waits
for its round's answer, under the deadline the rank gave.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from lighthouse.client.async_client import AsyncLighthouseClient
from lighthouse.rules.standing import StandingQuorum
from lighthouse.wire.progress import Progress
from lighthouse.wire.protocol import Notice, Quorum
from replicaft.config.options import ManagerOptions
from replicaft.errors import GroupBroken, GroupError, StepMismatch
from replicaft.group.protocol import GroupQuorumRequest, VoteRequest, VoteResponse
from replicaft.group.rounds import GroupRounds, QuorumRound, Refusal, VoteRound
from replicaft.step.commit import CommitDecision, decide_commit

logger = logging.getLogger(__name__)

QUORUM_GRACE_S = 1.0
"""A rank's wait for its quorum round outlasts the quorum's own deadline by this much (or by
the deadline itself, when shorter: a caller's 10 ms deadline is not stretched to a second), so
the lighthouse's reason for a failed quorum reaches the rank before this side's timeout."""


class GroupRefused(GroupError):
    """A rank's call was refused by the group's rounds (``refusal.code`` says why)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def refusal_error(refusal: Refusal) -> GroupError:
    """The error a rank's call raises for a refusal."""
    if refusal.code == "mismatch":
        return StepMismatch(refusal.message)
    if refusal.code == "broken":
        return GroupBroken(refusal.message)
    return GroupRefused(refusal)


class GroupCoordinator:
    """Build with options; ``start()`` on the loop opens the lighthouse session."""

    def __init__(self, options: ManagerOptions, progress: Progress, on_notice: Callable[[Notice], None]) -> None:
        self.options = options
        self.rounds = GroupRounds(options.replica_id, options.group_world_size)
        self._progress = progress
        self._on_notice = on_notice
        self.lighthouse: AsyncLighthouseClient | None = None
        self._quorum_answers: dict[QuorumRound, asyncio.Future[Quorum]] = {}
        self._vote_answers: dict[VoteRound, asyncio.Future[CommitDecision]] = {}
        self._watchers: dict[int, asyncio.Queue[Notice | None]] = {}
        self._standing: StandingQuorum | None = None
        """The quorum answering the next rounds without asking the lighthouse (standing.py)."""
        self._standing_lock = threading.Lock()
        """A group of one rank takes its standing answers on the training thread."""
        self._stopping = False

    async def start(self) -> None:
        o = self.options
        self.lighthouse = AsyncLighthouseClient(
            o.lighthouse,
            o.replica_id,
            world_size=o.group_world_size,
            token=o.token,
            tls=o.tls(),
            heartbeat_interval_s=o.heartbeat_interval_s,
            on_notice=self._notice,
            progress=self._progress,
        )
        await self.lighthouse.start()

    async def stop(self) -> None:
        self._stopping = True
        for outbox in self._watchers.values():
            outbox.put_nowait(None)
        if self.lighthouse is not None:
            await self.lighthouse.close()

    # -- quorum --------------------------------------------------------------------------------

    async def quorum(self, ask: GroupQuorumRequest) -> Quorum:
        """The step's quorum, once every rank asked; raises GroupError (or a LighthouseError)."""
        join = self.rounds.join_quorum(ask)
        for r, refusal in join.failed:
            self._settle(self._quorum_answers.pop(r, None), exception=refusal_error(refusal))
        if join.round is None:
            assert join.refusal is not None
            raise refusal_error(join.refusal)
        answer = self._quorum_answers.setdefault(join.round, _answer_future())
        if join.complete:
            if (standing := self._standing_answer(join.round)) is None:
                asyncio.create_task(self._ask_lighthouse(join.round, answer, ask.timeout_s))
            else:
                self._quorum_answers.pop(join.round, None)
                self._settle(answer, result=standing)
                return standing
        try:
            return await asyncio.wait_for(asyncio.shield(answer), ask.timeout_s + min(QUORUM_GRACE_S, ask.timeout_s))
        except TimeoutError:
            raise refusal_error(self.rounds.quorum_expired(join.round)) from None

    def _standing_answer(self, r: QuorumRound) -> Quorum | None:
        failures, _ = r.lighthouse_request(self.options.group_world_size)
        return self.standing_answer(r.step, failures)

    def standing_answer(self, step: int, commit_failures: int) -> Quorum | None:
        """The quorum of ``step`` from the standing one, if it covers the step (standing.py);
        else the standing ends and the lighthouse must be asked. The loop's, or for a group of
        one rank the training thread's (client.py): a notice that ends the standing meanwhile
        reaches the step's plan too (notices.py), and aborts it."""
        with self._standing_lock:
            standing, self._standing = self._standing, None
            if standing is None:
                return None
            quorum = standing.answer(step, commit_failures)
            if quorum is not None:
                self._standing = standing
            return quorum

    async def _ask_lighthouse(self, r: QuorumRound, answer: asyncio.Future[Quorum], timeout_s: float) -> None:
        assert self.lighthouse is not None
        failures, data = r.lighthouse_request(self.options.group_world_size)
        try:
            quorum = await self.lighthouse.quorum(r.step, timeout_s, commit_failures=failures, data=data)
            with self._standing_lock:
                self._standing = StandingQuorum.granted(quorum, r.step)
            self._settle(answer, result=quorum)
        except Exception as e:
            self._settle(answer, exception=e)
        finally:
            self._quorum_answers.pop(r, None)

    # -- vote ----------------------------------------------------------------------------------

    async def vote(self, req: VoteRequest) -> VoteResponse:
        """The group's decision on the step, once every rank voted (never raises for I/O)."""
        join = self.rounds.join_vote(req)
        for r, decision in join.superseded:
            self._settle(self._vote_answers.pop(r, None), result=decision)
        if join.round is None:
            assert join.decision is not None
            return VoteResponse(False, join.decision.reason)
        r = join.round
        answer = self._vote_answers.setdefault(r, _answer_future())
        if join.complete:
            asyncio.create_task(self._decide(r, answer, req.timeout_s))
        try:
            decision = await asyncio.wait_for(asyncio.shield(answer), req.timeout_s)
        except TimeoutError:
            decision = self.rounds.vote_expired(r, req.timeout_s)
        return VoteResponse(decision.commit, decision.reason, r.leaving)

    async def _decide(self, r: VoteRound, answer: asyncio.Future[CommitDecision], timeout_s: float) -> None:
        assert self.lighthouse is not None
        try:
            local = self.rounds.decide_locally(r)
            if local.commit:
                vote = next(iter(r.votes.values()))
                fence = await self.lighthouse.fence(vote.quorum_id, vote.step, timeout_s)
                local = decide_commit(local, fence.ok, fence.reason)
            self._settle(answer, result=local)
        finally:
            self._vote_answers.pop(r, None)

    # -- notices -------------------------------------------------------------------------------

    def open_watch(self, rank: int) -> asyncio.Queue[Notice | None]:
        """Rank ``rank``'s notice stream: the queue the server drains; raises GroupError if refused."""
        refusal = self.rounds.watch(rank)
        if refusal is not None:
            raise refusal_error(refusal)
        outbox: asyncio.Queue[Notice | None] = asyncio.Queue()
        self._watchers[rank] = outbox
        return outbox

    def close_watch(self, rank: int) -> None:
        """Rank ``rank``'s stream ended: unless the group is stopping, the rank is gone."""
        self._watchers.pop(rank, None)
        if self._stopping:
            return
        broken = self.rounds.watch_closed(rank)
        if broken is None:
            return
        logger.warning("[%s] %s", self.options.replica_id, broken)
        for answer in self._quorum_answers.values():
            self._settle(answer, exception=GroupBroken(broken))
        for vote_answer in self._vote_answers.values():
            self._settle(vote_answer, result=CommitDecision(False, broken))

    def _notice(self, notice: Notice) -> None:
        if notice.kind != "quorum_formed":
            with self._standing_lock:
                self._standing = None  # a member lost, left or asking again; or a new session
        self._on_notice(notice)
        for outbox in self._watchers.values():
            outbox.put_nowait(notice)

    @staticmethod
    def _settle(
        answer: asyncio.Future | None, *, result: object = None, exception: BaseException | None = None
    ) -> None:
        if answer is None or answer.done():
            return
        if exception is not None:
            answer.set_exception(exception)
        else:
            answer.set_result(result)


def _answer_future() -> asyncio.Future:
    """A future the ranks of a round wait on. Its exception is marked retrieved, because a
    round can fail after every rank waiting on it gave up (asyncio would log it as lost)."""
    future = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future
