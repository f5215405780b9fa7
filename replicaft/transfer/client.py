"""The heal client: fetch a donor snapshot striped across up-to-date donors' hosts, verified.

1. Ask every donor for its manifest (in parallel; the requests are requests.py's). Donors
   whose manifest disagrees with the majority (another step, other bytes) are not used: the
   state must be bitwise one state.
2. Place every byte (placement.py): into the caller's own tensors where they match, else
   into one new buffer; deal chunk-aligned stripes across the donors (manifest.py).
3. ``connections`` connections pull the donors' stripes, dealt evenly over the donors'
   hosts (the host part of their address), at least one per host, each host's to one of its
   donors: donors that share a host share its link and memory bus, so the others are spares,
   read only in place of one that fails (``streams_by_donor``). Each connection is one
   pull (stripes.py), which checks each chunk against the manifest's digest (checksum.py)
   as it arrives. A donor that dies or sends a
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
import ssl
import threading
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass

import torch

from replicaft.config.options import HEAL_CONNECTIONS
from replicaft.errors import HealError, StateError
from replicaft.transfer.board import StripeBoard
from replicaft.transfer.device import CopyStream
from replicaft.transfer.donors import Donor, agreed_donors, check_against_own, streams_by_donor
from replicaft.transfer.manifest import Manifest, chunk_stripes
from replicaft.transfer.placement import Placement
from replicaft.transfer.progress import FetchProgress
from replicaft.transfer.requests import tell_done, wait_for_manifest
from replicaft.transfer.stripes import pull_stripes

logger = logging.getLogger(__name__)

MANIFEST_GRACE_S = 1.0
"""Once one donor served its manifest, how long the others may still say "not yet"."""


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
    required: Collection[str] | None = None,
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
    ``expected``: the dtype and shape of each tensor the healer has, by manifest name,
    ``max_bytes``: the most state it will take, and ``required``: the states a load of it must
    find; a manifest at odds with any of them, or whose skeleton does not place its tensors
    where their names say, is refused before anything is allocated (``check_against_own``),
    be it one donor's or several donors' agreed one. ``progress``: counts the verified bytes as
    they arrive (progress.py).
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
        check_against_own(manifest, expected, max_bytes, required)
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
                target=tell_done,
                args=([by_id[rid] for rid in spares], step, token, reader, tls),
                name="replicaft-heal-spares",
                daemon=True,
            ).start()

        def pull(rid: str) -> Future[int]:
            return pool.submit(pull_stripes, by_id[rid], board, placement, step, token, deadline, reader, tls, progress)

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
            target=tell_done, args=(partial, step, token, reader, tls), name="replicaft-heal-done", daemon=True
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
