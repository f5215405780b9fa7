"""Framing of the state-transfer protocol: a 4-byte length, then a msgpack map; raw bytes follow.

Request frames: ``{"v", "token", "op": "manifest", "step"}`` or
``{"v", "token", "op": "range", "step", "start", "stop", "reader"}`` or
``{"v", "token", "op": "done", "step", "reader"}`` (the healer verified the whole state of
``step``; a donor serving it live keeps nothing more for it). Every reply starts with a frame
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; a range reply is followed by
exactly ``stop - start`` raw bytes, a manifest reply by ``num_bytes`` bytes of manifest.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

from lighthouse.errors import ProtocolError

WIRE_VERSION = 2
"""2: manifests carry named 16-byte chunk digests (manifest.MANIFEST_VERSION 2); 1 carried CRC-32s."""
MAX_FRAME_BYTES = 64 * 1024
SEND_PIECE_BYTES = 8 * 1024 * 1024
"""The most one ``sendall`` of a range's bytes takes."""
_LENGTH = struct.Struct(">I")


def send_frame(sock: socket.socket, body: dict[str, Any]) -> None:
    data = msgpack.packb(body, use_bin_type=True)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("peer closed the connection mid-transfer")
        view = view[n:]


def recv_frame(sock: socket.socket, what: str) -> dict[str, Any]:
    header = bytearray(_LENGTH.size)
    recv_exact_into(sock, memoryview(header))
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"{what} frame is {length} bytes; the limit is {MAX_FRAME_BYTES}")
    body = bytearray(length)
    recv_exact_into(sock, memoryview(body))
    try:
        obj = msgpack.unpackb(bytes(body), raw=False, strict_map_key=True)
    except Exception as e:
        raise ProtocolError(f"{what} frame is not valid msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} frame must be a msgpack map, got {type(obj).__name__}")
    return obj
