"""The chunk checksum of the heal transfer: two 64-bit sums over 512-byte rows, in numpy.

Every chunk of a snapshot carries a digest in the manifest, and a healer checks each chunk
against it before anything is applied. The check runs on every byte of every heal, on hosts
where the healer's receive and the donor's send already compete for the cores, so its cost
is the heal's cost: with CRC-32 (zlib, ~2.3-2.6 GB/s here) verifying 1 GiB took ~0.43 s of
healer CPU next to ~0.55 s of receiving, and a one-donor heal reached 1.6-1.8 GB/s against
~2.5 GB/s for a raw socket. Measured on the same host (2-core AMD EPYC, numpy 2.4), in GB/s:
zlib.adler32 2.7-3.0, hashlib sha1 1.8, sha256 1.8, md5 0.7, blake2b 0.7; numpy's sum of
uint64 words 18-28, row sums of 512-byte rows 18-24, a position-weighted ``np.dot`` of the
words 10-13.

The scheme, ``rowsum64-512`` (:data:`ALGORITHM`): read the chunk as little-endian 64-bit
words, zero-padded to whole 512-byte rows; ``R[k]`` is the sum of row k's 64 words mod 2**64;
the digest is ``S1 = sum(R[k])`` and ``S2 = sum((k + 1) * R[k])``, both mod 2**64, packed
little-endian into 16 bytes. The manifest names the algorithm, so a peer computing another
one is refused by name instead of failing every chunk.

What it is guaranteed to detect (a changed chunk always has a changed byte sequence; the
chunk's length is fixed by the manifest, so truncation shows up as missing bytes, not here):

* any change confined to 8 consecutive bytes: any flipped bit, any changed byte, any burst
  of up to 64 bits (within one word it changes S1; across two words the two changes cannot
  cancel mod 2**64, because the low word changes by a multiple of 2**j and the high one by
  less than 2**j in absolute value);
* any change confined to two adjacent rows that changes a row's sum (S1 and S2 together);
* rows or chunks in the wrong place (a stripe received at the wrong offset, chunks
  reordered, a stale range left in an in-place target) unless the misplaced data has the
  same sums as the data that belongs there (identical rows or chunks, where it is harmless).
  Two rows ``d`` rows apart swapped escape only if their sums differ by a multiple of
  ``2**(64 - v)``, ``2**v`` being the largest power of two dividing ``d`` (``v <= 12`` in a
  4 MiB chunk, so a multiple of 2**52).

What it misses, and CRC-32 would not: changes that cancel inside one row, such as two words
of one 512-byte row swapped, +x in one word and -x in another of the same row, or the top
bit flipped in two words of one row. CRC-32 detects every 2-bit error and every burst of up
to 32 bits in a chunk; on the other hand it lets a random corruption through with
probability 2**-32, where this lets one through with about 2**-64 inside one row and
2**-128 across rows. TCP already discards segments whose (16-bit) checksum fails; this check
is for what gets past it and for our own placement bugs, which move whole pieces (tensors
at 64-byte alignment, stripes, chunks) rather than swap words inside a row.

Rejected: a per-word position weight (``np.dot(words, arange)``), which also catches swaps
inside a row: np.dot on uint64 is a scalar multiply-add loop, and end to end it cost the
healer ~0.15 s more CPU per GiB than the row sums (1 GiB, 1 donor: 2.3 vs 3.0 GB/s).
Rejected: zlib.adler32, hardly faster than CRC-32 and weaker.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

ALGORITHM = "rowsum64-512"
DIGEST_BYTES = 16
ROW_BYTES = 512
_WORD = np.dtype("<u8")
_WORDS_PER_ROW = ROW_BYTES // _WORD.itemsize
_DIGEST = struct.Struct("<QQ")


def digest(pieces: Sequence[memoryview]) -> bytes:
    """The digest of the bytes of ``pieces`` read in order as one chunk.

    Pieces may split the chunk anywhere (a chunk spans the tensors it covers). Releases the
    GIL while it sums (numpy reductions do), so it may run on a thread beside a receive.
    """
    num_bytes = sum(len(p) for p in pieces)
    rows = np.empty(-(-num_bytes // ROW_BYTES), dtype=_WORD)
    k = 0
    partial = b""
    for piece in pieces:
        if partial:
            take = min(ROW_BYTES - len(partial), len(piece))
            partial += bytes(piece[:take])
            piece = piece[take:]
            if len(partial) < ROW_BYTES:
                continue
            rows[k] = np.frombuffer(partial, dtype=_WORD).sum()
            k += 1
        whole = len(piece) // ROW_BYTES
        if whole:
            words = np.frombuffer(piece, dtype=_WORD, count=whole * _WORDS_PER_ROW)
            words.reshape(whole, _WORDS_PER_ROW).sum(axis=1, out=rows[k : k + whole])
            k += whole
        partial = bytes(piece[whole * ROW_BYTES :])
    if partial:
        rows[k] = np.frombuffer(partial.ljust(ROW_BYTES, b"\0"), dtype=_WORD).sum()
    weights = np.arange(1, len(rows) + 1, dtype=_WORD)
    return _DIGEST.pack(int(rows.sum()), int(np.dot(rows, weights)))
