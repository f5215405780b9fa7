"""The fence a group of one rank asks from its training thread (replicaft/group/fence.py).

Against a real lighthouse process: it must answer exactly as the loop's fence does (the
async client's), say "no" for a replica the lighthouse does not hold and for a quorum that
is not current, and never raise for I/O: a refused token, an unreachable lighthouse and a
closed fence all answer "no" with the reason.
"""

from __future__ import annotations

import re
import signal
import socket
import time
import urllib.request

from conftest import LighthouseProcess, start_lighthouse

from lighthouse.client.async_client import AsyncLighthouseClient
from lighthouse.rules.commit_lease import WITHIN_LEASE
from lighthouse.wire.fence import FenceResponse
from replicaft.group.fence import BlockingFence
from replicaft.process.threads import LoopThread

TOKEN = "fence-test-token"
TIMEOUT_S = 10.0


def _fence(
    address: str, replica_id: str = "g0", *, token: str | None = TOKEN, wait_for_ready: bool = True
) -> BlockingFence:
    return BlockingFence(
        replica_id, lambda: address, lambda quorum_id, step: False, token=token, tls=None, wait_for_ready=wait_for_ready
    )


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


def _step_lasts(seconds: float) -> None:
    """The caller's step takes ``seconds`` (what a member's lease is measured against)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


def _fences_answered(lighthouse: LighthouseProcess) -> float:
    assert lighthouse.status_url is not None
    with urllib.request.urlopen(lighthouse.status_url + "metrics", timeout=TIMEOUT_S) as response:
        metrics = response.read().decode()
    found = re.search(r"^replicaft_lighthouse_fences_answered_total ([\d.]+)$", metrics, re.M)
    assert found is not None, metrics
    return float(found.group(1))


def test_within_its_commit_lease_a_member_commits_without_asking_the_lighthouse() -> None:
    """lighthouse/rules/commit_lease.py: from its second quorum (a step interval known) a member holds a
    lease, the longest as its quorum stands (standing.py), covering the steps it stands for; within
    it both fences answer "yes" without a round trip, even with the lighthouse stopped; for a
    step past the standing, or once it ran out, they ask, and a stopped lighthouse cannot say
    "yes"."""
    lighthouse = start_lighthouse(
        "--min-replicas", "1", "--join-timeout", "0.1", "--max-commit-lease", "5", "--token", TOKEN
    )
    loop = LoopThread("fence-test")
    loop.start()
    client = AsyncLighthouseClient(lighthouse.grpc_address, "g0", token=TOKEN)
    fence = BlockingFence(
        "g0", lambda: lighthouse.grpc_address, client.commit_lease.covers, token=TOKEN, tls=None, wait_for_ready=True
    )
    stopped = False
    try:
        loop.call(client.start(), TIMEOUT_S)
        loop.call(client.quorum(0, TIMEOUT_S), TIMEOUT_S + 1)
        assert client.commit_lease.held is None  # no step interval yet: nothing asked for
        _step_lasts(0.5)
        asked = time.monotonic()
        quorum = loop.call(client.quorum(1, TIMEOUT_S), TIMEOUT_S + 1)
        lease = client.commit_lease.held
        last = 1 + quorum.standing_steps  # 5 s hold at most nine intervals of over 0.5 s: two for the lease
        assert 1 <= quorum.standing_steps <= 7
        assert lease is not None and (lease.quorum_id, lease.step, lease.last_step) == (quorum.quorum_id, 1, last)
        assert 5.0 <= lease.until - asked <= 5.5, lease  # standing: the longest lease, counted from the send
        assert fence.fence(quorum.quorum_id, 1, TIMEOUT_S) == FenceResponse(True, WITHIN_LEASE)
        assert _fences_answered(lighthouse) == 0  # nobody asked it
        assert fence.fence(quorum.quorum_id + 1, 1, TIMEOUT_S).ok is False  # another quorum: asked
        assert _fences_answered(lighthouse) == 1
        lighthouse.process.send_signal(signal.SIGSTOP)
        stopped = True
        assert fence.fence(quorum.quorum_id, 1, 0.2) == FenceResponse(True, WITHIN_LEASE)
        assert loop.call(client.fence(quorum.quorum_id, 1, 0.2), TIMEOUT_S) == FenceResponse(True, WITHIN_LEASE)
        assert fence.fence(quorum.quorum_id, last, 0.2) == FenceResponse(True, WITHIN_LEASE)
        other_step = fence.fence(quorum.quorum_id, last + 1, 0.2)
        assert not other_step.ok and "did not confirm" in other_step.reason, other_step
        deadline = time.monotonic() + TIMEOUT_S
        while client.commit_lease.covers(quorum.quorum_id, 1):
            assert time.monotonic() < deadline, "the lease never ran out"
            time.sleep(0.01)
        expired = fence.fence(quorum.quorum_id, 1, 0.2)
        assert not expired.ok and "did not confirm" in expired.reason, expired
    finally:
        if stopped:
            lighthouse.process.send_signal(signal.SIGCONT)
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
