"""Framing of the state-transfer protocol: a 4-byte length, then a msgpack map; raw bytes follow.

Request frames: ``{"v", "token", "op": "manifest", "step"}`` or
``{"v", "token", "op": "range", "step", "start", "stop", "reader"}`` or
``{"v", "token", "op": "done", "step", "reader"}`` (the healer verified the whole state of
``step``; a donor serving it live keeps nothing more for it). Every reply starts with a frame
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; a range reply is followed by
exactly ``stop - start`` raw bytes, a manifest reply by ``num_bytes`` bytes of manifest.

What a peer can make a reader hold is bounded before it is allocated: a frame's length is
checked against ``MAX_FRAME_BYTES`` before its body is read, and msgpack refuses a string or
container longer than the frame it came in. What a peer can make a reader wait is bounded by
the deadlines ``recv_frame`` takes: one for the frame's first byte (the idle bound), one from
that byte for the whole frame, and an absolute one over both (a state server's handshake). A
per-``recv`` timeout alone bounds nothing: a peer sending one byte just inside it holds the
reader for ever (issue 19).
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from typing import Any

import msgpack

from lighthouse.errors import ProtocolError

WIRE_VERSION = 3
"""3: manifests carry XXH3-128 chunk digests (manifest.MANIFEST_VERSION 3); 2 the row sums, 1 CRC-32s."""
MAX_FRAME_BYTES = 64 * 1024
"""The largest frame a reader accepts. A request is under 200 bytes plus its token; a frame
announcing more is refused from its 4-byte header, before anything is allocated for it."""
SEND_PIECE_BYTES = 8 * 1024 * 1024
"""The most one ``send_bytes`` of a range's bytes takes (a copied snapshot's, a live one's: live.py)."""
_LENGTH = struct.Struct(">I")
_TIMEVAL = struct.Struct("@ll")
"""A ``struct timeval`` (seconds, microseconds) as ``SO_SNDTIMEO`` takes it."""


def send_bytes(sock: socket.socket, data: memoryview) -> None:
    """``sock.sendall(data)``, bounded in total by the socket's timeout as ``sendall`` is, but
    waiting for room in the kernel's send instead of in ``poll``.

    With a timeout set, CPython makes the socket non-blocking and polls for room before each
    ``send``, so the sender wakes and sends again each time the receiver frees part of the
    buffer: a raw two-stream 1 GiB transfer on loopback (2 cores) took 0.74-0.78 s so against
    0.35-0.40 s blocking. Here the socket blocks during the call, ``SO_SNDTIMEO`` bounds each
    ``send``'s wait (the kernel counts it down across the waits of one call) and the loop the
    total; TimeoutError when it is spent. A TLS socket, whose record layer needs Python's own
    loop, and one without a timeout use ``sendall``.
    """
    timeout_s = sock.gettimeout()
    if timeout_s is None or isinstance(sock, ssl.SSLSocket):
        sock.sendall(data)
        return
    deadline = time.monotonic() + timeout_s
    sock.settimeout(None)
    try:
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"send not done within {timeout_s:g}s")
            seconds = int(remaining)
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TIMEVAL.pack(seconds, int((remaining - seconds) * 1e6) or 1)
            )
            try:
                n = sock.send(data)
            except BlockingIOError as e:  # SO_SNDTIMEO passed with nothing sent
                raise TimeoutError(f"send not done within {timeout_s:g}s") from e
            data = data[n:]
    finally:
        sock.settimeout(timeout_s)


def send_frame(sock: socket.socket, body: dict[str, Any]) -> None:
    data = msgpack.packb(body, use_bin_type=True)
    sock.sendall(_LENGTH.pack(len(data)) + data)


class FrameTimeout(ProtocolError):
    """A frame, or the wait for its first byte, passed its deadline.

    ``begun``: whether any byte of the frame had arrived. False means the peer was idle
    (nothing sent since its last frame); True means it sent part of a frame and stalled or
    trickled the rest, which a well-behaved peer never does."""

    def __init__(self, message: str, *, begun: bool) -> None:
        super().__init__(message)
        self.begun = begun


def recv_exact_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill ``view`` from ``sock``. With ``deadline`` (monotonic), all of it must arrive by
    then (TimeoutError otherwise), however the peer spaces its bytes; without it, each
    ``recv`` waits as long as the socket's own timeout (the caller's business)."""
    while view:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("deadline passed")
            sock.settimeout(remaining)
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("peer closed the connection mid-transfer")
        view = view[n:]


def _earliest(*deadlines: float | None) -> float | None:
    given = [d for d in deadlines if d is not None]
    return min(given) if given else None


def recv_frame(
    sock: socket.socket,
    what: str,
    *,
    idle_deadline: float | None = None,
    frame_timeout_s: float | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """The next frame on ``sock``, decoded; ProtocolError if it is oversized or malformed.

    ``idle_deadline``: its first byte must arrive by then; ``frame_timeout_s``: the rest of it
    within this many seconds of that byte; ``deadline``: all of it by then. Each passed
    deadline raises FrameTimeout. None of them: the socket's own timeout, per ``recv``.
    """
    header = memoryview(bytearray(_LENGTH.size))
    first_deadline = _earliest(idle_deadline, deadline)
    try:
        recv_exact_into(sock, header[:1], first_deadline)
    except TimeoutError as e:
        if first_deadline is None:
            raise  # the socket's own timeout: the caller's, as it was
        raise FrameTimeout(f"no {what} frame began before its deadline", begun=False) from e
    begun_at = time.monotonic()
    frame_deadline = _earliest(None if frame_timeout_s is None else begun_at + frame_timeout_s, deadline)
    try:
        recv_exact_into(sock, header[1:], frame_deadline)
        (length,) = _LENGTH.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ProtocolError(f"{what} frame is {length} bytes; the limit is {MAX_FRAME_BYTES}")
        body = bytearray(length)
        recv_exact_into(sock, memoryview(body), frame_deadline)
    except TimeoutError as e:
        if frame_deadline is None:
            raise
        raise FrameTimeout(
            f"{what} frame not complete {time.monotonic() - begun_at:.2f}s after its first byte", begun=True
        ) from e
    try:
        obj = msgpack.unpackb(bytes(body), raw=False, strict_map_key=True)
    except Exception as e:
        raise ProtocolError(f"{what} frame is not valid msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} frame must be a msgpack map, got {type(obj).__name__}")
    return obj
