"""How a rank reaches its group's coordinator: in-process for rank 0, over gRPC for the others.

Both channels answer the same two calls, so the step driver does not know which it holds:

* ``ask_quorum`` returns at once with a future of the step's quorum: the request runs while
  forward does, without a thread of the driver's own (rank 0's future is the coordinator's
  loop's; a remote rank's is gRPC's);
* ``vote`` blocks for the group's decision on the step.

A remote rank also holds a notice stream (``watch``), through which the coordinator pushes the
lighthouse's notices (member lost, fenced) to it as fast as rank 0 gets them, and through which
it learns that this rank died: the stream closes, and the group is broken (rounds.py).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
import torch.distributed as dist

from lighthouse.config.options import TOKEN_METADATA_KEY
from lighthouse.tls.files import TlsFiles, grpc_channel, tls_refusal
from lighthouse.wire import envelope
from lighthouse.wire.protocol import Notice, Quorum
from replicaft.errors import GroupBroken, GroupError, StepMismatch
from replicaft.group import protocol as gp
from replicaft.group.coordinator import GroupCoordinator
from replicaft.group.fence import BlockingFence
from replicaft.group.server import CHANNEL_OPTIONS
from replicaft.process.threads import LoopThread
from replicaft.step.commit import Vote, check_votes, decide_commit

logger = logging.getLogger(__name__)

ADDRESS_KEY = "replicaft/group_manager_address"
TOKEN_KEY = "replicaft/group_manager_token"
RPC_GRACE_S = 2.0
"""A call's gRPC deadline outlasts the wait it asks the coordinator for, so the coordinator's
reason arrives before this side's timeout."""


@dataclass(frozen=True, slots=True)
class QuorumAnswer:
    quorum: Quorum
    latency_s: float
    """From asking to the answer: how long forming the quorum took, for this rank."""


class GroupChannel(Protocol):
    """A rank's line to its group's coordinator (the step driver holds one)."""

    def ask_quorum(
        self, step: int, timeout_s: float, *, commit_failures: int, rank_data: dict
    ) -> concurrent.futures.Future[QuorumAnswer]: ...

    def vote(
        self, step: int, quorum_id: int, ok: bool, reason: str, timeout_s: float, *, leaving: bool = False
    ) -> gp.VoteResponse: ...

    def close(self) -> None: ...


class LocalGroupChannel:
    """Group rank 0's channel: calls into the coordinator on its loop, no RPC.

    With ``fence`` (a group of one rank) the vote skips the loop: the one vote is the group's
    verdict, and the lighthouse's fence is asked from the calling thread (fence.py says why)."""

    def __init__(self, coordinator: GroupCoordinator, loop: LoopThread, fence: BlockingFence | None = None) -> None:
        self._coordinator = coordinator
        self._loop = loop
        self._fence = fence

    def ask_quorum(
        self, step: int, timeout_s: float, *, commit_failures: int, rank_data: dict
    ) -> concurrent.futures.Future[QuorumAnswer]:
        if self._fence is not None and (standing := self._coordinator.standing_answer(step, commit_failures)):
            answered: concurrent.futures.Future[QuorumAnswer] = concurrent.futures.Future()
            answered.set_result(QuorumAnswer(standing, 0.0))  # a group of one: nothing to gather
            return answered
        ask = gp.GroupQuorumRequest(0, step, timeout_s, commit_failures, rank_data)
        return self._loop.submit(self._timed(ask))

    async def _timed(self, ask: gp.GroupQuorumRequest) -> QuorumAnswer:
        asked_at = time.monotonic()
        quorum = await self._coordinator.quorum(ask)
        return QuorumAnswer(quorum, time.monotonic() - asked_at)

    def vote(
        self, step: int, quorum_id: int, ok: bool, reason: str, timeout_s: float, *, leaving: bool = False
    ) -> gp.VoteResponse:
        if self._fence is not None:
            return self._vote_alone(step, quorum_id, ok, reason, timeout_s, leaving)
        req = gp.VoteRequest(0, step, quorum_id, ok, reason, timeout_s, leaving)
        try:
            return self._loop.call(self._coordinator.vote(req), timeout_s + RPC_GRACE_S)
        except TimeoutError as e:
            raise GroupError(f"group vote: {e}") from None

    def _vote_alone(
        self, step: int, quorum_id: int, ok: bool, reason: str, timeout_s: float, leaving: bool
    ) -> gp.VoteResponse:
        """A group of one: the rule the coordinator applies to a full round, on this thread."""
        assert self._fence is not None
        decision = check_votes([Vote(0, step, quorum_id, ok, reason)], 1)
        if decision.commit:
            fence = self._fence.fence(quorum_id, step, timeout_s)
            decision = decide_commit(decision, fence.ok, fence.reason)
        return gp.VoteResponse(decision.commit, decision.reason, leaving)

    def close(self) -> None:
        """The fence's channel; the coordinator and its loop belong to the manager."""
        if self._fence is not None:
            self._fence.close()


