"""The lighthouse's HTTP status page, ``/status.json`` and Prometheus ``/metrics``.

A minimal HTTP/1.0 server on asyncio streams: three read-only GET routes need no framework,
and the page is self-contained (inline CSS, a meta refresh instead of JavaScript from a CDN)
so it works on a machine with no internet access.

The page knows nothing of the server that hosts it: it is handed two callables, one that
returns the snapshot (plain data, built by :func:`status_snapshot` from the state machine)
and one that renders the metrics. So this module imports the state machine but never the
server, and the server imports it: no import circle, and tests build a snapshot from a bare
:class:`Membership`.

What a client can hold is bounded (issue 19): at most ``MAX_CONNECTIONS`` at once, each with
``READ_TIMEOUT_S`` for its TLS handshake and for its whole request head (not per read), a head of at most
``MAX_REQUEST_BYTES`` buffered, and ``WRITE_TIMEOUT_S`` for its reply to be taken. A client
that asked and never read used to keep its connection, and the rendered page, for ever.
Every connection costs a file descriptor the lighthouse's gRPC sessions draw on too. Over
TLS a connection counts once its handshake is done (asyncio does it before the handler);
until then only the handshake timeout bounds it.

At the cap, a new connection takes the place of the oldest one still reading its request head
(issue 37: 32 connections that trickled a request, or sent nothing, made ``/metrics`` answer
503 to every scraper for as long as they kept reconnecting); a request that has arrived is
answered in a moment, so a client that asks is served whoever else holds connections. Only
when every connection is being answered is the newcomer told 503, without its request read.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

from lighthouse.rules.membership import Membership
from lighthouse.server.metrics import Metrics

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
"""The most sending one reply may take (the page is tens of KB; a reader takes it in a moment)."""
MAX_CONNECTIONS = 32
"""Connections served at once: a browser or two and a few Prometheus scrapers need a handful."""
BUSY_REPLY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 27\r\nConnection: close\r\n\r\ntoo many connections; retry\n"
)


def status_snapshot(m: Membership, metrics: Metrics) -> dict[str, Any]:
    """Everything the page shows, as plain data (also served as /status.json)."""
    now = time.monotonic()
    waiting = set(m.waiting_ids())
    current = m.current
    members = []
    for s in sorted(m.members.values(), key=lambda s: s.replica_id):
        in_quorum = current is not None and s.replica_id in current.replica_ids and s.quorum_id == current.quorum_id
        members.append(
            {
                "replica_id": s.replica_id,
                "address": s.address,
                "step": s.step,
                "world_size": s.world_size,
                "state": "waiting" if s.replica_id in waiting else ("in quorum" if in_quorum else "registered"),
                "healing": s.healing,
                "last_heartbeat_s_ago": round(now - s.last_heartbeat, 3),
                "last_progress_s_ago": round(now - s.last_progress, 3),
                "quorum_id": s.quorum_id,
            }
        )
    return {
        "incarnation": m.incarnation,
        "options": {
            "min_replicas": m.options.min_replicas,
            "join_timeout_s": m.options.join_timeout_s,
            "heartbeat_timeout_s": m.options.heartbeat_timeout_s,
            "progress_timeout_s": m.options.progress_timeout_s,
        },
        "current_quorum": None
        if current is None
        else {
            "quorum_id": current.quorum_id,
            "participants": list(current.replica_ids),
            "age_s": round(time.time() - current.created_unix_s, 3),
        },
        "next_quorum_reason": m.last_decision.reason if m.last_decision else "no quorum requested yet",
        "members": members,
        "history": [
            {
                "quorum_id": r.quorum_id,
                "participants": list(r.participants),
                "created_unix_s": r.created_unix_s,
                "path": r.path,
                "reason": r.reason,
            }
            for r in reversed(m.history)
        ],
        "metrics": {
            "quorums_formed": metrics.quorums_formed,
            "members_lost": metrics.members_lost,
            "sessions_open": metrics.sessions_open,
        },
    }


def render_html(snap: dict[str, Any]) -> str:
    e = html.escape
    q = snap["current_quorum"]
    rows = "".join(
        f"<tr class='{e(m['state'].replace(' ', '-'))}'><td>{e(m['replica_id'])}</td><td>{m['step']}</td>"
        f"<td>{e(m['state'])}{', healing' if m['healing'] else ''}</td><td>{m['last_heartbeat_s_ago']:.2f}s ago</td>"
        f"<td>{m['last_progress_s_ago']:.2f}s ago</td><td>{e(m['address'])}</td><td>{m['world_size']}</td></tr>"
        for m in snap["members"]
    )
    history = "".join(
        f"<tr><td>{h['quorum_id']}</td><td>{e(', '.join(h['participants']))}</td><td>{e(h['path'])}</td>"
        f"<td>{e(time.strftime('%H:%M:%S', time.localtime(h['created_unix_s'])))}</td><td>{e(h['reason'])}</td></tr>"
        for h in snap["history"][:20]
    )
    quorum = (
        "none yet"
        if q is None
        else f"<b>{q['quorum_id']}</b> with {e(', '.join(q['participants']))} ({q['age_s']:.1f}s ago)"
    )
    o = snap["options"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="1">
<title>replicaft lighthouse</title><style>
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}} th{{background:#f3f3f3}}
tr.waiting td{{background:#fff7d6}} tr.in-quorum td{{background:#e6f6e6}} code{{background:#f3f3f3;padding:1px 4px}}
</style></head><body>
<h1>replicaft lighthouse</h1>
<p>incarnation <code>{snap["incarnation"]}</code> · min_replicas {o["min_replicas"]} · join timeout
{o["join_timeout_s"]}s ·
heartbeat timeout {o["heartbeat_timeout_s"]}s · progress timeout {o["progress_timeout_s"]}s</p>
<p>Current quorum: {quorum}</p>
<p>Next quorum: <code>{e(snap["next_quorum_reason"])}</code></p>
<h2>Members ({len(snap["members"])})</h2>
<table><tr><th>replica</th><th>step</th><th>state</th><th>heartbeat</th><th>progress</th><th>address</th><th>ranks</th></tr>{rows}</table>
<h2>Quorum history</h2>
<table><tr><th>id</th><th>participants</th><th>path</th><th>formed</th><th>reason</th></tr>{history}</table>
<p><a href="/status.json">status.json</a> · <a href="/metrics">metrics</a></p>
</body></html>"""


