"""The column group's waits over real Gloo groups: an all-reduce that spans several wait
slices completes; a lost member's notice, the deadline and a SIGKILLed peer each end the wait
with a CollectiveError and a broken group, never a hang (replicaft/column/process_group.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from conftest import REPO_ROOT, spawn_python

from replicaft.column.process_group import (
    WAIT_POLL_S,
    CollectiveError,
    ColumnSpec,
    FaultTolerantProcessGroup,
)

DEADLINE_S = 30.0


@pytest.fixture
def store() -> Iterator[str]:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield f"127.0.0.1:{master.port}"
    del master


def column() -> FaultTolerantProcessGroup:
    return FaultTolerantProcessGroup("gloo", collective_timeout_s=DEADLINE_S, connect_timeout_s=DEADLINE_S)


def two_ranks(store: str, prefix: str) -> tuple[FaultTolerantProcessGroup, FaultTolerantProcessGroup]:
    """Ranks 0 and 1 of one column in this process (the rendezvous needs both at once)."""
    groups = (column(), column())
    with ThreadPoolExecutor(2) as pool:
        for future in [
            pool.submit(g.configure, ColumnSpec(store, prefix, rank, 2, quorum_id=1)) for rank, g in enumerate(groups)
        ]:
            future.result(timeout=DEADLINE_S)
    return groups


def test_an_allreduce_that_outlasts_several_wait_slices_completes(store: str) -> None:
    rank0, rank1 = two_ranks(store, "slices")
    ticks = 0
    two_slices_passed = threading.Event()

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 2:
            two_slices_passed.set()

    def peer() -> float:
        assert two_slices_passed.wait(DEADLINE_S)
        tensor = torch.full((4,), 2.0)
        rank1.allreduce(tensor).wait(time.monotonic() + DEADLINE_S, threading.Event())
        return tensor[0].item()

    with ThreadPoolExecutor(1) as pool:
        peer_result = pool.submit(peer)
        tensor = torch.full((4,), 1.0)
        rank0.allreduce(tensor).wait(time.monotonic() + DEADLINE_S, threading.Event(), tick)
        assert peer_result.result(timeout=DEADLINE_S) == 3.0
    assert tensor.tolist() == [3.0] * 4
    assert ticks >= 2
    assert rank0.broken is None and rank1.broken is None
    rank0.shutdown()
    rank1.shutdown()


@pytest.mark.parametrize("ending", ["abort", "deadline"])
def test_a_wait_on_a_silent_peer_ends_at_the_abort_or_the_deadline(store: str, ending: str) -> None:
    rank0, rank1 = two_ranks(store, ending)
    abort = threading.Event()
    tensor = torch.ones(2)
    handle = rank0.allreduce(tensor, op="bucket allreduce")
    started = time.monotonic()
    deadline = started + (DEADLINE_S if ending == "abort" else 3 * WAIT_POLL_S)
    expected = (
        "abandoned: a member of the quorum was lost" if ending == "abort" else "did not complete within its deadline"
    )
    with pytest.raises(CollectiveError, match=f"bucket allreduce {expected}"):
        handle.wait(deadline, abort, abort.set if ending == "abort" else None)
    assert time.monotonic() - started < DEADLINE_S / 2
    assert rank0.broken is not None
    with pytest.raises(CollectiveError, match="the column group is broken"):
        rank0.allreduce(torch.ones(1))
    # The abandoned operation still owns its buffer: it completes once the peer joins it.
    peer_tensor = torch.full((2,), 5.0)
    rank1.allreduce(peer_tensor).wait(time.monotonic() + DEADLINE_S, threading.Event())
    assert peer_tensor.tolist() == [6.0, 6.0]
    rank0.shutdown()
    rank1.shutdown()


def test_a_sigkilled_peer_fails_the_wait_at_once(store: str) -> None:
    peer = spawn_python(
        str(REPO_ROOT / "tests" / "support" / "column_peer.py"),
        "--store",
        store,
        "--prefix",
        "killed",
        name="column-peer",
    )
    rank0 = column()
    with ThreadPoolExecutor(1) as pool:
        configured = pool.submit(rank0.configure, ColumnSpec(store, "killed", 0, 2, quorum_id=1))
        peer.wait_for_json(lambda o: o.get("event") == "joined", DEADLINE_S, what="the column's rendezvous")
        configured.result(timeout=DEADLINE_S)
    handle = rank0.allreduce(torch.ones(1 << 20), op="bucket allreduce")
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="bucket allreduce failed: .*(closed|reset)"):
        handle.wait(started + DEADLINE_S, threading.Event(), peer.kill)
    assert time.monotonic() - started < DEADLINE_S / 2
    assert rank0.broken is not None and "bucket allreduce failed" in rank0.broken
    rank0.shutdown()
