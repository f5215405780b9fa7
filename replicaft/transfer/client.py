"""The heal client: fetch a donor snapshot striped across up-to-date donors' hosts, verified.

1. Ask every donor for its manifest (in parallel). Donors whose manifest disagrees with the
   majority (another step, other bytes) are not used: the state must be bitwise one state.
2. Place every byte (placement.py): into the caller's own tensors where they match, else
   into one new buffer; deal chunk-aligned stripes across the donors (manifest.py).
3. ``connections`` connections pull the donors' stripes, dealt evenly over the donors'
   hosts (the host part of their address), at least one per host, each host's to one of its
   donors: donors that share a host share its link and memory bus, so the others are spares,
   read only in place of one that fails (``streams_by_donor``). Each chunk is checked
   against the manifest's digest (checksum.py) as it arrives. A donor that dies or sends a
   bad stripe is dropped and its stripes go to the others; a stripe that fails on every
   donor fails the heal. A connection that has pulled all its donor's stripes takes the
   last one another donor has not been asked for yet, so a slow donor does not hold the
   heal's end.
4. Only when every chunk verified are the tensors returned; the caller applies them. Each
   donor that sent only part of the state is then told, in the background, that this
   ``reader`` has all of it: a donor serving its live state would otherwise wait at the end
   of its step for the rest and keep a copy of it (live.py). A failure raises HealError
   (the caller retries at the next quorum); tensors given as ``into`` may then hold partly
   received bytes, which is why the caller must regard them as invalid until a heal
   succeeds. Spares are told at once, as the reading starts: they are read only if a donor
   fails, and would otherwise hold their step for a healer that does not read them and then
   copy the whole state for it; a spare read after its step ended has kept nothing, so it
   fails like a dead donor and the heal is retried at the next quorum.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass

import torch

from lighthouse.errors import ProtocolError, TlsRefused
from replicaft.config.options import HEAL_CONNECTIONS
from replicaft.errors import HealError, StateError
from replicaft.transfer.board import StripeBoard, StripeTask
from replicaft.transfer.device import CopyStream, CopyTimeout
from replicaft.transfer.donors import (
    Donor,
    agreed_donors,
    check_against_own,
    host_port,
    streams_by_donor,
)
from replicaft.transfer.manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    chunk_ok,
    chunk_stripes,
)
from replicaft.transfer.placement import Placement
from replicaft.transfer.progress import FetchProgress
from replicaft.transfer.server import NOT_SERVED, NotServed
from replicaft.transfer.wire import WIRE_VERSION, recv_exact_into, recv_frame, send_frame

logger = logging.getLogger(__name__)

SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
MANIFEST_WAIT_S = 10.0
MANIFEST_GRACE_S = 1.0
"""Once one donor served its manifest, how long the others may still say "not yet"."""
DONE_NOTICE_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class HealResult:
    manifest: Manifest
    tensors: list[torch.Tensor]
    """One per manifest tensor, verified: the caller's own (received in place) or new."""
    in_place: frozenset[str]
    """Manifest names received into the caller's tensors."""
    seconds: float
    bytes_by_donor: dict[str, int]
    refetched_stripes: int
    taken_over_stripes: int
    """Stripes a connection pulled from its own donor after another, still alive, was dealt them."""

    @property
    def num_bytes(self) -> int:
        return self.manifest.total_bytes

    @property
    def in_place_bytes(self) -> int:
        return sum(s.num_bytes for s in self.manifest.tensors if s.name in self.in_place)


def _connect(address: str, deadline: float, tls: ssl.SSLContext | None) -> socket.socket:
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
    _send_request(sock, body, token)
    return _read_reply(sock, what)


def _send_request(sock: socket.socket, body: dict, token: str | None) -> None:
    send_frame(sock, {"v": WIRE_VERSION, "token": token, **body})


def _read_reply(sock: socket.socket, what: str) -> int:
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
    with _connect(donor.address, deadline, tls) as sock:
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


