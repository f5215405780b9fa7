"""The state server: every rank serves its published snapshot to healing peers over TCP (or TLS).

It makes no decisions: it answers a manifest request for the published step and streams the
raw bytes of a requested range. Requests are validated (version, token, op, step, range) and
a bad one gets an error frame naming what was wrong before the connection closes; other
connections are unaffected. Nothing is unpickled.

Resource bounds (issue 19): connections are admitted by admission.py's rule, each within
deadlines for its handshake, its request frames and the idle time between them; a frame's
length is checked before its body is allocated (wire.py), ranges against the served state;
error texts, which may quote the peer's input, are cut to ``MAX_ERROR_CHARS``. Each bound
enforced is counted (``statistics()``) and logged sparingly by the connection table
(connections.py), which the accept loop and the connections' threads share.
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Protocol

import torch

from lighthouse.errors import ProtocolError
from lighthouse.wire.envelope import MAX_ID_CHARS, check_int, check_str, require
from replicaft.transfer.admission import ServerLimits, ServerStatistics
from replicaft.transfer.connections import Connection, ConnectionTable, shut_reading
from replicaft.transfer.manifest import Manifest
from replicaft.transfer.wire import (
    SEND_PIECE_BYTES,
    WIRE_VERSION,
    FrameTimeout,
    recv_frame,
    send_bytes,
    send_frame,
)

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 512
"""Error texts quote the peer's input (a 60 KB string where the version goes); cut to this."""
ERROR_SEND_TIMEOUT_S = 1.0
"""How long an error frame to a peer being cut off may take (it fits a socket buffer)."""

NOT_SERVED = "not_served"
"""Error code of a request for a step this server holds no snapshot of (yet)."""
DRAIN_POLL_S = 0.1
"""How often :meth:`StateServer.drain` looks again at which awaited healers are gone."""
BUSY = "busy"
"""Error code of a connection refused or closed because the server holds as many as it may."""


class Served(Protocol):
    """What a server serves: a :class:`~replicaft.transfer.snapshot.Snapshot`, or a
    :class:`~replicaft.transfer.live.LiveSnapshot` read from the live tensors."""

    @property
    def manifest(self) -> Manifest: ...
    def check(self, start: int, stop: int) -> None: ...
    def retire(self) -> None: ...
    def release(self, reader: str) -> None: ...
    def awaiting(self, timeout_s: float) -> frozenset[str]: ...
    def send(self, conn: socket.socket, start: int, stop: int, reader: str | None) -> None: ...
    def read(self, start: int, stop: int, reader: str | None, out: torch.Tensor) -> memoryview: ...


class NotServed(ProtocolError):
    """The requested step has no snapshot here; a donor still capturing it will have it soon."""


RangeHook = Callable[[int, int, memoryview], memoryview]
"""Fault injection for tests (``fault_hook``): may return altered bytes for a range."""


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else f"{text[:MAX_ERROR_CHARS]}... ({len(text)} characters)"


