"""How a connection becomes a peer of the column's "ok"-flag mesh (flag.py): TLS, the hellos, their deadlines.

Authentication, as on every other channel of a job (issue 37). The job's token
(``REPLICAFT_TOKEN``) is the secret, as for the lighthouse, the group servers and the state
server, compared in constant time; a hello carries not the token itself but its HMAC-SHA256
over what the hello says (its quorum, sender, receiver and direction), so a hello read off
the wire is no use for another quorum, rank or direction, and the token never crosses the
mesh. The connecting rank says hello first; the accepting rank answers with its own, which
the connecting rank checks: a listener address planted in the rendezvous store cannot speak
for a peer either. Under TLS (the job's ``TlsFiles``) every connection is mutual TLS, as the
state server's: encrypted, and refused at the handshake when the peer's certificate was not
signed by the job's CA. Without a token the hello authenticates nobody, exactly as the job's
other channels then accept any process (the manager warns at start).

Cost of a stranger (issue 37: a silent connection held every rebuild of the mesh for the whole
connect timeout, 16.8 s to commit instead of 7.2 s). Every connection, in either direction,
moves through its handshake on one non-blocking loop (``form``): accepting never waits for one
connection's hello, a connection must finish its handshake and hello within
``HELLO_TIMEOUT_S`` of its accept, and at most ``MAX_PENDING`` wait at once, the oldest closed
for a newer one (a real peer sends its hello as it connects, so a flood must outpace one round
trip to evict it, as in transfer/admission.py).
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import selectors
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field

from lighthouse.tls.files import HANDSHAKE_TIMEOUT_S, TlsFiles
from replicaft.transfer.donors import host_port

logger = logging.getLogger(__name__)

MAGIC = b"rfo2"
"""2: the hello carries a MAC (issue 37); 1 (``rfok``) carried none."""
HELLO = struct.Struct("!4sQI32s")
"""magic, quorum id, the sender's rank, the MAC (``hello_mac``; zeros without a token)."""
HELLO_TIMEOUT_S = HANDSHAKE_TIMEOUT_S
"""From a connection's accept to its hello in full, TLS handshake included."""
MAX_PENDING = 64
"""Accepted connections without their hello yet; past it the oldest is closed for a newer one."""
_MAC_LABEL = b"replicaft ok-flag hello v2"
_MAC_FIELDS = struct.Struct("!QIIB")
_NO_MAC = bytes(32)


class Refused(ValueError):
    """What was wrong with a peer's hello (or its connection before it), for the log or the caller."""


def hello_mac(token: str | None, quorum_id: int, sender: int, receiver: int, answer: bool) -> bytes:
    """The MAC of a hello from ``sender`` to ``receiver`` (``answer``: the accepting side's)."""
    if token is None:
        return _NO_MAC
    fields = _MAC_FIELDS.pack(quorum_id, sender, receiver, int(answer))
    return hmac.digest(token.encode(), _MAC_LABEL + fields, "sha256")


def check_hello(
    data: bytes, token: str | None, quorum_id: int, receiver: int, *, answer: bool, expected: range | int
) -> int:
    """The sender's rank of a whole ``HELLO`` received by ``receiver``; raises Refused naming
    what is wrong (magic, quorum, rank out of ``expected``, MAC)."""
    magic, quorum, sender, mac = HELLO.unpack(data)
    if magic != MAGIC:
        raise Refused(f"magic {magic!r}, not {MAGIC!r} (another protocol, or an older replicaft)")
    if quorum != quorum_id:
        raise Refused(f"a hello for quorum {quorum} (rank {sender}), this mesh is quorum {quorum_id}'s")
    if sender not in (expected if isinstance(expected, range) else (expected,)):
        raise Refused(f"a hello from rank {sender}, expected {_ranks(expected)}")
    if not hmac.compare_digest(mac, hello_mac(token, quorum_id, sender, receiver, answer)):
        raise Refused(f"a hello from rank {sender} without the job's token (wrong MAC)")
    return sender