def _receive_verified(
    sock: socket.socket,
    placement: Placement,
    start: int,
    stop: int,
    donor: str,
    deadline: float,
    progress: FetchProgress,
) -> None:
    """Receive [start, stop) chunk by chunk, checking each chunk's digest as soon as it is in.

    Raises ProtocolError at the first bad chunk, without reading the rest of the stripe: the
    caller drops the connection and refetches the stripe elsewhere; nothing has been applied.
    The check runs inline, on the receiving thread: a 4 MiB chunk takes ~0.2 ms at the
    digest's ~20 GB/s (checksum.py) while the kernel goes on filling the socket buffer, so the
    sender does not wait. Checking chunk i on a worker thread while chunk i+1 arrives, which
    the CRC-32 (~2.5 GB/s) needed, measured no faster with the digest (1 GiB, 1 donor, 4
    interleaved comparisons: inline 1.95-2.65 GB/s vs 1.83-2.51) and cost more healer CPU
    (thread hand-offs, the chunk no longer in this core's cache).
    """
    manifest = placement.manifest
    c = manifest.chunk_bytes
    chunk_start = start
    try:
        for chunk_start in range(start, stop, c):
            chunk_stop = min(chunk_start + c, stop)
            landing = placement.receive(chunk_start, chunk_stop, deadline)
            try:
                for piece in landing.pieces:
                    recv_exact_into(sock, piece)
                if not chunk_ok(landing.pieces, manifest.checksums[chunk_start // c]):
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


def _pull(
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
                    sock = _connect(donor.address, deadline, tls)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                _send_request(
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
            n = _read_reply(sock, f"range from {rid}")
            if n != s.stop - s.start:
                raise ProtocolError(f"donor {rid} announced {n} bytes for a {s.stop - s.start}-byte range")
            _receive_verified(sock, placement, s.start, s.stop, rid, deadline, progress)
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


def _tell_done(donors: Sequence[Donor], step: int, token: str | None, reader: str, tls: ssl.SSLContext | None) -> None:
    """Tell each donor that ``reader`` has verified the whole state of ``step``. Best effort:
    a donor not told waits (bounded) at its seal and keeps a copy, as before the notice."""
    for donor in donors:
        try:
            with _connect(donor.address, time.monotonic() + DONE_NOTICE_TIMEOUT_S, tls) as sock:
                sock.settimeout(DONE_NOTICE_TIMEOUT_S)
                _request(
                    sock, {"op": "done", "step": step, "reader": reader}, token, f"done notice to {donor.replica_id}"
                )
        except (OSError, ProtocolError) as e:
            logger.debug("heal: donor %s was not told step %d is done: %s", donor.replica_id, step, e)


def fetch_state(
    donors: Sequence[Donor],
    step: int,
    *,
    token: str | None,
    timeout_s: float,
    healer_index: int = 0,
    into: Mapping[str, torch.Tensor] | None = None,
    reader: str | None = None,
    connections: int = HEAL_CONNECTIONS,
    tls: ssl.SSLContext | None = None,
    stream: CopyStream | None = None,
    expected: Mapping[str, tuple[str, tuple[int, ...]]] | None = None,
    max_bytes: int | None = None,
    progress: FetchProgress | None = None,
) -> HealResult:
    """Fetch and verify the state at ``step`` from ``donors``; raises HealError on failure.

    ``into``: the caller's tensors by manifest name (``state.model.weight``), received into
    in place where name, dtype and shape match (see placement.py for what that obliges).
    ``reader``: the healer's replica id, sent with each range request: a donor serving its
    live state (live.py) keeps a copy of only what its expected healers were not sent.
    ``connections``: how many connections pull at once, in all, at least one per donor host
    (``streams_by_donor``). ``tls``: a client context (lighthouse.tls.files.TlsFiles.client_context)
    when the donors serve over TLS. ``stream``: the copy stream ``into``'s device tensors are
    received through (placement.py; default: the process's stream for their device).
    ``expected``: the dtype and shape of each tensor the healer has, by manifest name, and
    ``max_bytes``: the most state it will take; a manifest at odds with either is refused
    before anything is allocated (``check_against_own``). ``progress``: counts the verified
    bytes as they arrive (progress.py).
    """
    if connections < 1:
        raise ValueError(f"connections={connections}; it must be at least 1")
    if not donors:
        raise HealError(f"no donor to heal step {step} from")
    started = time.monotonic()
    deadline = started + timeout_s
    progress = FetchProgress() if progress is None else progress
    by_id = {d.replica_id: d for d in donors}
    with ThreadPoolExecutor(max_workers=len(donors) + connections, thread_name_prefix="replicaft-heal") as pool:
        enough = threading.Event()
        futures = {pool.submit(wait_for_manifest, d, step, token, deadline, enough, tls): d.replica_id for d in donors}
        manifests: dict[str, Manifest] = {}
        refusals: dict[str, str] = {}
        grace: threading.Timer | None = None
        try:
            for fut in as_completed(futures, timeout=max(0.0, deadline - time.monotonic()) + 1.0):
                rid = futures[fut]
                try:
                    manifests[rid] = fut.result()
                except Exception as e:
                    logger.warning("heal: donor %s could not serve the manifest of step %d: %s", rid, step, e)
                    refusals[rid] = f"{type(e).__name__}: {e}"
                    continue
                if grace is None:
                    grace = threading.Timer(MANIFEST_GRACE_S, enough.set)
                    grace.start()
        except TimeoutError:
            logger.warning("heal: donors %s did not answer by the deadline", sorted(set(by_id) - set(manifests)))
        finally:
            enough.set()
            if grace is not None:
                grace.cancel()
        if not manifests:
            raise HealError(
                f"no donor of {sorted(by_id)} served the manifest of step {step} ({refusals or 'no answer'})"
            )
        usable = agreed_donors(manifests, step)
        manifest = manifests[usable[0]]
        check_against_own(manifest, expected, max_bytes)
        try:
            placement = Placement(manifest, into, stream)
        except StateError as e:
            raise HealError(f"the manifest of step {step} from {usable[0]} is unusable: {e}") from None
        streams = streams_by_donor(connections, [by_id[rid] for rid in usable], healer_index)
        readers = [rid for rid in usable if rid in streams]
        spares = deque(rid for rid in usable if rid not in streams)
        board = StripeBoard(chunk_stripes(manifest, readers, healer_index, max(streams.values())), usable)
        progress.begin(manifest.total_bytes)
        if reader is not None and spares:
            threading.Thread(
                target=_tell_done,
                args=([by_id[rid] for rid in spares], step, token, reader, tls),
                name="replicaft-heal-spares",
                daemon=True,
            ).start()

        def pull(rid: str) -> Future[int]:
            return pool.submit(_pull, by_id[rid], board, placement, step, token, deadline, reader, tls, progress)

        running = {pull(rid): rid for rid in readers for _ in range(streams[rid])}
        received: dict[str, int] = {}
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                rid = running.pop(fut)
                if n := fut.result():
                    received[rid] = received.get(rid, 0) + n
                if rid not in board.alive and spares and board.pending:
                    spare = spares.popleft()
                    logger.info("heal: donor %s failed; reading spare donor %s in its place", rid, spare)
                    running[pull(spare)] = spare
    try:
        placement.finish(deadline)
    except StateError as e:
        raise HealError(f"heal of step {step}: the copies into device memory did not complete: {e}") from None
    if board.failed is not None:
        raise HealError(f"heal of step {step} failed: {board.failed}")
    if board.pending or sum(received.values()) < manifest.total_bytes:
        raise HealError(
            f"heal of step {step} incomplete after {time.monotonic() - started:.1f}s "
            f"(timeout {timeout_s:g}s): {sum(received.values())} of {manifest.total_bytes} bytes"
        )
    partial = [by_id[rid] for rid in usable if rid not in spares and received.get(rid, 0) < manifest.total_bytes]
    if reader is not None and partial:
        threading.Thread(
            target=_tell_done, args=(partial, step, token, reader, tls), name="replicaft-heal-done", daemon=True
        ).start()
    return HealResult(
        manifest,
        placement.tensors(),
        frozenset(placement.in_place),
        time.monotonic() - started,
        received,
        board.refetched,
        board.taken_over,
    )
