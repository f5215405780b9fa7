"""The state server's table of open connections: who holds one, and the bounds it enforced.

A state server (server.py) spends a thread per connection and answers requests on it; this
table is what the accept loop and those threads share. It applies admission.py's rule to a
new connection under its lock (accepted, or the oldest unauthenticated one evicted for it, or
refused), marks a connection authenticated once its first request passed, forgets it when
its thread ends, and counts each bound enforced (``statistics()``). Warnings about those
bounds are logged at most once per ``BOUND_LOG_INTERVAL_S`` per kind, with the count so far:
a flood of refusals must not flood the log as well.

Kept apart from the server because it holds no sockets' I/O and no protocol: the request
handling stays readable as "decode, answer, reply", and the bookkeeping that a flood
exercises is in one place, under one lock.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass

from replicaft.transfer.admission import Admission, ServerLimits, ServerStatistics, admit

logger = logging.getLogger(__name__)

BOUND_LOG_INTERVAL_S = 10.0


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    peer: object
    accepted: float
    """Monotonic time of the accept: the handshake deadline counts from it."""
    authenticated: bool = False
    evicted: str | None = None
    """Why the accept loop closed it for a newer one (set before it shuts the socket down)."""


class ConnectionTable:
    """The open connections of one state server, in accept order, and its bound counters.

    Any thread. ``lock`` is held for every change; a thread that replaces a connection's socket
    (the TLS wrap) holds it too, so an eviction always shuts the socket the reader reads."""

    def __init__(self, limits: ServerLimits) -> None:
        self._limits = limits
        self.lock = threading.Lock()
        self._connections: list[Connection] = []
        """Open connections in accept order (evicted ones leave it at once)."""
        self._counts = {"refused": 0, "evicted": 0, "handshake_timeouts": 0, "request_timeouts": 0, "rejected": 0}
        self._last_logged: dict[str, float] = {}

    def admit(self, record: Connection) -> tuple[Admission, Connection | None]:
        """Apply the admission rule to a connection just accepted: the decision, and the
        connection evicted for it (already marked and removed; the caller shuts it down)."""
        evicted: Connection | None = None
        with self.lock:
            admission = admit(len(self._connections), sum(not c.authenticated for c in self._connections), self._limits)
            if admission.action == "refuse":
                self._counts["refused"] += 1
                return admission, None
            if admission.action == "evict_oldest":
                evicted = next(c for c in self._connections if not c.authenticated)
                evicted.evicted = admission.reason
                self._connections.remove(evicted)
                self._counts["evicted"] += 1
            self._connections.append(record)
        return admission, evicted

    def authenticated(self, record: Connection) -> None:
        with self.lock:
            record.authenticated = True

    def forget(self, record: Connection) -> None:
        with self.lock:
            if record in self._connections:
                self._connections.remove(record)

    def count(self, kind: str) -> None:
        """One more bound of ``kind`` enforced (``handshake_timeouts``, ``request_timeouts``, ``rejected``)."""
        with self.lock:
            self._counts[kind] += 1

    def statistics(self) -> ServerStatistics:
        with self.lock:
            c = self._counts
            return ServerStatistics(
                len(self._connections),
                sum(not x.authenticated for x in self._connections),
                c["refused"],
                c["evicted"],
                c["handshake_timeouts"],
                c["request_timeouts"],
                c["rejected"],
            )

    def log_bound(self, kind: str, message: str, *args: object) -> None:
        """Warn that a bound was enforced, at most once per BOUND_LOG_INTERVAL_S per kind, with
        the count so far (a flood of refusals must not also flood the log)."""
        now = time.monotonic()
        with self.lock:
            if now - self._last_logged.get(kind, -BOUND_LOG_INTERVAL_S) < BOUND_LOG_INTERVAL_S:
                return
            self._last_logged[kind] = now
            count = self._counts.get(kind, 0)
        logger.warning(message + " (%d so far; logged at most every %gs)", *args, count, BOUND_LOG_INTERVAL_S)


def shut_reading(sock: socket.socket) -> None:
    """Wake the thread reading ``sock`` (its ``recv`` returns end of file) and let it say why it
    closes: the write side stays open. Called from the accept loop, never the reader's thread.
    ``socket.socket.shutdown`` itself, not an SSLSocket's, which drops its TLS state under the
    reader's feet."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RD)
    except OSError:
        pass
