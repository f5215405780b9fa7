"""Content hashes: the SHA-256 of every 4 MiB piece of every tensor, taken once per state.

Two readers need the whole state hashed: the state digest (``state.digest``: committed
events, the checkpoint manifest, DiLoCo's sync points) and a checkpoint's chunk ids
(``checkpoint/chunks.py``: a chunk is named by the SHA-256 of its bytes, which is how an
increment finds what it need not write). Both cut tensors into the same pieces, so a save
hashes each byte once and derives its digest from the chunk ids instead of reading the state
a second time (issue 22: the second pass, a BLAKE2b over every byte, was ~38 % of a
fine-tuning increment).

Why SHA-256 per piece on several threads: OpenSSL's SHA-256 runs at ~1.8 GB/s on this
project's reference host (2-core AMD EPYC, SHA extensions) against ~1.3 GB/s for BLAKE2b,
and hashlib releases the GIL over buffers this large, so two threads hash ~3 GB/s.

The per-step state digest (``flat.step_digest``: the ``committed`` and ``resume`` events)
cuts the state into the same pieces but hashes each with XXH3-128 (:func:`xxh3_piece`,
~13 GB/s on one core here, the GIL released too): it runs after every committed step, on the
training thread, where SHA-256 cost 1.45x the step of a 10 MB model (issue 42). It need not
resist a forger (the groups comparing it are the job's own), only tell states apart; chunk
ids stay SHA-256, because a checkpoint store is addressed by them.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence

import torch
import xxhash

CHUNK_BYTES = 4 * 1024 * 1024
"""The piece a content hash covers: a tensor's bytes are cut at multiples of this from its start."""

HASH_BYTES = 32
MAX_THREADS = 4
"""More threads stop paying once memory bandwidth, not the hash, bounds the pass."""


def hash_threads() -> int:
    """Threads a content pass uses: the cores this process may run on, at most MAX_THREADS."""
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


PieceHash = Callable[[memoryview], bytes]
"""The hash of one piece of a buffer (at most ``CHUNK_BYTES``)."""


def sha256_piece(piece: memoryview) -> bytes:
    """A piece's chunk id: its SHA-256 (``HASH_BYTES``)."""
    return hashlib.sha256(piece).digest()


def xxh3_piece(piece: memoryview) -> bytes:
    """A piece's hash in the per-step digest: its XXH3-128 (16 bytes), ~7x faster than SHA-256."""
    return xxhash.xxh3_128_digest(piece)


