"""Ranks of a column's "ok"-flag mesh for the tests of replicaft/column/flag.py and flag_handshake.py:
real meshes on loopback, and a peer written by hand that sends what a test wants it to."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

from lighthouse.tls.files import TlsFiles
from replicaft.column.flag import MESSAGE, FlagMesh
from replicaft.column.flag_handshake import HELLO, MAGIC, hello_mac
from replicaft.transfer.donors import host_port

DEADLINE_S = 30.0


def deadline() -> float:
    return time.monotonic() + DEADLINE_S


def meshes_of(size: int, *, token: str | None = None, tls: TlsFiles | None = None) -> list[FlagMesh]:
    return [FlagMesh("127.0.0.1", token=token, tls=tls) for _ in range(size)]


def connect_all(store: dist.Store, meshes: list[FlagMesh], quorum_id: int = 7) -> list[FlagMesh]:
    """Every mesh published and connected, each on its own thread, as the ranks of a column do."""
    for rank, mesh in enumerate(meshes):
        mesh.publish(store, rank)
    with ThreadPoolExecutor(len(meshes)) as pool:
        size = len(meshes)
        for f in [pool.submit(m.connect, store, quorum_id, rank, size, deadline()) for rank, m in enumerate(meshes)]:
            f.result(timeout=DEADLINE_S)
    return meshes


def mesh_of(store: dist.Store, size: int, quorum_id: int = 7) -> list[FlagMesh]:
    return connect_all(store, meshes_of(size), quorum_id)


def reduce_all(meshes: list[FlagMesh], values: list[float], step: int) -> list[float]:
    with ThreadPoolExecutor(len(meshes)) as pool:
        futures = [
            pool.submit(m.reduce, v, step, deadline(), threading.Event()) for m, v in zip(meshes, values, strict=True)
        ]
        return [f.result(timeout=DEADLINE_S) for f in futures]


class FakePeer:
    """Rank ``rank`` of a mesh, written by hand: says hello (with the MAC of ``token``), then
    sends what a test wants it to."""

    def __init__(self, store: dist.Store, quorum_id: int = 7, rank: int = 1, token: str | None = None) -> None:
        self.sock = socket.create_connection(host_port(store.get("flag/0").decode()), timeout=DEADLINE_S)
        self.sock.sendall(HELLO.pack(MAGIC, quorum_id, rank, hello_mac(token, quorum_id, rank, 0, False)))

    def read_answer(self) -> bytes:
        """Rank 0's hello in answer (read as a real peer does, so that closing later is no reset)."""
        answer = bytearray()
        while len(answer) < HELLO.size:
            piece = self.sock.recv(HELLO.size - len(answer))
            assert piece, f"rank 0 closed the connection after {len(answer)} bytes of its answer"
            answer += piece
        return bytes(answer)

    def send(self, quorum_id: int, step: int, value: float) -> None:
        self.sock.sendall(MESSAGE.pack(quorum_id, step, value))
