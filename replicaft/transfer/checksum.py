"""The chunk checksum of the heal transfer: XXH3-128 of each chunk, fed as the bytes arrive.

Every chunk of a snapshot carries a digest in the manifest, and a healer checks each chunk
against it before anything is applied. The check runs on every byte of every heal, on hosts
where the healer's receive and the donor's send already compete for the cores, so its cost
is the heal's cost. The healer feeds the digest each piece right after ``recv_into`` wrote it
(stripes.py), at most ``RECV_PIECE_BYTES`` at a time, so the hash reads bytes still in this
core's cache instead of a second pass over a chunk that has left it.

Why XXH3-128 (:data:`ALGORITHM`). It is streaming (a chunk spans the tensors it covers and
arrives in pieces cut anywhere, which it hashes without copying any of them together), it
releases the GIL over large updates, so the healer's other receive thread runs beside it,
and it is fast: on the reference hosts, in GB/s on one core, over 256 KiB pieces in cache
30-35, over cold memory 8-13; it is also what the per-step state digest uses
(replicaft/state/content.py). The numpy ``rowsum64-512`` it replaced (manifest version 2) ran
18-24 GB/s on the bytes in cache but 5 GB/s in a heal: its per-row reduction runs a short
inner loop per 512-byte row, and verifying each 4 MiB chunk after the chunk was received
read it back from memory. Measured alongside, in GB/s: CRC-32 (zlib) 2.3-4.8, SHA-256 1.8,
BLAKE2b 0.7-1.3.

What it detects: any change of the chunk's bytes, including their order, except with
probability about 2**-128 for a change not chosen to collide (XXH3 mixes every byte with its
position). Unlike CRC-32 it guarantees no class of errors outright (CRC-32 catches every burst
of up to 32 bits, but lets a random corruption through with probability 2**-32); unlike the
row sums it replaced, it also catches words swapped or changes cancelling inside a row. It is
not cryptographic: a donor that chooses its bytes can make them collide. What protects
against what (README, "What protects a heal"): TCP's checksum drops damaged segments; this
digest catches what gets past it and the healer's own placement bugs; the donors' majority
vote over the manifest's BLAKE2b ``state_digest`` (which covers these digests) keeps a donor
at another step or with other bytes out; TLS and the job token keep out a peer that is not
the job's.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

ALGORITHM = "xxh3-128"
DIGEST_BYTES = 16
RECV_PIECE_BYTES = 256 * 1024
"""The most one ``recv_into`` of a heal takes before its bytes are hashed: small enough that
they are still in the core's cache (L2 is 512 KiB-2 MiB per core on the reference hosts),
large enough that the calls cost nothing next to the bytes (4,096 per GiB)."""

ChunkHash = xxhash.xxh3_128
"""A running digest of one chunk: ``update`` with its pieces in order, then ``digest``."""


def digest(pieces: Sequence[memoryview]) -> bytes:
    """The digest of the bytes of ``pieces`` read in order as one chunk (pieces may split it anywhere)."""
    h = ChunkHash()
    for piece in pieces:
        h.update(piece)
    return h.digest()