def chunk_hashes(buffers: Sequence[memoryview], piece_hash: PieceHash = sha256_piece) -> list[tuple[bytes, ...]]:
    """The ``piece_hash`` (SHA-256 unless told) of each ``CHUNK_BYTES`` piece of each buffer
    (flat bytes), buffer by buffer.

    The pieces are shared out among :func:`hash_threads` threads in contiguous runs of about
    equal bytes; the calling thread takes the first run. Threads are started per call (a save
    or a digest, not a hot loop): they inherit the caller's CPU priority, so a checkpoint
    writer's background pass stays as low as its thread.
    """
    pieces = [(b, start) for b, buf in enumerate(buffers) for start in range(0, len(buf), CHUNK_BYTES)]
    out: list[bytes] = [b""] * len(pieces)
    total = sum(len(buf) for buf in buffers)
    runs = _runs(
        [min(CHUNK_BYTES, len(buffers[b]) - start) for b, start in pieces],
        hash_threads() if total >= 2 * CHUNK_BYTES else 1,
    )
    errors: list[BaseException] = []

    def hash_run(first: int, stop: int) -> None:
        try:
            for k in range(first, stop):
                b, start = pieces[k]
                out[k] = piece_hash(buffers[b][start : start + CHUNK_BYTES])
        except BaseException as e:  # re-raised on the calling thread below
            errors.append(e)

    threads = [threading.Thread(target=hash_run, args=run, name="replicaft-hash", daemon=True) for run in runs[1:]]
    for t in threads:
        t.start()
    hash_run(*runs[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    hashes: list[list[bytes]] = [[] for _ in buffers]
    for (b, _), h in zip(pieces, out, strict=True):
        hashes[b].append(h)
    return [tuple(h) for h in hashes]


def _runs(sizes: Sequence[int], num_runs: int) -> list[tuple[int, int]]:
    """``[first, stop)`` index ranges cutting ``sizes`` into at most ``num_runs`` contiguous
    runs of about equal total; always at least one (possibly empty) run."""
    total = sum(sizes)
    runs, first, acc = [], 0, 0
    for k, size in enumerate(sizes):
        acc += size
        if len(runs) < num_runs - 1 and acc * num_runs >= total * (len(runs) + 1):
            runs.append((first, k + 1))
            first = k + 1
    runs.append((first, len(sizes)))
    return runs


BufferHashes = dict[tuple[int, int], bytes]
"""The content hashes of a host buffer's pieces, by byte range ``(offset, length)``: what a
snapshot's buffer is known to hold. It stays true only while every write into the buffer
goes through :func:`copy_changed`, so it travels with the buffer only between the checkpoint
writer and the next checkpoint capture (transfer/spare.py); any other user drops it."""


def buffer_hashes(
    buffer: memoryview, spans: Sequence[tuple[int, int]], known: BufferHashes | None
) -> list[tuple[bytes, ...]]:
    """The content hashes of the tensors at ``spans`` (``(offset, num_bytes)``) of ``buffer``.

    Pieces ``known`` holds are not read; the others are hashed (:func:`chunk_hashes`) and
    added to ``known``, so the next capture into this buffer can keep them.
    """
    known = {} if known is None else known
    keys = [
        (offset + start, min(CHUNK_BYTES, size - start))
        for offset, size in spans
        for start in range(0, size, CHUNK_BYTES)
    ]
    missing = [key for key in keys if key not in known]
    for key, (h,) in zip(missing, chunk_hashes([buffer[o : o + n] for o, n in missing]), strict=True):
        known[key] = h
    out, k = [], 0
    for _, size in spans:
        count = -(-size // CHUNK_BYTES)
        out.append(tuple(known[key] for key in keys[k : k + count]))
        k += count
    return out


def copy_changed(
    src: torch.Tensor, dst: torch.Tensor, *, offset: int, lo: int, size: int, known: BufferHashes, kept: BufferHashes
) -> None:
    """Copy bytes ``[lo, lo + len(src))`` of a tensor of ``size`` bytes (uint8 ``src``) into
    ``dst``, its place in a buffer at ``offset``, except the whole pieces ``dst`` already
    holds: a piece with a hash in ``known`` whose bytes are equal is left alone and its hash
    moved to ``kept``. Comparing costs what copying does (~16 GB/s, as 64-bit words), and a
    piece kept is one the checkpoint writer need not hash: a frozen embedding is read once
    per save, by this comparison, and never hashed again.
    """
    hi = lo + src.numel()
    start = lo
    while start < hi:
        end = min(hi, start - start % CHUNK_BYTES + CHUNK_BYTES)
        key = (offset + start, end - start)
        whole = start % CHUNK_BYTES == 0 and end - start == min(CHUNK_BYTES, size - start)
        a, b = src[start - lo : end - lo], dst[start - lo : end - lo]
        if whole and key in known and _same_bytes(a, b):
            kept[key] = known[key]
        else:
            b.copy_(a)
        start = end


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two uint8 tensors hold equal bytes; compared as 64-bit words where both are
    aligned (~6x faster than byte by byte)."""
    words = a.numel() - a.numel() % 8
    if a.storage_offset() % 8 or b.storage_offset() % 8 or a.data_ptr() % 8 or b.data_ptr() % 8:
        return torch.equal(a, b)
    return torch.equal(a[:words].view(torch.int64), b[:words].view(torch.int64)) and torch.equal(a[words:], b[words:])
