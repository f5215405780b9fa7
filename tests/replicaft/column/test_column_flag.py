"""The column's "ok" flag over its mesh of real sockets (replicaft/column/flag.py): every rank
gets the same sum, step after step; a late hello of an old quorum is dropped; a peer that
sends a wrong step, a malformed flag or closes its connection fails the exchange at once, a
silent one at the abort signal or the deadline; a SIGKILLed column peer process fails the
column group's flag (replicaft/column/process_group.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch.distributed as dist
from conftest import REPO_ROOT, spawn_python
from support.flag_peers import DEADLINE_S, FakePeer, deadline, mesh_of, reduce_all

from replicaft.column.flag import MESSAGE, FlagError, FlagMesh
from replicaft.column.process_group import CollectiveError, ColumnSpec, FaultTolerantProcessGroup
from replicaft.step.commit import HOLD_FLAG
from replicaft.transfer.donors import host_port


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield master
    del master


def rank0_with_fake_peer(store: dist.Store) -> tuple[FlagMesh, FakePeer]:
    rank0 = FlagMesh("127.0.0.1")
    rank0.publish(store, 0)
    peer = FakePeer(store)
    rank0.connect(store, 7, 0, 2, deadline())
    peer.read_answer()
    return rank0, peer


def test_every_rank_gets_the_same_sum_step_after_step(store: dist.TCPStore) -> None:
    meshes = mesh_of(store, 3)
    assert reduce_all(meshes, [0.0, 0.0, 0.0], step=5) == [0.0] * 3
    assert reduce_all(meshes, [0.0, HOLD_FLAG, 1.0], step=6) == [1.0 + HOLD_FLAG] * 3
    assert reduce_all(meshes, [1.0, 1.0, HOLD_FLAG], step=7) == [2.0 + HOLD_FLAG] * 3
    for m in meshes:
        m.close()


def test_a_rank_reads_only_its_steps_message_the_next_waits_in_the_socket(store: dist.TCPStore) -> None:
    rank0, peer = rank0_with_fake_peer(store)
    peer.send(7, 1, 1.0)
    peer.send(7, 2, HOLD_FLAG)
    assert rank0.reduce(0.0, 1, deadline(), threading.Event()) == 1.0
    assert rank0.reduce(0.0, 2, deadline(), threading.Event()) == HOLD_FLAG
    rank0.close()


def test_a_late_hello_of_an_old_quorum_and_a_connection_without_one_are_dropped(store: dist.TCPStore) -> None:
    rank0 = FlagMesh("127.0.0.1")
    rank0.publish(store, 0)
    old = FakePeer(store, quorum_id=6)
    silent = socket.create_connection(host_port(rank0.address), timeout=DEADLINE_S)
    silent.close()
    wrong_rank = FakePeer(store, rank=5)
    peer = FakePeer(store)
    rank0.connect(store, 7, 0, 2, deadline())
    peer.send(7, 3, 0.0)
    assert rank0.reduce(0.0, 3, deadline(), threading.Event()) == 0.0
    for dropped in (old, wrong_rank):
        assert dropped.sock.recv(1) == b""  # closed by rank 0
    rank0.close()


@pytest.mark.parametrize(
    ("quorum", "step", "value", "error"),
    [
        (7, 4, 0.0, "sent quorum 7 step 4, expected quorum 7 step 3"),
        (6, 3, 0.0, "sent quorum 6 step 3, expected quorum 7 step 3"),
        (7, 3, 0.5, "sent 0.5, not one of"),
        (7, 3, float("nan"), "sent nan, not one of"),
    ],
)
def test_a_wrong_or_malformed_message_fails_the_exchange(
    store: dist.TCPStore, quorum: int, step: int, value: float, error: str
) -> None:
    rank0, peer = rank0_with_fake_peer(store)
    peer.send(quorum, step, value)
    with pytest.raises(FlagError, match=f"column rank 1 {error}"):
        rank0.reduce(0.0, 3, deadline(), threading.Event())
    rank0.close()


def test_a_peer_that_closes_mid_message_fails_the_exchange_at_once(store: dist.TCPStore) -> None:
    rank0, peer = rank0_with_fake_peer(store)
    peer.sock.sendall(MESSAGE.pack(7, 3, 0.0)[:10])
    peer.sock.close()
    started = time.monotonic()
    with pytest.raises(FlagError, match="column rank 1 closed its connection"):
        rank0.reduce(0.0, 3, deadline(), threading.Event())
    assert time.monotonic() - started < DEADLINE_S / 2
    rank0.close()


@pytest.mark.parametrize("ending", ["abort", "deadline"])
def test_a_silent_peer_ends_the_exchange_at_the_abort_or_the_deadline(store: dist.TCPStore, ending: str) -> None:
    rank0, peer = rank0_with_fake_peer(store)
    abort = threading.Event()
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 3 and ending == "abort":
            abort.set()

    ends = time.monotonic() + (DEADLINE_S if ending == "abort" else 0.1)
    expected = "abandoned: a member of the quorum was lost" if ending == "abort" else r"rank\(s\) \[1\] sent none"
    with pytest.raises(FlagError, match=expected):
        rank0.reduce(0.0, 3, ends, abort, tick)
    assert ticks >= (3 if ending == "abort" else 1)
    rank0.close()
    peer.sock.close()


def test_the_mesh_fails_at_its_deadline_when_a_peer_never_connects(store: dist.TCPStore) -> None:
    rank0 = FlagMesh("127.0.0.1")
    rank0.publish(store, 0)
    with pytest.raises(FlagError, match=r"ok-flag mesh of quorum 7: rank 0 connected to \[\] of 1 peers"):
        rank0.connect(store, 7, 0, 2, time.monotonic() + 0.2)
    rank0.close()


def test_a_sigkilled_column_peer_fails_the_column_groups_flag_at_once(store: dist.TCPStore) -> None:
    address = f"127.0.0.1:{store.port}"
    peer = spawn_python(
        str(REPO_ROOT / "tests" / "support" / "column_peer.py"),
        "--store",
        address,
        "--prefix",
        "flag-killed",
        name="column-peer",
    )
    rank0 = FaultTolerantProcessGroup("gloo", collective_timeout_s=DEADLINE_S, connect_timeout_s=DEADLINE_S)
    with ThreadPoolExecutor(1) as pool:
        configured = pool.submit(rank0.configure, ColumnSpec(address, "flag-killed", 0, 2, quorum_id=1))
        peer.wait_for_json(lambda o: o.get("event") == "joined", DEADLINE_S, what="the column's rendezvous")
        configured.result(timeout=DEADLINE_S)
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="column rank 1 (closed its connection|failed)"):
        rank0.reduce_flag(0.0, 0, started + DEADLINE_S, threading.Event(), peer.kill)
    assert time.monotonic() - started < DEADLINE_S / 2
    assert rank0.broken is not None and "ok flag of step 0" in rank0.broken
    with pytest.raises(CollectiveError, match="the column group is broken"):
        rank0.reduce_flag(0.0, 1, started + DEADLINE_S, threading.Event())
    rank0.shutdown()


@pytest.mark.parametrize("ending", ["abort", "deadline"])
def test_a_member_that_never_joins_ends_the_rendezvous_at_the_abort_or_the_deadline(
    store: dist.TCPStore, ending: str
) -> None:
    """A member that died after its quorum formed never publishes; Gloo's rendezvous could not
    be interrupted, so the wait before it is where a lost member's notice ends it."""
    address = f"127.0.0.1:{store.port}"
    rank0 = FaultTolerantProcessGroup(
        "gloo", collective_timeout_s=DEADLINE_S, connect_timeout_s=DEADLINE_S if ending == "abort" else 0.3
    )
    abort = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        configured = pool.submit(rank0.configure, ColumnSpec(address, "never-joins", 0, 2, quorum_id=3), abort)
        if ending == "abort":
            store.wait(["never-joins/flag/0"])  # rank 0 is waiting for rank 1 now
            abort.set()
        started = time.monotonic()
        why = "a member of the quorum was lost" if ending == "abort" else "the deadline passed"
        with pytest.raises(
            CollectiveError, match=rf"column rendezvous abandoned \({why}\): rank\(s\) \[1\] never published"
        ):
            configured.result(timeout=DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S / 2
    assert rank0.spec is None  # the next quorum configures afresh
    rank0.shutdown()


def test_a_member_that_finds_every_key_after_its_peer_gave_up_is_not_held_in_the_backends_rendezvous(
    store: dist.TCPStore,
) -> None:
    """The lighthouse declared rank 1 lost while it was frozen; rank 0's abort fired and it gave
    the rendezvous up. Rank 1, back, found rank 0's key published and entered Gloo's rendezvous,
    which nothing interrupts: it waited out the whole timeout (60 s in the Ray test of torchft's
    example) while the others trained on. Now it sees rank 0's mark and gives up at once."""
    address = f"127.0.0.1:{store.port}"
    store.set("gave-up/flag/0", "127.0.0.1:1")  # rank 0 published ...
    store.set("gave-up/abandoned", "0")  # ... and gave up (rendezvous.mark_abandoned)
    rank1 = FaultTolerantProcessGroup("gloo", collective_timeout_s=DEADLINE_S, connect_timeout_s=DEADLINE_S)
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="column rendezvous abandoned: rank 0 gave it up"):
        rank1.configure(ColumnSpec(address, "gave-up", 1, 2, quorum_id=5))
    assert time.monotonic() - started < DEADLINE_S / 2
    assert rank1.spec is None
    rank1.shutdown()


def test_a_member_that_gives_up_the_rendezvous_marks_it_for_the_others(store: dist.TCPStore) -> None:
    address = f"127.0.0.1:{store.port}"
    rank0 = FaultTolerantProcessGroup("gloo", collective_timeout_s=DEADLINE_S, connect_timeout_s=0.3)
    with pytest.raises(CollectiveError, match="the deadline passed"):
        rank0.configure(ColumnSpec(address, "marks", 0, 2, quorum_id=6))
    assert store.get("marks/abandoned") == b"0"
    rank0.shutdown()
