"""The healer's side of the state-server protocol (wire.py): one request, one reply, per call.

A healer talks to a donor's state server (server.py) in three kinds of request: the manifest
of a step (retried while the donor has not captured it yet, ``wait_for_manifest``), a byte
range (stripes.py streams those), and the notice that it has the whole state (``tell_done``).
This module holds the connection (TLS included) and the request and reply frames, so the
fetch (client.py) and the stripe pulls (stripes.py) share one reading of a refusal: a
"not served" reply is :class:`NotServed`, any other a ProtocolError naming the donor.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Sequence

from lighthouse.errors import ProtocolError, TlsRefused
from replicaft.transfer.donors import Donor, host_port
from replicaft.transfer.manifest import MAX_MANIFEST_BYTES, Manifest
from replicaft.transfer.server import NOT_SERVED, NotServed
from replicaft.transfer.wire import WIRE_VERSION, recv_exact_into, recv_frame, send_frame

logger = logging.getLogger(__name__)

SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
MANIFEST_WAIT_S = 10.0
DONE_NOTICE_TIMEOUT_S = 1.0


def connect(address: str, deadline: float, tls: ssl.SSLContext | None) -> socket.socket:
    """A connection to the state server at ``address``, TLS-wrapped (handshake done) with ``tls``.

    A failed handshake raises TlsRefused (an OSError, so a donor that cannot be reached and
    one whose certificate is not the job CA's are both dropped, the latter with a reason)."""
    host, port = host_port(address)
    sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    if tls is None:
        return sock
    try:
        return tls.wrap_socket(sock, server_hostname=host)
    except (ssl.SSLError, ssl.CertificateError, ConnectionError) as e:
        sock.close()
        raise TlsRefused(
            f"TLS handshake with the state server at {address} failed ({e}); donors and healers "
            "must run with TLS and certificates from the same CA (tls_ca)"
        ) from e


def _request(sock: socket.socket, body: dict, token: str | None, what: str) -> int:
    send_request(sock, body, token)
    return read_reply(sock, what)


def send_request(sock: socket.socket, body: dict, token: str | None) -> None:
    send_frame(sock, {"v": WIRE_VERSION, "token": token, **body})


def read_reply(sock: socket.socket, what: str) -> int:
    """The ``num_bytes`` of the next reply frame on ``sock``; raises if the donor refused."""
    reply = recv_frame(sock, what)
    if not reply.get("ok"):
        error = NotServed if reply.get("code") == NOT_SERVED else ProtocolError
        raise error(f"{what} refused: {reply.get('error', 'no reason given')}")
    num_bytes = reply.get("num_bytes")
    if not isinstance(num_bytes, int) or num_bytes < 0:
        raise ProtocolError(f"{what} reply has num_bytes={num_bytes!r}")
    return num_bytes


def wait_for_manifest(
    donor: Donor,
    step: int,
    token: str | None,
    deadline: float,
    enough: threading.Event,
    tls: ssl.SSLContext | None = None,
) -> Manifest:
    """The donor's manifest of ``step``, retried while the donor says it has no snapshot yet.

    A donor captures its snapshot on its quorum thread while the healer, which learned of the
    quorum at the same moment, is already asking: "not served" first is the normal race, not a
    failure. The retries stop at ``MANIFEST_WAIT_S`` or the deadline, whichever comes first,
    or once ``enough`` is set (other donors answered and the grace for stragglers is over).
    """
    give_up = min(deadline, time.monotonic() + MANIFEST_WAIT_S)
    pause = 0.01
    while True:
        try:
            return fetch_manifest(donor, step, token, deadline, tls)
        except NotServed:
            if time.monotonic() + pause >= give_up or enough.wait(pause):
                raise
            pause = min(pause * 2, 0.2)


def fetch_manifest(
    donor: Donor, step: int, token: str | None, deadline: float, tls: ssl.SSLContext | None = None
) -> Manifest:
    with connect(donor.address, deadline, tls) as sock:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        num_bytes = _request(sock, {"op": "manifest", "step": step}, token, f"manifest from {donor.replica_id}")
        if num_bytes > MAX_MANIFEST_BYTES:
            raise ProtocolError(
                f"donor {donor.replica_id} announced a {num_bytes}-byte manifest; the limit is {MAX_MANIFEST_BYTES}"
            )
        body = bytearray(num_bytes)
        recv_exact_into(sock, memoryview(body))
    manifest = Manifest.decode(bytes(body))
    if manifest.step != step:
        raise ProtocolError(f"donor {donor.replica_id} sent the manifest of step {manifest.step}; asked for {step}")
    return manifest


def tell_done(donors: Sequence[Donor], step: int, token: str | None, reader: str, tls: ssl.SSLContext | None) -> None:
    """Tell each donor that ``reader`` has verified the whole state of ``step``. Best effort:
    a donor not told waits (bounded) at its seal and keeps a copy, as before the notice."""
    for donor in donors:
        try:
            with connect(donor.address, time.monotonic() + DONE_NOTICE_TIMEOUT_S, tls) as sock:
                sock.settimeout(DONE_NOTICE_TIMEOUT_S)
                _request(
                    sock, {"op": "done", "step": step, "reader": reader}, token, f"done notice to {donor.replica_id}"
                )
        except (OSError, ProtocolError) as e:
            logger.debug("heal: donor %s was not told step %d is done: %s", donor.replica_id, step, e)
