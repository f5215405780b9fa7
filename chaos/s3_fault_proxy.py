"""Faults a real S3-compatible store produces, injected by an HTTP proxy in front of a real one.

The object-store tier's tests and the ``cold_start`` scenario run against SeaweedFS
(chaos/s3_server.py); a real server cannot be told to fail one part or cut one answer short,
so this proxy sits between the client and it, on loopback, and does so on request::

    fail_parts=1       the next UploadPart answers 500 InternalError (not sent to the server)
    truncate_gets=1    the next object GET sends half its body (with the full Content-Length), then closes
    delay_parts_s=0.2  every UploadPart waits this long first (to kill a process mid-upload)
    wrong_etag_parts=1 the next UploadPart's answer carries a wrong ETag and no checksum

While the server behind it is down (killed, restarting) the proxy answers 503 ServiceUnavailable,
as a load balancer in front of a store does. Requests are forwarded byte for byte, the Host
header included, so SigV4 signatures made for the proxy's address verify at the server.
"""

from __future__ import annotations

import http.client
import http.server
import sys
import threading
import time
from typing import Any

_HOP_HEADERS = {"connection", "keep-alive", "expect", "transfer-encoding"}
_INTERNAL_ERROR = b"<Error><Code>InternalError</Code><Message>injected by the fault proxy</Message></Error>"
_UNAVAILABLE = b"<Error><Code>ServiceUnavailable</Code><Message>the server behind the proxy is down</Message></Error>"


class Faults:
    """The faults still to inject and the counters (``parts``, ``gets``), shared by the proxy's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: dict[str, float] = {
            "fail_parts": 0,
            "truncate_gets": 0,
            "delay_parts_s": 0.0,
            "wrong_etag_parts": 0,
            "parts": 0,
            "gets": 0,
        }

    def update(self, settings: dict[str, float]) -> dict[str, float]:
        with self.lock:
            unknown = set(settings) - set(self.state)
            if unknown:
                raise ValueError(f"unknown faults {sorted(unknown)}; known: {sorted(self.state)}")
            self.state.update({k: float(v) for k, v in settings.items()})
            return dict(self.state)

    def take(self, name: str) -> bool:
        with self.lock:
            if self.state[name] > 0:
                self.state[name] -= 1
                return True
            return False

    def count(self, name: str) -> float:
        with self.lock:
            self.state[name] += 1
            return self.state["delay_parts_s"]


class FaultProxy:
    """The proxy: ``start`` binds a free loopback port and serves on a thread until ``close``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults = Faults()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "FaultProxy.start() first"
        return self._server.server_address[1]

    def start(self, port: int = 0) -> FaultProxy:
        """Bind ``port`` on loopback (0: a free one) and serve; returns self."""
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _QuietServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client killed mid-request (the uploader SIGKILLed) is a fault under test, not a proxy error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: the tests read the client's errors, not an access log."""

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> None:
        self.send_response(status)
        for name, value in headers or [("Content-Type", "application/xml")]:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self) -> None:
        faults = self.owner.faults
        query = self.path.partition("?")[2]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        is_part = self.command == "PUT" and "partNumber=" in query
        is_object_get = (
            self.command == "GET" and self.path.count("/") >= 2 and "uploads" not in query and "list-type" not in query
        )
        if is_part:
            delay_s = faults.count("parts")
            if delay_s:
                time.sleep(delay_s)  # the fault itself: a slow store, not a test's synchronisation
            if faults.take("fail_parts"):
                return self._reply(500, _INTERNAL_ERROR)
        if is_object_get:
            faults.count("gets")
        upstream = http.client.HTTPConnection("127.0.0.1", self.owner.upstream_port, timeout=60)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_HEADERS and name.lower() != "content-length":
                    upstream.putheader(name, value)
            upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            response = upstream.getresponse()
            data = response.read()
        except OSError:
            return self._reply(503, _UNAVAILABLE)
        finally:
            upstream.close()
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS | {"content-length"}]
        if is_part and faults.take("wrong_etag_parts"):
            headers = [(k, v) for k, v in headers if not k.lower().startswith(("etag", "x-amz-checksum"))]
            headers.append(("ETag", '"00000000000000000000000000000000"'))
        if is_object_get and response.status == 200 and faults.take("truncate_gets"):
            self.send_response(response.status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return None
        if self.command == "HEAD":
            self.send_response(response.status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", response.getheader("Content-Length", "0"))
            self.end_headers()
            return None
        return self._reply(response.status, data, headers)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward
