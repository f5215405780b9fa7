"""gRPC streams spoken directly in HTTP/2 frames: simulated members that cost almost nothing,
so that at 1,024 members this machine's two cores measure the server, not the members.

Why not grpc.aio. A grpc.aio stream costs its client tens of microseconds of Python per
message written or read (a Cython call, a future, the completion queue's hop onto the event
loop). 512 members in one process, each writing one request and reading one answer per round,
kept a core busy for as long as the lighthouse took to answer them all, on a machine whose
other core the lighthouse needs: the figure measured the clients as much as the server.

What a member is here. One TCP connection carrying one HTTP/2 stream (a real deployment's
one manager per group, one host each), opened with a hand-built HEADERS frame. Asking is one
``send()`` of a DATA frame around a message encoded before the round. Answers are read by a
reader callback on the event loop: frames cut by their 9-byte header, gRPC messages by their
5-byte prefix, and the answer recognised by a check the caller passes (the barrier's body
compared; the lighthouse's small reply envelope decoded, never the quorum inside). A few
microseconds per member per round; the benchmark records what the member processes spent.

What is left out, on purpose: HPACK decoding (the server's headers are skipped; trailers end
the stream, which no benchmark stream should see, so they fail the round), TLS and the job
token (the benchmark's servers use neither), compression, and WINDOW_UPDATEs from this side:
a stream announces the largest windows HTTP/2 allows (2^31 - 1), which the few kilobytes of
answers a run reads never use up. The server's windows are honoured (a send beyond them
raises), and its SETTINGS and PINGs are acknowledged as HTTP/2 requires.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM = ACK = 0x1
END_HEADERS, PADDED = 0x4, 0x8
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4
STREAM_ID = 1
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
HEADER = struct.Struct(">BHBBI")
"""A frame header: length as one byte and two (24 bits), type, flags, stream id."""


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    n = len(payload)
    return HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def _literal(name: str, value: str) -> bytes:
    """One header as an HPACK literal without indexing, new name, no Huffman (RFC 7541 6.2.2):
    nothing for the server to remember, so no table to keep in step with it."""
    parts = [name.encode(), value.encode()]
    if any(len(p) >= 127 for p in parts):  # one-byte lengths only; every header here is short
        raise ValueError(f"header {name}: {value!r} is too long for this encoder (126 bytes at most)")
    return b"\x00" + b"".join(bytes((len(p),)) + p for p in parts)


class StreamFailed(RuntimeError):
    """The server ended, reset or refused a member's stream (or its connection)."""


