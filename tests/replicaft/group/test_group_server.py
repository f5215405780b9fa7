"""The group manager's server (replicaft/group/server.py) against a real lighthouse and real gRPC.

Regression tests for issue 19's "any local process can break a replica group": the server is
authenticated even when the job has no token (a secret per group), and a rank number the group
does not have is refused at once, without breaking the group.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from conftest import start_lighthouse

from lighthouse.config.options import TOKEN_METADATA_KEY
from lighthouse.wire import envelope
from lighthouse.wire.progress import Progress
from replicaft.config.options import ManagerOptions
from replicaft.group import protocol as gp
from replicaft.group.client import RemoteGroupChannel
from replicaft.group.coordinator import GroupCoordinator
from replicaft.group.server import GroupServer
from replicaft.process.threads import LoopThread

pytestmark = pytest.mark.slow
SECRET = "group-secret-for-the-test"


class Group:
    def __init__(self, coordinator: GroupCoordinator, address: str) -> None:
        self.coordinator = coordinator
        self.address = address
        self.channel = grpc.insecure_channel(address)

    def call(self, method: str, message: object, token: str | None = SECRET, timeout_s: float = 5.0) -> bytes:
        metadata = ((TOKEN_METADATA_KEY, token),) if token else ()
        return self.channel.unary_unary(method)(envelope.encode(message), timeout=timeout_s, metadata=metadata)

    def watch(self, rank: int, token: str | None = SECRET) -> grpc.Call:
        metadata = ((TOKEN_METADATA_KEY, token),) if token else ()
        return self.channel.unary_stream(gp.WATCH_METHOD)(envelope.encode(gp.WatchRequest(rank)), metadata=metadata)


@pytest.fixture
def group() -> Iterator[Group]:
    lighthouse = start_lighthouse(status=False)
    options = ManagerOptions(
        lighthouse=lighthouse.grpc_address, replica_id="g0", group_world_size=2, group_store="127.0.0.1:1"
    )
    loop = LoopThread("test-group")
    loop.start()
    coordinator = GroupCoordinator(options, Progress(), lambda notice: None)
    loop.call(coordinator.start(), 10.0)
    server = GroupServer(coordinator, loop, host="127.0.0.1", token=SECRET)
    try:
        yield Group(coordinator, server.start(10.0))
    finally:
        server.stop()
        loop.call(coordinator.stop(), 5.0)
        loop.stop()


def _wait_broken(coordinator: GroupCoordinator, timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while coordinator.rounds.broken is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return coordinator.rounds.broken


@pytest.mark.timeout(60)
def test_a_watch_without_the_secret_is_refused_and_breaks_nothing_issue_19(group: Group) -> None:
    stream = group.watch(1, token=None)
    with pytest.raises(grpc.RpcError) as refused:
        next(stream)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as wrong:
        next(group.watch(1, token="guessed"))
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert group.coordinator.rounds.broken is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank", [0, 2, 9])
def test_a_watch_for_a_rank_the_group_lacks_is_refused_and_breaks_nothing_issue_19(group: Group, rank: int) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        next(group.watch(rank))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert group.coordinator.rounds.broken is None


@pytest.mark.timeout(60)
def test_a_quorum_for_a_rank_the_group_lacks_is_refused_at_once_naming_the_width_issue_19(group: Group) -> None:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        group.call(gp.QUORUM_METHOD, gp.GroupQuorumRequest(7, 0, 30.0, 0, {}))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rank 7 asked for a quorum, but the group has 2 rank(s) (0..1)" in refused.value.details()
    assert time.monotonic() - started < 5.0  # an answer, not a timeout


@pytest.mark.timeout(60)
def test_the_real_rank_1_dropping_its_watch_breaks_the_group(group: Group) -> None:
    stream = group.watch(1)
    deadline = time.monotonic() + 10.0
    while 1 not in group.coordinator.rounds.watching and time.monotonic() < deadline:
        time.sleep(0.02)
    stream.cancel()
    broken = _wait_broken(group.coordinator, 10.0)
    assert broken is not None and "rank 1 of group 'g0' is gone" in broken
    vote = gp.VoteResponse.decode(group.call(gp.VOTE_METHOD, gp.VoteRequest(1, 0, 1, True, "", 5.0)))
    assert not vote.commit and "is gone" in vote.reason


@pytest.mark.timeout(60)
def test_a_rank_with_the_wrong_secret_gets_a_clear_error(group: Group) -> None:
    channel = RemoteGroupChannel(group.address, 1, "not-the-secret")
    try:
        future = channel.ask_quorum(0, 5.0, commit_failures=0, rank_data={})
        with pytest.raises(Exception, match="UNAUTHENTICATED"):
            future.result(10.0)
    finally:
        channel.close()
