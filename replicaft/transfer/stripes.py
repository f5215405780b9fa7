"""Pulling a heal's stripes from one donor over one connection, each chunk verified as it lands.

The fetch (client.py) deals chunk-aligned stripes over the donors on a board (board.py) and
runs one :func:`pull_stripes` per connection. Each pull asks its donor for the next stripe
before reading the current one (so the donor streams without a round trip between stripes),
checks every chunk against the manifest's digest on arrival (:func:`receive_verified`) and,
on any failure, hands its stripes back to the board and stops: the board gives them to
another donor, and nothing unverified is ever applied.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections import deque

from lighthouse.errors import ProtocolError
from replicaft.transfer.board import StripeBoard, StripeTask
from replicaft.transfer.checksum import RECV_PIECE_BYTES, ChunkHash
from replicaft.transfer.device import CopyTimeout
from replicaft.transfer.donors import Donor
from replicaft.transfer.placement import Placement
from replicaft.transfer.progress import FetchProgress
from replicaft.transfer.requests import connect, read_reply, send_request

logger = logging.getLogger(__name__)


def receive_verified(
    sock: socket.socket,
    placement: Placement,
    start: int,
    stop: int,
    donor: str,
    deadline: float,
    progress: FetchProgress,
) -> None:
    """Receive [start, stop) chunk by chunk, each chunk's digest fed as its bytes arrive.

    Raises ProtocolError at the first bad chunk, without reading the rest of the stripe: the
    caller drops the connection and refetches the stripe elsewhere; nothing has been applied.
    The digest runs on the receiving thread, on each piece right after ``recv_into`` wrote it
    (``recv_hashed_into``), while those bytes are in this core's cache: hashing each 4 MiB
    chunk once it was all in read it back from memory (5 GB/s with the row sums before
    XXH3, checksum.py), and a worker thread would read it on another core.
    """
    manifest = placement.manifest
    c = manifest.chunk_bytes
    chunk_start = start
    try:
        for chunk_start in range(start, stop, c):
            chunk_stop = min(chunk_start + c, stop)
            landing = placement.receive(chunk_start, chunk_stop, deadline)
            try:
                running = ChunkHash()
                for piece in landing.pieces:
                    recv_hashed_into(sock, piece, running)
                if running.digest() != manifest.checksums[chunk_start // c]:
                    raise ProtocolError(
                        f"chunk {chunk_start // c} (bytes {chunk_start}..{chunk_stop}) from donor "
                        f"{donor} fails its checksum"
                    )
                landing.land()  # staged bytes go on to the device while the next chunk is received
            finally:
                landing.drop()
            progress.add(chunk_stop - chunk_start)
    except BaseException:
        progress.add(start - chunk_start)  # the stripe is fetched again whole: its chunks count then
        raise


def recv_hashed_into(sock: socket.socket, view: memoryview, running: ChunkHash) -> None:
    """Fill ``view`` from ``sock`` (its own timeout per ``recv``), feeding ``running`` each
    piece as it lands, at most ``RECV_PIECE_BYTES`` a ``recv_into`` (checksum.py)."""
    while view:
        n = sock.recv_into(view[:RECV_PIECE_BYTES])
        if n == 0:
            raise ConnectionError("peer closed the connection mid-transfer")
        running.update(view[:n])
        view = view[n:]


def pull_stripes(
    donor: Donor,
    board: StripeBoard,
    placement: Placement,
    step: int,
    token: str | None,
    deadline: float,
    reader: str | None,
    tls: ssl.SSLContext | None,
    progress: FetchProgress,
) -> int:
    """Fetch stripes from ``donor`` over one connection until the board has none for it
    (each of a donor's connections runs one of these).

    Returns the bytes received. The next stripe is requested before the current one is read
    (one ahead at most): the donor answers a connection's requests in order, so it goes from
    one range to the next without waiting a round trip for the healer's next request. Without
    that the stream stopped for 0.7-2.5 ms at each of a donor's stripes (4 per donor; 100 MiB,
    one donor, loaded 2-core host). On a failure the stripe being read goes back to the board
    against this donor, the one requested ahead goes back as it was, and the donor is dropped.
    """
    rid = donor.replica_id
    sock: socket.socket | None = None
    requested: deque[StripeTask] = deque()
    received = 0
    try:
        while True:
            while len(requested) < 2 and (task := board.take(rid, deadline, wait=not requested)) is not None:
                requested.append(task)
                if sock is None:
                    sock = connect(donor.address, deadline, tls)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                send_request(
                    sock,
                    {
                        "op": "range",
                        "step": step,
                        "start": task.stripe.start,
                        "stop": task.stripe.stop,
                        "reader": reader,
                    },
                    token,
                )
            if not requested or sock is None:
                return received
            s = requested[0].stripe
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            n = read_reply(sock, f"range from {rid}")
            if n != s.stop - s.start:
                raise ProtocolError(f"donor {rid} announced {n} bytes for a {s.stop - s.start}-byte range")
            receive_verified(sock, placement, s.start, s.stop, rid, deadline, progress)
            board.finish(requested.popleft(), True, rid)
            received += s.stop - s.start
    except (OSError, ProtocolError, CopyTimeout) as e:
        failed = requested.popleft()
        logger.warning("heal: stripe %d..%d from %s failed: %s", failed.stripe.start, failed.stripe.stop, rid, e)
        board.finish(failed, False, rid, str(e))
        for task in requested:
            board.release(task)
        return received
    finally:
        if sock is not None:
            sock.close()
