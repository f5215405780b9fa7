"""The state server: every rank serves its published snapshot to healing peers over TCP (or TLS).

It makes no decisions: it answers a manifest request for the published step and streams the
raw bytes of a requested range. Requests are validated (version, token, op, step, range) and
a bad one gets an error frame naming what was wrong before the connection closes; other
connections are unaffected. Nothing is unpickled.
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Protocol

import torch

from lighthouse.envelope import MAX_ID_CHARS, check_int, check_str, require
from lighthouse.errors import ProtocolError
from lighthouse.tls import HANDSHAKE_TIMEOUT_S
from replicaft.transfer.manifest import Manifest
from replicaft.transfer.wire import SEND_PIECE_BYTES, WIRE_VERSION, recv_frame, send_frame

logger = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 30.0
"""A connection idle this long is closed, so a stalled healer cannot pin a server thread."""

NOT_SERVED = "not_served"
"""Error code of a request for a step this server holds no snapshot of (yet)."""


class Served(Protocol):
    """What a server serves: a :class:`~replicaft.transfer.snapshot.Snapshot`, or a
    :class:`~replicaft.transfer.live.LiveSnapshot` read from the live tensors."""

    @property
    def manifest(self) -> Manifest: ...
    def check(self, start: int, stop: int) -> None: ...
    def retire(self) -> None: ...
    def release(self, reader: str) -> None: ...
    def send(self, conn: socket.socket, start: int, stop: int, reader: str | None) -> None: ...
    def read(self, start: int, stop: int, reader: str | None, out: torch.Tensor) -> memoryview: ...


class NotServed(ProtocolError):
    """The requested step has no snapshot here; a donor still capturing it will have it soon."""


RangeHook = Callable[[int, int, memoryview], memoryview]
"""Fault injection for tests (``fault_hook``): may return altered bytes for a range."""


class StateServer:
    def __init__(self, host: str, token: str | None = None, *, fault_hook: RangeHook | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """``tls``: a server context (lighthouse.tls.TlsFiles.server_context); every connection
        is then TLS, its handshake done on the connection's own thread within HANDSHAKE_TIMEOUT_S."""
        self._host = host
        self._token = token
        self._tls = tls
        self._fault_hook = fault_hook
        self._snapshots: dict[int, Served] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def start(self) -> str:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self._host, 0))
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._accept_loop, name="replicaft-state-server", daemon=True)
        self._thread.start()
        port = self._sock.getsockname()[1]
        return f"[{self._host}]:{port}" if family == socket.AF_INET6 else f"{self._host}:{port}"

    def stop(self) -> None:
        """Stop accepting connections (requests already being answered run to completion)."""
        self._closed.set()
        if self._sock is not None:
            # On Linux, close() alone does not wake a thread blocked in accept(), and the socket
            # goes on accepting until that call returns; shutdown() wakes it.
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._thread is not None:
            self._thread.join(5.0)

    def publish(self, snapshot: Served) -> None:
        """Serve ``snapshot`` (alongside any other step still retained)."""
        with self._lock:
            self._snapshots[snapshot.manifest.step] = snapshot

    def retain(self, steps: set[int]) -> None:
        """Stop serving every step not in ``steps``; each dropped snapshot is retired (its
        memory released once no request in progress reads it)."""
        with self._lock:
            dropped = [snap for s, snap in self._snapshots.items() if s not in steps]
            self._snapshots = {s: snap for s, snap in self._snapshots.items() if s in steps}
        for snapshot in dropped:
            snapshot.retire()

    @property
    def published_steps(self) -> set[int]:
        with self._lock:
            return set(self._snapshots)

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer), name="replicaft-state-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: object) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                conn = self._tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.CertificateError) as e:  # ssl.SSLError is an OSError
                logger.warning("state server: TLS handshake with %s failed: %s", peer, e)
                conn.close()
                return
        conn.settimeout(IDLE_TIMEOUT_S)
        try:
            while True:
                try:
                    request = recv_frame(conn, "state request")
                except ConnectionError:
                    return
                except ProtocolError as e:
                    # An oversized or undecodable frame is answered like a bad request.
                    self._reject(conn, peer, e)
                    return
                try:
                    self._answer(conn, request)
                except ProtocolError as e:
                    self._reject(conn, peer, e)
                    return
        except (OSError, ProtocolError) as e:
            logger.debug("state server: connection from %s ended: %s", peer, e)
        finally:
            conn.close()

    def _reject(self, conn: socket.socket, peer: object, error: ProtocolError) -> None:
        if isinstance(error, NotServed):
            logger.debug("state server: %s asked for a step not served: %s", peer, error)
        else:
            logger.warning("state server: rejected a request from %s: %s", peer, error)
        send_frame(conn, {"ok": False, "error": str(error), "code": NOT_SERVED if isinstance(error, NotServed) else "rejected"})

    def _answer(self, conn: socket.socket, request: dict) -> None:
        m = "StateRequest"
        if request.get("v") != WIRE_VERSION:
            raise ProtocolError(f"{m} speaks version {request.get('v')!r}; this server speaks {WIRE_VERSION}. "
                                "Run the same replicaft version on donors and healers")
        if self._token is not None:
            given = request.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self._token.encode()):
                raise ProtocolError(f"{m}: {'missing' if given is None else 'wrong'} token")
        op = check_str(m, "op", require(request, m, "op"), 16)
        step = check_int(m, "step", require(request, m, "step"), 0)
        with self._lock:
            snapshot = self._snapshots.get(step)
            serving = sorted(self._snapshots) or None
        if snapshot is None:
            raise NotServed(f"{m}: step {step} is not served here (serving: {serving})")
        if op == "manifest":
            body = snapshot.manifest.encode()
            send_frame(conn, {"ok": True, "num_bytes": len(body)})
            conn.sendall(body)
            return
        if op == "done":
            snapshot.release(check_str(m, "reader", require(request, m, "reader"), MAX_ID_CHARS))
            send_frame(conn, {"ok": True, "num_bytes": 0})
            return
        if op != "range":
            raise ProtocolError(f"{m}.op is {op!r}; expected 'manifest', 'range' or 'done'")
        total = snapshot.manifest.total_bytes
        start = check_int(m, "start", require(request, m, "start"), 0, total)
        stop = check_int(m, "stop", require(request, m, "stop"), start, total)
        reader = request.get("reader")
        if reader is not None:
            reader = check_str(m, "reader", reader, MAX_ID_CHARS)
        if self._fault_hook is None:
            snapshot.check(start, stop)  # bytes no longer served are refused with an error frame
            send_frame(conn, {"ok": True, "num_bytes": stop - start})
            snapshot.send(conn, start, stop, reader)
            return
        data = self._fault_hook(start, stop, snapshot.read(start, stop, reader, torch.empty(stop - start, dtype=torch.uint8)))
        send_frame(conn, {"ok": True, "num_bytes": stop - start})
        for i in range(0, len(data), SEND_PIECE_BYTES):
            conn.sendall(data[i : i + SEND_PIECE_BYTES])
