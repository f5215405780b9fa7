"""Chunks: a tensor's bytes cut into content-addressed pieces, each optionally compressed and encrypted.

A chunk is at most ``CHUNK_BYTES`` of one tensor's bytes. Its *id* is the SHA-256 of those
bytes (HMAC-SHA-256 under a key derived from the encryption key when encrypting, keys.py), so
equal content has equal ids: a save that finds a chunk's id among the chunks its parent
checkpoint already holds refers to that chunk instead of writing it (incremental saves,
storage.py). Restore decodes every chunk and recomputes its id: every byte loaded is
verified against the name it was stored under.

Stored form (``encode``): one flags byte, then the payload::

    flags & 1: zstd-compressed (only when that made it smaller)
    flags & 2: AES-256-GCM: 12-byte random nonce, ciphertext, 16-byte tag; the id and the
               flags are the associated data, so a chunk cannot be swapped for another
    flags & 4: (with 2; format version 4 on) before the nonce, the piece's *place*
               (places.py) behind its 2-byte length, also associated data: a chunk
               opens only as the tensor and offset it was sealed for

Compression comes before encryption (ciphertext does not compress), per chunk, when the
chunk is written; see ``storage.py`` for why that makes compression a property of the
checkpoint rather than of a tier. A chunk of 4 MiB is large enough that zstd and AES run at
full speed and the per-chunk overhead (29 bytes, one index entry) is negligible, and small
enough that a change to part of a large tensor (an embedding row) rewrites only its chunk.

A save hashes the state once (``replicaft/state/content.py``): the chunk ids of an unencrypted
checkpoint are the state's content hashes, which the manifest's state digest is built from,
so neither the chunk ids nor the digest read the state a second time. An encrypted
checkpoint's ids are keyed, so its writer hashes the chunks once more under the key.

**Rejected: skipping the hash of tensors that did not change** by a cache from the live
tensor's version counter (storage, ``_version``, dtype, shape, stride) to its chunk ids. On
torch 2.13, fused AdamW (``fused=True``) rewrites the parameters and both moments without
bumping ``_version`` (the foreach and for-loop implementations do bump it); a write through
``.data`` bumps a counter the parameter does not share; and replicaft's own heal
(transfer/placement.py) receives the donor's bytes into the live tensors through NumPy
views, which no counter sees. After any of these, a save would refer to the previous save's
chunk, the restore would verify that chunk against its (old) id, and the old values would
load without an error. The writer also sees only the host snapshot, never the live tensors.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.places import MAX_PLACE_BYTES, Place, misplaced
from replicaft.errors import CheckpointCorrupt

ID_BYTES = 32
_COMPRESSED = 1
_ENCRYPTED = 2
_PLACED = 4
_PLACE_LEN_BYTES = 2
_NONCE_BYTES = 12
_TAG_BYTES = 16
MAX_COMPRESSION_LEVEL = 22
_MAX_SEAL_BYTES = 1 + _PLACE_LEN_BYTES + MAX_PLACE_BYTES + _NONCE_BYTES + _TAG_BYTES
"""The most a seal adds to what it seals."""


class ChunkCodec:
    """Names, encodes and decodes chunks for one checkpoint. Thread-safe (no mutable state).

    ``unplaced_seals``: read a checkpoint of format version 3, whose sealed pieces carry no
    place (they are still authenticated, but not bound to where they belong); such pieces are
    only ever read, never written, and refused in a checkpoint of a later version."""

    def __init__(
        self, *, compression_level: int = 0, key: EncryptionKey | None = None, unplaced_seals: bool = False
    ) -> None:
        if not 0 <= compression_level <= MAX_COMPRESSION_LEVEL:
            raise ValueError(f"compression_level={compression_level}; use 0 (off) to {MAX_COMPRESSION_LEVEL}")
        self.compression_level = compression_level
        self.key = key
        self.unplaced_seals = unplaced_seals
        self._aead = AESGCM(key.aes_key) if key is not None else None

    @property
    def key_id(self) -> str | None:
        return self.key.key_id if self.key is not None else None

    def chunk_id(self, data: bytes | memoryview) -> bytes:
        if self.key is None:
            return hashlib.sha256(data).digest()
        return hmac.digest(self.key.chunk_id_key, data, "sha256")

    def encode(self, chunk_id: bytes, data: bytes | memoryview, place: Place, *, compress: bool = True) -> bytes:
        """The chunk as stored; sealed, when encrypting, for ``place`` (ignored otherwise)."""
        flags, payload = 0, data
        if self.compression_level and compress:
            # A fresh compressor per call: zstandard's objects are not thread-safe.
            packed = zstandard.ZstdCompressor(level=self.compression_level).compress(data)
            if len(packed) < len(data):
                flags, payload = _COMPRESSED, packed
        if self._aead is None:
            return bytes([flags]) + bytes(payload)
        flags |= _ENCRYPTED | _PLACED
        said = place.encode()
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, bytes(payload), chunk_id + bytes([flags]) + said)
        return bytes([flags]) + len(said).to_bytes(_PLACE_LEN_BYTES, "big") + said + nonce + sealed

    def decode(self, chunk_id: bytes, stored: bytes | memoryview, raw_len: int, where: str, place: Place) -> bytes:
        """The chunk's bytes, verified against ``chunk_id`` and, when encrypted, against the
        ``place`` it is read into; raises CheckpointCorrupt."""
        flags, payload = self.unseal(chunk_id, stored, where, place)
        if flags & _COMPRESSED:
            try:
                data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_len)
            except zstandard.ZstdError as e:
                raise CheckpointCorrupt(f"{where}: chunk does not decompress ({e})") from e
        else:
            data = bytes(payload)
        if len(data) != raw_len:
            raise CheckpointCorrupt(f"{where}: chunk holds {len(data)} bytes, the index says {raw_len}")
        if not hmac.compare_digest(self.chunk_id(data), chunk_id):
            raise CheckpointCorrupt(f"{where}: chunk content does not match its id {chunk_id.hex()[:16]}…")
        return data

    def unseal(self, chunk_id: bytes, stored: bytes | memoryview, where: str, place: Place) -> tuple[int, memoryview]:
        """The flags and the (still compressed) payload of a stored record, its seal checked."""
        if len(stored) < 1:
            raise CheckpointCorrupt(f"{where}: empty chunk record")
        flags, payload = stored[0], memoryview(stored)[1:]
        placed = 0 if self.unplaced_seals else _PLACED
        if flags & ~(_COMPRESSED | _ENCRYPTED | placed) or flags & (_ENCRYPTED | _PLACED) == _PLACED:
            raise CheckpointCorrupt(f"{where}: unknown chunk flags {flags:#x}")
        if not flags & _ENCRYPTED:
            if self._aead is not None:
                raise CheckpointCorrupt(f"{where}: chunk is not encrypted but its checkpoint says it is")
            return flags, payload
        if self._aead is None:
            raise CheckpointCorrupt(f"{where}: chunk is encrypted but its checkpoint says it is not")
        if bool(flags & _PLACED) != bool(placed):
            raise CheckpointCorrupt(
                f"{where}: encrypted piece does not say what it is, which every piece of a checkpoint of "
                "format version 4 or later does (an older release's piece copied in?)"
            )
        said = b""
        if placed:
            said, payload = _split_place(payload, where)
            found = Place.decode(said, where)
            if found != place:
                raise misplaced(found, place, where)
        if len(payload) < _NONCE_BYTES + _TAG_BYTES:
            # AESGCM raises ValueError, not InvalidTag, for a nonce under 8 bytes (issue 19).
            raise CheckpointCorrupt(
                f"{where}: encrypted chunk record is {len(stored)} bytes, too short for its flags, "
                f"place, nonce and tag (at least {1 + _NONCE_BYTES + _TAG_BYTES})"
            )
        try:
            opened = self._aead.decrypt(
                bytes(payload[:_NONCE_BYTES]), bytes(payload[_NONCE_BYTES:]), chunk_id + bytes([flags]) + said
            )
        except InvalidTag:
            # The key id matched (checked per checkpoint), so this is damage, not a wrong key.
            raise CheckpointCorrupt(
                f"{where}: chunk fails its AES-GCM authentication (damaged, or its place edited)"
            ) from None
        return flags, memoryview(opened)


def _split_place(payload: memoryview, where: str) -> tuple[bytes, memoryview]:
    if len(payload) < _PLACE_LEN_BYTES:
        raise CheckpointCorrupt(f"{where}: encrypted record too short for the length of its place")
    length = int.from_bytes(payload[:_PLACE_LEN_BYTES], "big")
    end = _PLACE_LEN_BYTES + length
    if len(payload) < end:
        raise CheckpointCorrupt(f"{where}: its place claims {length} bytes, {len(payload) - _PLACE_LEN_BYTES} follow")
    return bytes(payload[_PLACE_LEN_BYTES:end]), payload[end:]


def seal_blob(codec: ChunkCodec, data: bytes, place: Place) -> bytes:
    """A whole small file (``state.msgpack``) as stored: itself when not encrypting, else its
    id followed by the encrypted chunk, sealed for ``place``, so that it is read back verified
    like a chunk. Never compressed: the reader knows no raw length to bound a decompression by
    (a compressed and encrypted checkpoint was written and then refused on every load)."""
    if codec.key is None:
        return data
    chunk_id = codec.chunk_id(data)
    return chunk_id + codec.encode(chunk_id, data, place, compress=False)


def open_blob(codec: ChunkCodec, stored: bytes, *, encrypted: bool, max_bytes: int, where: str, place: Place) -> bytes:
    """The inverse of :func:`seal_blob`, refusing a file sealed for another ``place``; raises
    CheckpointCorrupt."""
    if not encrypted:
        return stored
    if len(stored) < ID_BYTES + 1:
        raise CheckpointCorrupt(f"{where} is {len(stored)} bytes, too short for an encrypted file")
    chunk_id = stored[:ID_BYTES]
    if len(stored) > ID_BYTES + max_bytes + _MAX_SEAL_BYTES:
        raise CheckpointCorrupt(f"{where}: encrypted file of {len(stored)} bytes is over its limit")
    flags, payload = codec.unseal(chunk_id, stored[ID_BYTES:], where, place)
    if flags & _COMPRESSED:
        raise CheckpointCorrupt(f"{where}: an encrypted whole file is never compressed")
    if not hmac.compare_digest(codec.chunk_id(payload), chunk_id):
        raise CheckpointCorrupt(f"{where}: content does not match its id {chunk_id.hex()[:16]}…")
    return bytes(payload)