class StateServer:
    def __init__(
        self,
        host: str,
        token: str | None = None,
        *,
        fault_hook: RangeHook | None = None,
        tls: ssl.SSLContext | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        """``tls``: a server context (lighthouse.tls.files.TlsFiles.server_context); every connection
        is then TLS, its handshake done on the connection's own thread within the handshake
        deadline. ``limits``: the bounds on what peers may hold (defaults: ``ServerLimits()``)."""
        self._host = host
        self._token = token
        self._tls = tls
        self._fault_hook = fault_hook
        self._limits = limits if limits is not None else ServerLimits()
        self._snapshots: dict[int, Served] = {}
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        """Notified when an answer ends (``_answering`` falls)."""
        self._answering = 0
        """Requests being answered right now (a range may still be on its way out)."""
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._table = ConnectionTable(self._limits)

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

    def statistics(self) -> ServerStatistics:
        return self._table.statistics()

    def publish(self, snapshot: Served) -> None:
        """Serve ``snapshot`` (alongside any other step still retained); one it replaces, of the
        same step, is retired."""
        with self._lock:
            replaced = self._snapshots.get(snapshot.manifest.step)
            self._snapshots[snapshot.manifest.step] = snapshot
        if replaced is not None:
            replaced.retire()

    def retain(self, steps: set[int]) -> None:
        """Stop serving every step not in ``steps``; each dropped snapshot is retired (its
        memory released once no request in progress reads it)."""
        with self._lock:
            dropped = [snap for s, snap in self._snapshots.items() if s not in steps]
            self._snapshots = {s: snap for s, snap in self._snapshots.items() if s in steps}
        for snapshot in dropped:
            snapshot.retire()

    def drain(self, deadline: float, gone: Callable[[], frozenset[str]]) -> frozenset[str]:
        """Wait, until the monotonic ``deadline``, for every healer a served snapshot expects
        to have been sent all of it, except those ``gone()`` names; returns the healers still
        awaited then (none: drained).

        For a rank about to stop while healers read from it (its loop ended): stopping at once
        failed a heal just begun, and with every donor gone the healer could not finish it
        (heal/departure.py)."""
        while True:
            with self._lock:
                snapshots = list(self._snapshots.values())
            awaited: frozenset[str] = frozenset()
            for snapshot in snapshots:
                awaited |= snapshot.awaiting(min(DRAIN_POLL_S, deadline - time.monotonic())) - gone()
            if not awaited:
                # A healer's last range may be counted as sent before it has left the socket.
                with self._answered:
                    self._answered.wait_for(lambda: not self._answering, max(0.0, deadline - time.monotonic()))
                return awaited
            if time.monotonic() >= deadline:
                return awaited

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
            record = Connection(conn, peer, time.monotonic())
            admission, evicted = self._table.admit(record)
            if admission.action == "refuse":
                self._table.log_bound(
                    "refused", "state server: refused a connection from %s: %s", peer, admission.reason
                )
                _refuse(conn, admission.reason, tls=self._tls is not None)
                continue
            if evicted is not None:
                self._table.log_bound(
                    "evicted", "state server: closed the connection from %s: %s", evicted.peer, admission.reason
                )
                shut_reading(evicted.sock)
            try:
                threading.Thread(target=self._serve, args=(record,), name="replicaft-state-conn", daemon=True).start()
            except RuntimeError as e:  # the process is out of threads: this connection goes, the server stays
                logger.warning("state server: no thread for the connection from %s (%s); closed it", peer, e)
                self._table.forget(record)
                conn.close()

    def _serve(self, record: Connection) -> None:
        limits = self._limits
        handshake_deadline = record.accepted + limits.handshake_timeout_s
        conn = record.sock
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                conn = self._tls_handshake(record, handshake_deadline)
            while True:
                if record.authenticated:
                    request = recv_frame(
                        conn,
                        "state request",
                        idle_deadline=time.monotonic() + limits.idle_timeout_s,
                        frame_timeout_s=limits.request_timeout_s,
                    )
                else:
                    request = recv_frame(
                        conn, "state request", frame_timeout_s=limits.request_timeout_s, deadline=handshake_deadline
                    )
                self._check_credentials(request)
                if not record.authenticated:
                    self._table.authenticated(record)
                conn.settimeout(limits.idle_timeout_s)  # each sendall of the reply, in total (Python >= 3.5)
                with self._lock:
                    self._answering += 1
                try:
                    self._answer(conn, request)
                finally:
                    with self._lock:
                        self._answering -= 1
                        self._answered.notify_all()
        except FrameTimeout as e:
            self._timed_out(conn, record, e)
        except ConnectionError as e:
            if record.evicted is not None:
                self._send_error(conn, record.evicted, BUSY)
            logger.debug("state server: connection from %s ended: %s", record.peer, e)
        except ProtocolError as e:
            # An oversized or undecodable frame, or a bad request: answered with what was wrong.
            self._reject(conn, record, e)
        except (OSError, ssl.CertificateError) as e:  # ssl.SSLError is an OSError
            if record.evicted is not None:
                self._send_error(conn, record.evicted, BUSY)
            logger.debug("state server: connection from %s ended: %s", record.peer, e)
        finally:
            self._table.forget(record)
            record.sock.close()  # the TLS-wrapped socket once wrapped (conn is still the raw one if that failed)

    def _tls_handshake(self, record: Connection, deadline: float) -> ssl.SSLSocket:
        """The connection wrapped in TLS, its handshake done by ``deadline``. The wrapped socket
        replaces the raw one in ``record`` before any I/O, so an eviction can always shut it."""
        with self._table.lock:
            assert self._tls is not None
            conn = self._tls.wrap_socket(record.sock, server_side=True, do_handshake_on_connect=False)
            record.sock = conn
            if record.evicted is not None:
                shut_reading(conn)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FrameTimeout("TLS handshake not begun before the handshake deadline", begun=False)
        conn.settimeout(remaining)  # the whole handshake, not each recv (CPython's _ssl)
        try:
            conn.do_handshake()
        except TimeoutError as e:
            raise FrameTimeout(
                f"TLS handshake not complete {self._limits.handshake_timeout_s:g}s after the accept", begun=True
            ) from e
        except (OSError, ssl.CertificateError) as e:
            logger.warning("state server: TLS handshake with %s failed: %s", record.peer, e)
            raise
        return conn

    def _timed_out(self, conn: socket.socket, record: Connection, error: FrameTimeout) -> None:
        """Close a connection that passed a deadline: quietly if it was idle between requests,
        else counted, logged and told which limit it passed."""
        limits = self._limits
        if record.authenticated and not error.begun:
            logger.debug(
                "state server: closed the connection from %s, idle for %gs", record.peer, limits.idle_timeout_s
            )
            return
        if record.authenticated:
            kind, why = "request_timeouts", f"request_timeout_s={limits.request_timeout_s:g}"
        else:
            kind, why = "handshake_timeouts", f"handshake_timeout_s={limits.handshake_timeout_s:g} after connecting"
        self._table.count(kind)
        message = f"{error}; the limit is {why}: closing the connection"
        self._table.log_bound(kind, "state server: %s: %s", record.peer, message)
        self._send_error(conn, message, "timeout")

    def _send_error(self, conn: socket.socket, error: str, code: str) -> None:
        """Best effort: the peer is being cut off, perhaps for not reading."""
        try:
            conn.settimeout(ERROR_SEND_TIMEOUT_S)
            send_frame(conn, {"ok": False, "error": _cut(error), "code": code})
        except OSError:
            pass

    def _reject(self, conn: socket.socket, record: Connection, error: ProtocolError) -> None:
        """Answer a bad request with what was wrong. Logged each time from a peer that had the
        token (a job member with a bug), at most once per BOUND_LOG_INTERVAL_S from one that
        never showed it: anyone can send those, as fast as they can connect."""
        text = _cut(str(error))
        if isinstance(error, NotServed):
            logger.debug("state server: %s asked for a step not served: %s", record.peer, text)
        elif record.authenticated:
            logger.warning("state server: rejected a request from %s: %s", record.peer, text)
        else:
            self._table.count("rejected")
            self._table.log_bound("rejected", "state server: rejected a first request from %s: %s", record.peer, text)
        self._send_error(conn, text, NOT_SERVED if isinstance(error, NotServed) else "rejected")

    def _check_credentials(self, request: dict) -> None:
        """Every request names the wire version and carries the token (ProtocolError if not)."""
        m = "StateRequest"
        if request.get("v") != WIRE_VERSION:
            raise ProtocolError(
                f"{m} speaks version {request.get('v')!r}; this server speaks {WIRE_VERSION}. "
                "Run the same replicaft version on donors and healers"
            )
        if self._token is not None:
            given = request.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self._token.encode()):
                raise ProtocolError(f"{m}: {'missing' if given is None else 'wrong'} token")

    def _answer(self, conn: socket.socket, request: dict) -> None:
        m = "StateRequest"
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
        data = self._fault_hook(
            start, stop, snapshot.read(start, stop, reader, torch.empty(stop - start, dtype=torch.uint8))
        )
        send_frame(conn, {"ok": True, "num_bytes": stop - start})
        for i in range(0, len(data), SEND_PIECE_BYTES):
            send_bytes(conn, data[i : i + SEND_PIECE_BYTES])


def _refuse(conn: socket.socket, reason: str, *, tls: bool) -> None:
    """Tell a connection it is refused and close it, without blocking the accept loop: the
    error frame fits an empty socket buffer. Over TLS it is only closed (an error frame
    would need the handshake first, on this thread)."""
    try:
        if not tls:
            conn.setblocking(False)
            send_frame(conn, {"ok": False, "error": reason, "code": BUSY})
            conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()
