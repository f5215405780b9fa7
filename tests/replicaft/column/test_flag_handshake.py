"""The flag mesh's handshake (replicaft/column/flag_handshake.py) over real sockets: a hello without
the job's token is refused and cannot speak for a peer, in either direction (issue 37, bug 2);
under TLS the mesh is mutual TLS, and a plaintext peer or another CA's is refused; connections
that never say hello cost the mesh nothing, however many (issue 37, bug 3)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch.distributed as dist
from support.flag_peers import DEADLINE_S, FakePeer, connect_all, deadline, meshes_of, reduce_all
from support.socket_waits import read_until_closed

from lighthouse.tls.throwaway_ca import make_throwaway_ca
from replicaft.column import flag_handshake
from replicaft.column.flag import FlagError, FlagMesh
from replicaft.column.flag_handshake import HELLO, MAGIC, MAX_PENDING, hello_mac
from replicaft.transfer.donors import host_port

TOKEN = "the-job's-token"
OBJECTION, NO_OBJECTION = 1.0, 0.0


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield master
    del master


def test_a_stranger_without_the_token_cannot_replace_a_peers_objection_issue_37(store: dist.TCPStore) -> None:
    """The stranger says hello as rank 1 before rank 1 does (the quorum id is on the status page)."""
    rank0, rank1 = meshes_of(2, token=TOKEN)
    rank0.publish(store, 0)
    stranger = FakePeer(store, quorum_id=7, rank=1, token="a guess")
    connect_all(store, [rank0, rank1])
    stranger.send(7, 3, NO_OBJECTION)
    assert reduce_all([rank0, rank1], [NO_OBJECTION, OBJECTION], step=3) == [OBJECTION, OBJECTION]
    assert read_until_closed(stranger.sock, deadline()) == b""  # refused, never answered
    for mesh in (rank0, rank1):
        mesh.close()


def test_a_listener_planted_in_the_store_cannot_answer_for_a_peer(store: dist.TCPStore) -> None:
    planted = socket.create_server(("127.0.0.1", 0))
    store.set("flag/0", f"127.0.0.1:{planted.getsockname()[1]}")
    rank1 = FlagMesh("127.0.0.1", token=TOKEN)
    with ThreadPoolExecutor(1) as pool:
        connecting = pool.submit(rank1.connect, store, 7, 1, 2, deadline())
        planted.settimeout(DEADLINE_S)
        conn, _ = planted.accept()
        conn.settimeout(DEADLINE_S)
        assert len(conn.recv(HELLO.size)) > 0
        conn.sendall(HELLO.pack(MAGIC, 7, 0, hello_mac("a guess", 7, 0, 1, True)))
        with pytest.raises(FlagError, match=r"rank 0 at 127.0.0.1: a hello from rank 0 without the job's token"):
            connecting.result(timeout=DEADLINE_S)
    conn.close()
    planted.close()
    rank1.close()


def test_a_hello_replayed_in_the_other_direction_is_refused(store: dist.TCPStore) -> None:
    """The MAC binds the direction: rank 0's answer to rank 1, sent back to it as a hello, is no hello."""
    rank0 = FlagMesh("127.0.0.1", token=TOKEN)
    rank0.publish(store, 0)
    replay = socket.create_connection(host_port(rank0.address), timeout=DEADLINE_S)
    replay.sendall(HELLO.pack(MAGIC, 7, 1, hello_mac(TOKEN, 7, 0, 1, True)))
    with pytest.raises(FlagError, match=r"connected to \[\] of 1 peers"):
        rank0.connect(store, 7, 0, 2, time.monotonic() + 1.0)
    assert read_until_closed(replay, deadline()) == b""
    rank0.close()


def test_under_tls_the_mesh_sums_and_plaintext_or_another_cas_peer_is_refused(
    store: dist.TCPStore, tmp_path: Path
) -> None:
    job = make_throwaway_ca(tmp_path / "job")
    other = make_throwaway_ca(tmp_path / "other", name="another job")
    rank0, rank1, rank2 = meshes_of(3, token=TOKEN, tls=job)
    rank0.publish(store, 0)
    plaintext = FakePeer(store, token=TOKEN)  # the right token, in the clear
    foreign = FlagMesh("127.0.0.1", token=TOKEN, tls=other)
    with ThreadPoolExecutor(1) as pool:
        refused = pool.submit(foreign.connect, store, 7, 1, 2, deadline())
        connect_all(store, [rank0, rank1, rank2])
        with pytest.raises(FlagError, match="TLS handshake failed"):
            refused.result(timeout=DEADLINE_S)
    assert read_until_closed(plaintext.sock, deadline()) == b""
    assert reduce_all([rank0, rank1, rank2], [NO_OBJECTION, OBJECTION, NO_OBJECTION], step=4) == [OBJECTION] * 3
    assert reduce_all([rank0, rank1, rank2], [NO_OBJECTION] * 3, step=5) == [NO_OBJECTION] * 3
    for mesh in (rank0, rank1, rank2, foreign):
        mesh.close()


def test_silent_connections_cost_the_mesh_nothing_issue_37(store: dist.TCPStore) -> None:
    """More connections than MAX_PENDING say nothing (one a part of a hello) before the real
    peers connect: the mesh forms in a small part of its connect timeout, where it used to
    wait the whole timeout on the first one and then fail."""
    rank0, rank1, rank2 = meshes_of(3, token=TOKEN)
    rank0.publish(store, 0)
    silent = [socket.create_connection(host_port(rank0.address), timeout=DEADLINE_S) for _ in range(MAX_PENDING + 8)]
    silent[0].sendall(HELLO.pack(MAGIC, 7, 1, hello_mac(TOKEN, 7, 1, 0, False))[:20])
    started = time.monotonic()
    connect_all(store, [rank0, rank1, rank2])
    assert time.monotonic() - started < DEADLINE_S / 3
    assert reduce_all([rank0, rank1, rank2], [NO_OBJECTION, NO_OBJECTION, OBJECTION], step=1) == [OBJECTION] * 3
    for sock in silent:  # every one accepted, then closed once the mesh was whole
        assert read_until_closed(sock, deadline()) == b""
    for mesh in (rank0, rank1, rank2):
        mesh.close()


def test_a_connection_that_never_says_hello_is_closed_at_the_hello_deadline(
    store: dist.TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flag_handshake, "HELLO_TIMEOUT_S", 0.2)
    rank0, rank1 = meshes_of(2, token=TOKEN)
    rank0.publish(store, 0)
    errors: list[BaseException] = []
    waiting = threading.Thread(target=lambda: _connect_or_record(rank0, store, errors))
    waiting.start()
    silent = socket.create_connection(host_port(rank0.address), timeout=DEADLINE_S)
    assert read_until_closed(silent, deadline()) == b""  # while rank 0 still waits for rank 1
    assert waiting.is_alive()
    rank1.publish(store, 1)
    rank1.connect(store, 7, 1, 2, deadline())
    waiting.join(DEADLINE_S)
    assert not waiting.is_alive() and errors == []
    assert reduce_all([rank0, rank1], [OBJECTION, NO_OBJECTION], step=2) == [OBJECTION, OBJECTION]
    for mesh in (rank0, rank1):
        mesh.close()


def _connect_or_record(mesh: FlagMesh, store: dist.Store, errors: list[BaseException]) -> None:
    try:
        mesh.connect(store, 7, 0, 2, deadline())
    except BaseException as e:
        errors.append(e)
        raise
