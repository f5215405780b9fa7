"""The fence a group of one rank asks from its training thread (replicaft/group/fence.py).

Against a real lighthouse process: it must answer exactly as the loop's fence does (the
async client's), say "no" for a replica the lighthouse does not hold and for a quorum that
is not current, and never raise for I/O: a refused token, an unreachable lighthouse and a
closed fence all answer "no" with the reason.
"""

from __future__ import annotations

import socket
import time

from conftest import start_lighthouse

from lighthouse.client import AsyncLighthouseClient
from replicaft.group.fence import BlockingFence
from replicaft.threads import LoopThread

TOKEN = "fence-test-token"
TIMEOUT_S = 10.0


def _fence(address: str, replica_id: str = "g0", *, token: str | None = TOKEN, wait_for_ready: bool = True) -> BlockingFence:
    return BlockingFence(replica_id, lambda: address, token=token, tls=None, wait_for_ready=wait_for_ready)


def test_member_of_the_current_quorum_may_commit_and_agrees_with_the_loops_fence() -> None:
    lighthouse = start_lighthouse("--min-replicas", "1", "--join-timeout", "0.1", "--token", TOKEN, status=False)
    loop = LoopThread("fence-test")
    loop.start()
    client = AsyncLighthouseClient(lighthouse.grpc_address, "g0", token=TOKEN)
    fence = _fence(lighthouse.grpc_address)
    try:
        loop.call(client.start(), TIMEOUT_S)
        quorum = loop.call(client.quorum(0, TIMEOUT_S), TIMEOUT_S + 1)
        ours = fence.fence(quorum.quorum_id, 0, TIMEOUT_S)
        theirs = loop.call(client.fence(quorum.quorum_id, 0, TIMEOUT_S), TIMEOUT_S + 1)
        assert ours == theirs and ours.ok, (ours, theirs)
        stale = fence.fence(quorum.quorum_id + 1, 0, TIMEOUT_S)
        assert stale == loop.call(client.fence(quorum.quorum_id + 1, 0, TIMEOUT_S), TIMEOUT_S + 1)
        assert not stale.ok and "not current" in stale.reason, stale
    finally:
        fence.close()
        loop.call(client.close(), TIMEOUT_S)
        loop.stop()


def test_replica_without_a_session_is_told_no_because_declared_lost() -> None:
    lighthouse = start_lighthouse("--token", TOKEN, status=False)
    fence = _fence(lighthouse.grpc_address, "ghost")
    try:
        answer = fence.fence(1, 0, TIMEOUT_S)
    finally:
        fence.close()
    assert not answer.ok and "'ghost'" in answer.reason and "declared lost" in answer.reason, answer


def test_wrong_token_answers_no_naming_the_refusal_instead_of_raising() -> None:
    lighthouse = start_lighthouse("--token", TOKEN, status=False)
    fence = _fence(lighthouse.grpc_address, token="wrong")
    try:
        answer = fence.fence(1, 0, TIMEOUT_S)
    finally:
        fence.close()
    assert not answer.ok and answer.reason.startswith("lighthouse did not confirm the quorum"), answer


def test_unreachable_lighthouse_answers_no_within_the_timeout() -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    fence = _fence(address, wait_for_ready=False)
    started = time.monotonic()
    try:
        answer = fence.fence(1, 0, 2.0)
    finally:
        fence.close()
    assert time.monotonic() - started < 2.0 + 1.0
    assert not answer.ok and "lighthouse did not confirm the quorum" in answer.reason, answer


def test_closed_fence_answers_no() -> None:
    fence = _fence("127.0.0.1:1")
    fence.close()
    fence.close()
    answer = fence.fence(1, 0, 1.0)
    assert not answer.ok and "shutting down" in answer.reason, answer
