"""The column's "ok" flag (commit.py), exchanged directly between the column's ranks.

Every rank sends its flag to every other rank of its column and sums what it receives: one
24-byte message each way per pair, read on the training thread, which the kernel wakes when
a message arrives. As a one-element all-reduce on the column's Gloo group, each side took a
hop through Gloo's worker thread and its transport's thread and back: measured with two
processes on this project's 2-core machine, 133 µs against 19 µs for a socket ping-pong when
idle, and 1.25 ms against 0.16 ms on average when both processes compute between exchanges,
as trainers do. Toggled every 10 steps in the same processes of benchmarks/step_overhead.py,
the direct exchange took 0.8-1.7 ms off a 10 MB step.

The mesh is built with the column group, once per quorum (process_group.py). Each rank
publishes its listening address in the quorum's rendezvous store, connects to every lower
rank and accepts every higher one; each connection opens with authenticated hellos both ways
(flag_handshake.py: the job's token, mutual TLS when the job has TLS; a hello for another
quorum, a late connection of an old one, is closed), and a connection that never says hello
costs nothing but a slot among ``MAX_PENDING``. Every message names the quorum and the step,
so a rank never reads a stale flag as this step's: a mismatch, a malformed message, a closed
connection, the deadline or the abort signal ends the exchange with a CollectiveError, and the
caller breaks the column (the next quorum rebuilds it, mesh included).

Trust: a peer is a process holding the job's token (and, under TLS, certificate); what
arrives is validated all the same, never trusted to be well formed. Without TLS the messages
after the hellos are as open to an on-path attacker as every plaintext channel of the job.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from lighthouse.tls.files import TlsFiles
from replicaft.column.flag_handshake import MeshForming, Refused, contexts
from replicaft.step.commit import HOLD_FLAG

logger = logging.getLogger(__name__)

MESSAGE = struct.Struct("!QQd")
"""quorum id, step, the sender's flag."""
FLAG_VALUES = frozenset((0.0, HOLD_FLAG, 1.0))
WAIT_POLL_S = 0.01
"""How often a wait checks its abort signal (as process_group.WAIT_POLL_S)."""


class FlagError(RuntimeError):
    """The exchange failed; the caller's column is unusable until the next quorum rebuilds it."""


