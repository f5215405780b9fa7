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
from replicaft.errors import CheckpointCorrupt

ID_BYTES = 32
_COMPRESSED = 1
_ENCRYPTED = 2
_NONCE_BYTES = 12
_TAG_BYTES = 16
MAX_COMPRESSION_LEVEL = 22


class ChunkCodec:
    """Names, encodes and decodes chunks for one checkpoint. Thread-safe (no mutable state)."""

    def __init__(self, *, compression_level: int = 0, key: EncryptionKey | None = None) -> None:
        if not 0 <= compression_level <= MAX_COMPRESSION_LEVEL:
            raise ValueError(f"compression_level={compression_level}; use 0 (off) to {MAX_COMPRESSION_LEVEL}")
        self.compression_level = compression_level
        self.key = key
        self._aead = AESGCM(key.aes_key) if key is not None else None

    @property
    def key_id(self) -> str | None:
        return self.key.key_id if self.key is not None else None

    def chunk_id(self, data: bytes | memoryview) -> bytes:
        if self.key is None:
            return hashlib.sha256(data).digest()
        return hmac.digest(self.key.chunk_id_key, data, "sha256")

    def encode(self, chunk_id: bytes, data: bytes | memoryview, *, compress: bool = True) -> bytes:
        flags, payload = 0, data
        if self.compression_level and compress:
            # A fresh compressor per call: zstandard's objects are not thread-safe.
            packed = zstandard.ZstdCompressor(level=self.compression_level).compress(data)
            if len(packed) < len(data):
                flags, payload = _COMPRESSED, packed
        if self._aead is None:
            return bytes([flags]) + bytes(payload)
        flags |= _ENCRYPTED
        nonce = os.urandom(_NONCE_BYTES)
        return bytes([flags]) + nonce + self._aead.encrypt(nonce, bytes(payload), chunk_id + bytes([flags]))

    def decode(self, chunk_id: bytes, stored: bytes | memoryview, raw_len: int, where: str) -> bytes:
        """The chunk's bytes, verified against ``chunk_id``; raises CheckpointCorrupt."""
        if len(stored) < 1:
            raise CheckpointCorrupt(f"{where}: empty chunk record")
        flags, payload = stored[0], memoryview(stored)[1:]
        if flags & ~(_COMPRESSED | _ENCRYPTED):
            raise CheckpointCorrupt(f"{where}: unknown chunk flags {flags:#x}")
        if flags & _ENCRYPTED:
            if self._aead is None:
                raise CheckpointCorrupt(f"{where}: chunk is encrypted but its checkpoint says it is not")
            if len(payload) < _NONCE_BYTES + _TAG_BYTES:
                # AESGCM raises ValueError, not InvalidTag, for a nonce under 8 bytes (issue 19).
                raise CheckpointCorrupt(
                    f"{where}: encrypted chunk record is {len(stored)} bytes, shorter than "
                    f"its flags, nonce and tag ({1 + _NONCE_BYTES + _TAG_BYTES})"
                )
            try:
                payload = memoryview(
                    self._aead.decrypt(
                        bytes(payload[:_NONCE_BYTES]), bytes(payload[_NONCE_BYTES:]), chunk_id + bytes([flags])
                    )
                )
            except InvalidTag:
                # The key id matched (checked per checkpoint), so this is damage, not a wrong key.
                raise CheckpointCorrupt(f"{where}: chunk fails its AES-GCM authentication (damaged)") from None
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


def seal_blob(codec: ChunkCodec, data: bytes) -> bytes:
    """A whole small file (``state.msgpack``) as stored: itself when not encrypting, else its
    id followed by the encrypted chunk, so that it is read back verified like a chunk. Never
    compressed: the reader knows no raw length to bound a decompression by (a compressed and
    encrypted checkpoint was written and then refused on every load)."""
    if codec.key is None:
        return data
    chunk_id = codec.chunk_id(data)
    return chunk_id + codec.encode(chunk_id, data, compress=False)


def open_blob(codec: ChunkCodec, stored: bytes, *, encrypted: bool, max_bytes: int, where: str) -> bytes:
    """The inverse of :func:`seal_blob`; raises CheckpointCorrupt."""
    if not encrypted:
        return stored
    if len(stored) < ID_BYTES + 1:
        raise CheckpointCorrupt(f"{where} is {len(stored)} bytes, too short for an encrypted file")
    chunk_id = stored[:ID_BYTES]
    flags, payload = stored[ID_BYTES], stored[ID_BYTES + 1 :]
    if flags & _COMPRESSED:
        raise CheckpointCorrupt(f"{where}: an encrypted whole file is never compressed")
    raw_len = len(payload) - _NONCE_BYTES - _TAG_BYTES
    if raw_len < 0 or raw_len > max_bytes:
        raise CheckpointCorrupt(f"{where}: encrypted payload of {len(payload)} bytes is malformed")
    return codec.decode(chunk_id, stored[ID_BYTES:], raw_len, where)