class Round:
    """Answers awaited from a set of streams, one each: ``done`` resolves when the last arrives."""

    def __init__(self, num_streams: int) -> None:
        self.left = num_streams
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def answered(self) -> None:
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(None)

    def failed(self, error: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(error)


class RawStream:
    """One gRPC stream call (client side) on a TCP connection of its own; build, then ``open()``.

    Event-loop only. ``ask()`` writes a message and arms ``accept``: every message the server
    sends is passed to it until it returns something other than None (notices and other
    replies pass by), which becomes ``answer``, stamped ``answered_at`` (monotonic).
    """

    def __init__(self, address: str, method: str) -> None:
        self.address = address
        self.method = method
        self.asked_at = 0.0
        self.answered_at = 0.0
        self.answer: Any = None
        self._sock: socket.socket | None = None
        self._inbox = bytearray()
        self._grpc = bytearray()
        self._send_window = DEFAULT_WINDOW
        self._initial_window = DEFAULT_WINDOW
        """The server's SETTINGS_INITIAL_WINDOW_SIZE, which sets this stream's send window."""
        self._conn_window = DEFAULT_WINDOW
        self._accept: Callable[[bytes], Any] | None = None
        self._round: Round | None = None
        self._error: StreamFailed | None = None

    async def open(self) -> None:
        host, _, port = self.address.rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, (host, int(port)))
        except OSError:
            sock.close()
            raise
        self._sock = sock
        settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        headers = b"".join(
            _literal(name, value)
            for name, value in (
                (":method", "POST"),
                (":scheme", "http"),
                (":path", self.method),
                (":authority", self.address),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            )
        )
        self._send(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))
            + frame(HEADERS, END_HEADERS, STREAM_ID, headers)
        )
        loop.add_reader(sock, self._readable)

    def ask(self, message: bytes, accept: Callable[[bytes], Any], round_: Round) -> None:
        """Write ``message`` (one gRPC message) and await the reply ``accept`` takes, in ``round_``."""
        if self._error is not None:
            raise self._error
        self._accept, self._round, self.answer = accept, round_, None
        self.asked_at = time.monotonic()
        payload = b"\x00" + len(message).to_bytes(4, "big") + message
        if len(payload) > min(self._send_window, self._conn_window):
            raise StreamFailed(
                f"{self.address}{self.method}: the server's flow-control window ("
                f"{min(self._send_window, self._conn_window)} bytes) cannot take a "
                f"{len(payload)}-byte message; it stopped granting credit"
            )
        self._send_window -= len(payload)
        self._conn_window -= len(payload)
        self._send(frame(DATA, 0, STREAM_ID, payload))

    def close(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock)
            self._sock.close()
            self._sock = None

    def _send(self, data: bytes) -> None:
        assert self._sock is not None, "open() the stream first"
        try:
            sent = self._sock.send(data)
        except OSError as e:
            raise StreamFailed(f"{self.address}{self.method}: send failed: {e}") from e
        if sent != len(data):  # a few hundred bytes into an emptied socket buffer: never short here
            raise StreamFailed(f"{self.address}{self.method}: the socket took {sent} of {len(data)} bytes")

    def _fail(self, why: str) -> None:
        self._error = StreamFailed(f"{self.address}{self.method}: {why}")
        self.close()
        if self._round is not None:
            self._round.failed(self._error)

    def _readable(self) -> None:
        assert self._sock is not None
        try:
            chunk = self._sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as e:
            self._fail(f"receive failed: {e}")
            return
        if not chunk:
            self._fail("the server closed the connection")
            return
        inbox = self._inbox
        inbox += chunk
        pos = 0
        while len(inbox) - pos >= HEADER.size:
            high, low, kind, flags, stream_id = HEADER.unpack_from(inbox, pos)
            end = pos + HEADER.size + (high << 16 | low)
            if end > len(inbox):
                break
            self._frame(kind, flags, stream_id & 0x7FFFFFFF, bytes(inbox[pos + HEADER.size : end]))
            if self._error is not None:
                return
            pos = end
        del inbox[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == DATA:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            self._messages(payload)
            if flags & END_STREAM:
                self._fail("the server ended the stream")
        elif kind == HEADERS and flags & END_STREAM:
            self._fail("the server ended the stream with trailers (an error status; see the server's log)")
        elif kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                key, value = struct.unpack_from(">HI", payload, i)
                if key == SETTINGS_INITIAL_WINDOW_SIZE:  # applies to open streams as a delta (RFC 9113 6.9.2)
                    self._send_window += value - self._initial_window
                    self._initial_window = value
            self._send(frame(SETTINGS, ACK, 0, b""))
        elif kind == PING and not flags & ACK:
            self._send(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream_id == 0:
                self._conn_window += increment
            else:
                self._send_window += increment
        elif kind == RST_STREAM:
            self._fail(f"the server reset the stream (HTTP/2 error code {int.from_bytes(payload[:4], 'big')})")
        elif kind == GOAWAY:
            code = int.from_bytes(payload[4:8], "big")
            self._fail(f"the server sent GOAWAY (HTTP/2 error code {code}): {payload[8:200]!r}")

    def _messages(self, data: bytes) -> None:
        buf = self._grpc
        buf += data
        pos = 0
        while len(buf) - pos >= 5:
            n = int.from_bytes(buf[pos + 1 : pos + 5], "big")
            if len(buf) - pos - 5 < n:
                break
            message = bytes(buf[pos + 5 : pos + 5 + n])
            pos += 5 + n
            if self._accept is None:
                continue
            try:
                answer = self._accept(message)
            except Exception as e:  # a refusal the check raised (QuorumFailed): the round fails with it
                self._fail(str(e))
                return
            if answer is not None:
                self.answered_at = time.monotonic()
                self.answer = answer
                self._accept = None
                assert self._round is not None
                self._round.answered()
        del buf[:pos]