class FlagMesh:
    """One rank's connections to the other ranks of its column. Training thread only."""

    def __init__(self, host: str, *, token: str | None = None, tls: TlsFiles | None = None) -> None:
        """``token``: the job's (``REPLICAFT_TOKEN``), which every peer's hello must prove;
        ``tls``: the job's files, for mutual TLS on every connection (flag_handshake.py)."""
        self._token = token
        self._tls = contexts(tls) if tls is not None else None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family, backlog=128)
        port = self._listener.getsockname()[1]
        self.address = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        self._peers: dict[int, socket.socket] = {}
        self._by_fd: dict[int, int] = {}
        self._quorum_id = -1
        self._rank = 0

    def publish(self, store: dist.Store, rank: int) -> None:
        """Tell the quorum's other ranks where to connect (before the rendezvous, so that no
        peer waits for it)."""
        store.set(f"flag/{rank}", self.address)

    def await_peers(self, store: dist.Store, world_size: int, deadline: float, abort: threading.Event) -> None:
        """Return once every rank of the column has published (``publish``); raises FlagError
        when ``abort`` is set or at ``deadline``, naming the ranks that have not."""
        keys = [f"flag/{rank}" for rank in range(world_size)]
        # Polled: a TCPStore wait that times out logs two warnings, every slice.
        while not store.check(keys):
            if abort.wait(WAIT_POLL_S) or time.monotonic() >= deadline:
                missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
                why = "a member of the quorum was lost" if abort.is_set() else "the deadline passed"
                raise FlagError(f"column rendezvous abandoned ({why}): rank(s) {missing} never published")

    def connect(self, store: dist.Store, quorum_id: int, rank: int, world_size: int, deadline: float) -> None:
        """Open the quorum's mesh, closing the last one's: every rank of the column calls it;
        returns once every peer is connected, or raises FlagError at ``deadline``."""
        self.close_peers()
        self._quorum_id, self._rank = quorum_id, rank
        forming = MeshForming(self._listener, self._token, self._tls, quorum_id, rank, world_size)
        try:
            addresses = {peer: store.get(f"flag/{peer}").decode() for peer in range(rank)}
            self._peers = forming.form(addresses, deadline)
        except (OSError, Refused, RuntimeError, UnicodeDecodeError) as e:
            connected = sorted(forming.peers)
            for sock in forming.peers.values():
                sock.close()
            raise FlagError(
                f"ok-flag mesh of quorum {quorum_id}: rank {rank} connected to "
                f"{connected} of {world_size - 1} peers: {e}"
            ) from e
        for peer, sock in self._peers.items():
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self._by_fd[sock.fileno()] = peer

    def reduce(
        self, value: float, step: int, deadline: float, abort: threading.Event, tick: Callable[[], None] | None = None
    ) -> float:
        """The sum of every rank's ``value`` for ``step``, added in rank order (so every rank
        gets the same float); raises FlagError on any failure."""
        message = MESSAGE.pack(self._quorum_id, step, value)
        for peer, sock in self._peers.items():
            try:
                sent = sock.send(message)
            except OSError as e:
                raise FlagError(f"ok flag of step {step}: sending to column rank {peer} failed: {e}") from e
            if sent != len(message):
                raise FlagError(f"ok flag of step {step}: column rank {peer} has not read its last flags")
        got = {self._rank: value}
        partial: dict[int, bytes] = {}
        poll = select.poll()
        for sock in self._peers.values():
            poll.register(sock, select.POLLIN)
        while len(got) <= len(self._peers):
            # A TLS socket may hold a decrypted message the kernel no longer reports as readable.
            events = [(s.fileno(), 0) for p, s in self._peers.items() if p not in got and _buffered(s)]
            events = events or poll.poll(max(0.0, min(WAIT_POLL_S, deadline - time.monotonic())) * 1000)
            for fd, _ in events:
                peer = self._by_fd[fd]
                reading = self._read(peer, partial.get(peer, b""), step)
                if isinstance(reading, float):
                    got[peer] = reading
                    poll.unregister(fd)
                else:
                    partial[peer] = reading
            if len(got) > len(self._peers):
                break
            if not events and tick is not None:
                tick()
            if abort.is_set():
                raise FlagError(f"ok flag of step {step} abandoned: a member of the quorum was lost")
            if time.monotonic() >= deadline:
                missing = sorted(set(self._peers) - set(got))
                raise FlagError(f"ok flag of step {step}: column rank(s) {missing} sent none within the deadline")
        return sum(got[r] for r in sorted(got))

    def _read(self, peer: int, buffered: bytes, step: int) -> float | bytes:
        """The peer's flag once its message is whole, else what has arrived of it. Reads no
        further than this message: what follows it stays in the socket for the next step."""
        try:
            data = self._peers[peer].recv(MESSAGE.size - len(buffered))
        except (BlockingIOError, ssl.SSLWantReadError):
            return buffered
        except OSError as e:
            raise FlagError(f"ok flag of step {step}: column rank {peer} failed: {e}") from e
        if not data:
            raise FlagError(f"ok flag of step {step}: column rank {peer} closed its connection")
        buffered += data
        if len(buffered) < MESSAGE.size:
            return buffered
        quorum, their_step, flag = MESSAGE.unpack(buffered)
        if quorum != self._quorum_id or their_step != step:
            raise FlagError(
                f"ok flag: column rank {peer} sent quorum {quorum} step {their_step}, "
                f"expected quorum {self._quorum_id} step {step}"
            )
        if flag not in FLAG_VALUES:
            raise FlagError(
                f"ok flag of step {step}: column rank {peer} sent {flag!r}, not one of {sorted(FLAG_VALUES)}"
            )
        return flag

    def close_peers(self) -> None:
        for sock in self._peers.values():
            sock.close()
        self._peers = {}
        self._by_fd = {}

    def close(self) -> None:
        self.close_peers()
        self._listener.close()


def _buffered(sock: socket.socket) -> bool:
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