def contexts(tls: TlsFiles) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server and client contexts of mutual TLS from the job's files, made once per mesh."""
    return tls.server_context(), tls.client_context()


def _ranks(expected: range | int) -> str:
    if isinstance(expected, int):
        return f"rank {expected}"
    return f"one of ranks {expected.start}..{expected.stop - 1}"


@dataclass(eq=False)
class _Handshake:
    """One connection on its way through TLS and the hellos; ``advance`` moves it as far as the socket allows."""

    sock: socket.socket
    outgoing: bool
    deadline: float
    peer: int | None = None
    """Outgoing: the rank dialled. Incoming: known once its hello checks."""
    host: str = ""
    """Outgoing: the host dialled, which the peer's certificate must name under TLS."""
    stage: str = "connect"
    out: bytes = b""
    got: bytearray = field(default_factory=bytearray)


class MeshForming:
    """One rank forming its quorum's mesh: dials every lower rank, admits every higher one.
    ``tls``: the server and client contexts (``contexts``), or None for plaintext."""

    def __init__(
        self,
        listener: socket.socket,
        token: str | None,
        tls: tuple[ssl.SSLContext, ssl.SSLContext] | None,
        quorum_id: int,
        rank: int,
        world_size: int,
    ) -> None:
        self._listener = listener
        self._token = token
        self._server_tls, self._client_tls = tls if tls is not None else (None, None)
        self._quorum_id = quorum_id
        self._rank = rank
        self._world_size = world_size
        self._selector = selectors.DefaultSelector()
        self._pending: list[_Handshake] = []
        self.peers: dict[int, socket.socket] = {}

    def form(self, addresses: dict[int, str], deadline: float) -> dict[int, socket.socket]:
        """The peers' connections, blocking, once every rank of ``addresses`` (the lower ones)
        is dialled and every higher rank admitted; raises OSError/Refused/TimeoutError for an
        outgoing connection's failure or at ``deadline``. The caller owns (closes) ``peers``
        on failure as well."""
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        try:
            for peer, address in addresses.items():
                self._dial(peer, address, deadline)
            while len(self.peers) < self._world_size - 1:
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError("the deadline passed")
                self._expire(now)
                wake = min([deadline, *(h.deadline for h in self._pending)])
                for key, _ in self._selector.select(max(0.0, wake - now)):
                    if key.fileobj is self._listener:
                        self._accept(deadline)
                    else:
                        self._advance(key.data)
        finally:
            self._selector.unregister(self._listener)
            for h in self._pending:
                h.sock.close()
            self._pending = []
            self._selector.close()
        return self.peers

    def _dial(self, peer: int, address: str, deadline: float) -> None:
        host, port = host_port(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        error = sock.connect_ex((host, port))
        if error not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(error, f"connecting to rank {peer} at {address}: {os.strerror(error)}")
        h = _Handshake(sock, outgoing=True, deadline=deadline, peer=peer, host=host)
        self._pending.append(h)
        self._selector.register(sock, selectors.EVENT_WRITE, h)

    def _accept(self, deadline: float) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            incoming = [h for h in self._pending if not h.outgoing]
            if len(incoming) >= MAX_PENDING:
                self._drop(incoming[0], f"{MAX_PENDING} connections had not said hello; closed the oldest")
            h = _Handshake(sock, outgoing=False, deadline=min(deadline, time.monotonic() + HELLO_TIMEOUT_S))
            h.stage = "tls" if self._server_tls is not None else "recv"
            if self._server_tls is not None:
                h.sock = self._server_tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            self._pending.append(h)
            self._selector.register(h.sock, selectors.EVENT_READ, h)
            self._advance(h)

    def _expire(self, now: float) -> None:
        for h in [h for h in self._pending if not h.outgoing and h.deadline <= now]:
            self._drop(h, f"no hello within {HELLO_TIMEOUT_S:g}s of its accept")

    def _drop(self, h: _Handshake, why: str) -> None:
        logger.warning("ok-flag mesh of quorum %d: rank %d dropped a connection: %s", self._quorum_id, self._rank, why)
        self._forget(h)
        h.sock.close()

    def _forget(self, h: _Handshake) -> None:
        self._pending.remove(h)
        self._selector.unregister(h.sock)

    def _advance(self, h: _Handshake) -> None:
        try:
            events = self._step(h)
        except (OSError, Refused) as e:
            if h.outgoing:
                raise Refused(f"rank {h.peer} at {h.host}: {e}") from e
            self._drop(h, str(e))
            return
        if events is None and h.peer in self.peers:
            self._drop(h, f"a second hello from rank {h.peer}, which is connected already")
        elif events is None:
            self._forget(h)
            assert h.peer is not None
            self.peers[h.peer] = h.sock
        else:
            self._selector.modify(h.sock, events, h)

    def _step(self, h: _Handshake) -> int | None:
        """Move ``h`` on; the selector events it now waits for, or None once it is a peer."""
        while True:
            if h.stage == "connect":
                error = h.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, f"connecting to rank {h.peer}: {os.strerror(error)}")
                assert h.peer is not None
                h.out = self._hello(h.peer, answer=False)
                h.stage = "send"
                if self._client_tls is not None:
                    self._selector.unregister(h.sock)
                    h.sock = self._client_tls.wrap_socket(h.sock, server_hostname=h.host, do_handshake_on_connect=False)
                    self._selector.register(h.sock, selectors.EVENT_WRITE, h)
                    h.stage = "tls"
            elif h.stage == "tls":
                try:
                    h.sock.do_handshake()
                except ssl.SSLWantReadError:
                    return selectors.EVENT_READ
                except ssl.SSLWantWriteError:
                    return selectors.EVENT_WRITE
                except (OSError, ssl.CertificateError) as e:
                    raise Refused(f"TLS handshake failed ({e}); every rank needs the job's certificate and CA") from e
                h.stage = "send" if h.outgoing else "recv"
            elif h.stage == "send":
                try:
                    h.out = h.out[h.sock.send(h.out) :]
                except (BlockingIOError, ssl.SSLWantWriteError):
                    return selectors.EVENT_WRITE
                except ssl.SSLWantReadError:
                    return selectors.EVENT_READ
                if not h.out:
                    h.stage = "recv" if h.outgoing else "done"
            elif h.stage == "recv":
                try:
                    data = h.sock.recv(HELLO.size - len(h.got))
                except (BlockingIOError, ssl.SSLWantReadError):
                    return selectors.EVENT_READ
                except ssl.SSLWantWriteError:
                    return selectors.EVENT_WRITE
                if not data:
                    raise ConnectionError(f"closed after {len(h.got)} of the hello's {HELLO.size} bytes")
                h.got += data
                if len(h.got) == HELLO.size:
                    self._checked(h)
            else:
                return None

    def _checked(self, h: _Handshake) -> None:
        """The hello in ``h.got`` checked: an answer is the dialled peer's; a hello is answered."""
        if h.outgoing:
            assert h.peer is not None
            check_hello(bytes(h.got), self._token, self._quorum_id, self._rank, answer=True, expected=h.peer)
            h.stage = "done"
            return
        expected = range(self._rank + 1, self._world_size)
        peer = check_hello(bytes(h.got), self._token, self._quorum_id, self._rank, answer=False, expected=expected)
        h.peer = peer
        h.out = self._hello(peer, answer=True)
        h.stage = "send"

    def _hello(self, to: int, *, answer: bool) -> bytes:
        mac = hello_mac(self._token, self._quorum_id, self._rank, to, answer)
        return HELLO.pack(MAGIC, self._quorum_id, self._rank, mac)