class RemoteGroupChannel:
    """Group rank r > 0's channel: gRPC to rank 0's group server."""

    def __init__(self, address: str, group_rank: int, token: str, tls: TlsFiles | None = None) -> None:
        self.address = address
        self.group_rank = group_rank
        self._metadata = ((TOKEN_METADATA_KEY, token),)
        self._channel = grpc_channel(address, tls, CHANNEL_OPTIONS)
        self._wait_for_ready = tls is None
        """Over TLS a call fails fast: one that waits for a ready channel never hears of a
        failed handshake, only of its deadline (lighthouse/tls/files.py). Rank 0's server is up
        before its address is published, so nothing is lost by not waiting for it."""
        self._watch_thread: threading.Thread | None = None

    def close(self) -> None:
        self._channel.close()

    def ask_quorum(
        self, step: int, timeout_s: float, *, commit_failures: int, rank_data: dict
    ) -> concurrent.futures.Future[QuorumAnswer]:
        req = gp.GroupQuorumRequest(self.group_rank, step, timeout_s, commit_failures, rank_data)
        asked_at = time.monotonic()
        call = self._channel.unary_unary(gp.QUORUM_METHOD).future(
            envelope.encode(req),
            timeout=timeout_s + RPC_GRACE_S,
            metadata=self._metadata,
            wait_for_ready=self._wait_for_ready,
        )
        answer: concurrent.futures.Future[QuorumAnswer] = concurrent.futures.Future()

        def settle(done: grpc.Future) -> None:
            try:
                answer.set_result(QuorumAnswer(Quorum.decode(done.result()), time.monotonic() - asked_at))
            except grpc.RpcError as e:
                answer.set_exception(self._error(gp.QUORUM_METHOD, e))
            except Exception as e:
                answer.set_exception(e)

        call.add_done_callback(settle)
        return answer

    def vote(
        self, step: int, quorum_id: int, ok: bool, reason: str, timeout_s: float, *, leaving: bool = False
    ) -> gp.VoteResponse:
        req = gp.VoteRequest(self.group_rank, step, quorum_id, ok, reason, timeout_s, leaving)
        try:
            raw = self._channel.unary_unary(gp.VOTE_METHOD)(
                envelope.encode(req),
                timeout=timeout_s + RPC_GRACE_S,
                metadata=self._metadata,
                wait_for_ready=self._wait_for_ready,
            )
        except grpc.RpcError as e:
            raise self._error(gp.VOTE_METHOD, e) from None
        return gp.VoteResponse.decode(raw)

    def watch(self, on_notice: Callable[[Notice], None]) -> None:
        """Deliver the lighthouse's notices to ``on_notice`` from a background thread."""
        call = self._channel.unary_stream(gp.WATCH_METHOD)

        def pump() -> None:
            try:
                for raw in call(
                    envelope.encode(gp.WatchRequest(self.group_rank)),
                    metadata=self._metadata,
                    wait_for_ready=self._wait_for_ready,
                ):
                    on_notice(Notice.decode(raw))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED:
                    logger.warning("notice stream from the group manager at %s ended: %s", self.address, e.details())

        self._watch_thread = threading.Thread(target=pump, name="replicaft-group-watch", daemon=True)
        self._watch_thread.start()

    def _error(self, method: str, e: grpc.RpcError) -> GroupError:
        code, details = e.code(), e.details()
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return StepMismatch(details)
        if code == grpc.StatusCode.ABORTED:
            return GroupBroken(details)
        if code == grpc.StatusCode.UNAVAILABLE and (refused := tls_refusal(details, self.address)) is not None:
            return GroupError(f"group manager: {refused}")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return GroupError(f"group manager at {self.address}: {code.name}: {details}")
        return GroupError(f"group manager at {self.address} refused {method}: {code.name}: {details}")


def group_store(address: str, timeout_s: float) -> dist.TCPStore:
    """A client of the group's rendezvous store (torchrun's ``MASTER_ADDR:MASTER_PORT``)."""
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(
        host.strip("[]"),
        int(port),
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def publish_group_server(store: dist.TCPStore, address: str, token: str) -> None:
    """Rank 0: tell the group's other ranks where its server is and the secret it wants."""
    store.set(TOKEN_KEY, token)
    store.set(ADDRESS_KEY, address)


def find_group_server(store: dist.TCPStore) -> tuple[str, str]:
    """Ranks > 0: rank 0's server address and secret (blocks up to the store's timeout)."""
    address = store.get(ADDRESS_KEY).decode()
    return address, store.get(TOKEN_KEY).decode()


def group_secret(job_token: str | None) -> str:
    """The group server's secret: the job's token, else one made for this group alone."""
    return job_token if job_token else secrets.token_urlsafe(24)