class StatusServer:
    """Serves the page; ``snapshot`` and ``render_metrics`` are called on every request, on
    the event loop that runs this server (the lighthouse's, so they read its state safely)."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        render_metrics: Callable[[], str],
        *,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self._snapshot = snapshot
        self._render_metrics = render_metrics
        self._max_connections = max_connections
        self._read_timeout_s = read_timeout_s
        self._write_timeout_s = write_timeout_s
        self._server: asyncio.Server | None = None
        self.num_connections = 0
        """Connections being served now (read on the server's loop, or as a plain int elsewhere)."""
        self.num_refused = 0
        """Connections answered 503 because ``max_connections`` were being answered."""
        self.num_evicted = 0
        """Connections closed, still reading their request head, to make room for a newer one."""
        self._reading: dict[asyncio.StreamWriter, None] = {}
        """Connections still reading their request head, oldest first."""

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> str:
        """Serve on ``host:port`` (HTTPS with ``tls``); the page's URL."""
        try:
            self._server = await asyncio.start_server(
                self._handle,
                host,
                port,
                ssl=tls,
                ssl_handshake_timeout=self._read_timeout_s if tls else None,
                limit=MAX_REQUEST_BYTES,
            )
        except OSError as e:
            raise OSError(
                f"lighthouse could not serve its status page on {host}:{port} "
                f"({e.strerror or e}); pick another --status-port, or 0 for any free one"
            ) from e
        bound = self._server.sockets[0].getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        return f"{'https' if tls else 'http'}://{shown}:{bound[1]}/"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.num_connections >= self._max_connections and self._reading:
            oldest = next(iter(self._reading))
            del self._reading[oldest]
            oldest.transport.abort()  # its handler ends at once: its read fails
            self.num_evicted += 1
        elif self.num_connections >= self._max_connections:
            self.num_refused += 1
            if self.num_refused == 1 or self.num_refused % 1000 == 0:
                logger.warning(
                    "status page: %d connections open, its limit; answered 503 (%d so far)",
                    self.num_connections,
                    self.num_refused,
                )
            writer.write(BUSY_REPLY)
            writer.close()
            return
        self.num_connections += 1
        try:
            await self._serve(reader, writer)
        finally:
            self.num_connections -= 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reading[writer] = None
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._read_timeout_s)
            finally:
                self._reading.pop(writer, None)
            if writer.transport.is_closing():
                return  # evicted for a newer connection
            if len(head) > MAX_REQUEST_BYTES:
                raise ValueError("request head too large")
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
            status, ctype, body = self._route(method, path.split("?", 1)[0])
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError, UnicodeError):
            if writer.transport.is_closing():
                return  # evicted for a newer connection, or gone
            status, ctype, body = "400 Bad Request", "text/plain", "bad request\n"
        except Exception:
            logger.exception("status page failed")
            status, ctype, body = "500 Internal Server Error", "text/plain", "internal error\n"
        data = body.encode()
        writer.write(
            f"HTTP/1.0 {status}\r\nContent-Type: {ctype}; charset=utf-8\r\nContent-Length: {len(data)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        try:
            await asyncio.wait_for(writer.drain(), self._write_timeout_s)
        except (asyncio.TimeoutError, ConnectionError):
            writer.transport.abort()  # close() would wait to flush what the client is not reading
            return
        writer.close()

    def _route(self, method: str, path: str) -> tuple[str, str, str]:
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", "only GET is served\n"
        if path in ("/", "/index.html"):
            return "200 OK", "text/html", render_html(self._snapshot())
        if path == "/status.json":
            return "200 OK", "application/json", json.dumps(self._snapshot(), indent=1)
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4", self._render_metrics()
        return "404 Not Found", "text/plain", f"no page at {path}; try /, /status.json or /metrics\n"
