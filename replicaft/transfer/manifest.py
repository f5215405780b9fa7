"""The heal manifest: what a donor's snapshot holds and how to check every byte of it.

A snapshot is one flat byte buffer holding every tensor of the training state at an aligned
offset. The manifest describes it (names, dtypes, shapes, offsets, the msgpack skeleton of
the non-tensor state) and carries a digest per fixed-size chunk (checksum.py; the manifest
names the algorithm), so a healer can fetch chunk-aligned stripes from several donors at
once and verify each stripe on arrival, before anything is applied. Pure: no sockets, no
torch.

The chunk digests cover the bytes; :func:`state_digest` covers everything else a healer takes
from a donor (the step, the non-tensor state, every tensor's name, dtype, shape and place, the
chunk digests): the donors' majority vote compares it, so no part of a heal is taken on one
donor's word where others were asked (a donor's quorum id and replica id are its own, not
the state's, and are left out).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from lighthouse.errors import ProtocolError, shown
from lighthouse.rules.plan import STRIPES_PER_DONOR, assign_stripes
from lighthouse.wire.envelope import MAX_ID_CHARS, check_int, check_str, require
from replicaft.state.skeleton import SkeletonError, check_skeleton
from replicaft.transfer.checksum import ALGORITHM as CHECKSUM_ALGORITHM
from replicaft.transfer.checksum import DIGEST_BYTES, digest

MANIFEST_VERSION = 3
"""3: XXH3-128 chunk digests (checksum.py); 2 carried the ``rowsum64-512`` sums, 1 CRC-32s."""
CHUNK_BYTES = 4 * 1024 * 1024
MAX_CHUNK_BYTES = 256 * CHUNK_BYTES
"""The largest chunk a healer accepts (1 GiB): it stages and verifies chunk-sized buffers, so
a donor's manifest naming 1 TiB chunks (one digest covers any total) would have it allocate
one (issue 19)."""
ALIGN_BYTES = 64
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_TENSORS = 1_000_000


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    step: int
    quorum_id: int
    replica_id: str
    skeleton: Any
    tensors: tuple[TensorSpec, ...]
    total_bytes: int
    chunk_bytes: int
    checksums: tuple[bytes, ...]
    """One ``checksum.digest`` per chunk, in order."""
    checksum: str = CHECKSUM_ALGORITHM
    """The algorithm of ``checksums``: a manifest naming another one does not decode."""

    @property
    def num_chunks(self) -> int:
        return len(self.checksums)

    def same_state_as(self, other: Manifest) -> bool:
        """Two donors serve interchangeable state only if everything but their names agrees."""
        return state_digest(self) == state_digest(other)

    def encode(self) -> bytes:
        return msgpack.packb(
            {
                "v": MANIFEST_VERSION,
                "step": self.step,
                "quorum_id": self.quorum_id,
                "replica_id": self.replica_id,
                "skeleton": self.skeleton,
                "tensors": [[t.name, t.dtype, list(t.shape), t.offset, t.num_bytes] for t in self.tensors],
                "total_bytes": self.total_bytes,
                "chunk_bytes": self.chunk_bytes,
                "checksum": self.checksum,
                "checksums": list(self.checksums),
            },
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, raw: bytes) -> Manifest:
        m = "Manifest"
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ProtocolError(f"Manifest is {len(raw)} bytes; the limit is {MAX_MANIFEST_BYTES}")
        try:
            o = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as e:
            raise ProtocolError(f"Manifest is not valid msgpack ({type(e).__name__}: {e})") from e
        if not isinstance(o, dict):
            raise ProtocolError(f"Manifest must be a msgpack map, got {type(o).__name__}")
        if o.get("v") != MANIFEST_VERSION:
            raise ProtocolError(f"Manifest.v is {shown(o.get('v'))}; this side reads version {MANIFEST_VERSION}")
        total = check_int(m, "total_bytes", require(o, m, "total_bytes"), 0)
        chunk = check_int(m, "chunk_bytes", require(o, m, "chunk_bytes"), 1, MAX_CHUNK_BYTES)
        raw_tensors = require(o, m, "tensors")
        algorithm = check_str(m, "checksum", require(o, m, "checksum"), 64)
        if algorithm != CHECKSUM_ALGORITHM:
            raise ProtocolError(
                f"Manifest.checksum is {algorithm!r}; this side verifies chunks with {CHECKSUM_ALGORITHM!r} only. "
                "Run the same replicaft version on donors and healers"
            )
        checksums = require(o, m, "checksums")
        if not isinstance(raw_tensors, list) or len(raw_tensors) > MAX_TENSORS:
            raise ProtocolError(f"Manifest.tensors must be a list of at most {MAX_TENSORS} entries")
        if not isinstance(checksums, list) or len(checksums) != -(-total // chunk):
            raise ProtocolError(f"Manifest.checksums must list one digest per {chunk}-byte chunk of {total} bytes")
        for i, c in enumerate(checksums):
            if not (isinstance(c, bytes) and len(c) == DIGEST_BYTES):
                raise ProtocolError(f"Manifest.checksums[{i}] is {shown(c)}; expected {DIGEST_BYTES} bytes")
        specs: list[TensorSpec] = []
        first_index: dict[str, int] = {}
        for i, t in enumerate(raw_tensors):
            if not (isinstance(t, list) and len(t) == 5 and isinstance(t[2], list)):
                raise ProtocolError(f"Manifest.tensors[{i}] is malformed: {shown(t)}")
            name, dtype, shape, offset, num_bytes = t
            spec = TensorSpec(
                check_str(m, f"tensors[{i}].name", name, 4096),
                check_str(m, f"tensors[{i}].dtype", dtype, 32),
                tuple(check_int(m, f"tensors[{i}].shape", d, 0) for d in shape),
                check_int(m, f"tensors[{i}].offset", offset, 0, total),
                check_int(m, f"tensors[{i}].num_bytes", num_bytes, 0, total),
            )
            if first_index.setdefault(spec.name, i) != i:
                raise ProtocolError(
                    f"Manifest.tensors[{i}].name {spec.name!r} repeats tensors[{first_index[spec.name]}]; "
                    "each tensor of a state has its own name"
                )
            if spec.offset + spec.num_bytes > total:
                raise ProtocolError(f"Manifest.tensors[{i}] ({spec.name}) ends past total_bytes={total}")
            if specs and spec.offset < specs[-1].offset + specs[-1].num_bytes:
                raise ProtocolError(
                    f"Manifest.tensors[{i}] ({spec.name}) at offset {spec.offset} overlaps or "
                    f"precedes the tensor before it; tensors must be in ascending byte order"
                )
            specs.append(spec)
        skeleton = require(o, m, "skeleton")
        try:
            check_skeleton(skeleton, len(specs))
        except SkeletonError as e:
            raise ProtocolError(f"Manifest.skeleton: {e}") from None
        return cls(
            step=check_int(m, "step", require(o, m, "step"), 0),
            quorum_id=check_int(m, "quorum_id", require(o, m, "quorum_id"), 0),
            replica_id=check_str(m, "replica_id", require(o, m, "replica_id"), MAX_ID_CHARS),
            skeleton=skeleton,
            tensors=tuple(specs),
            total_bytes=total,
            chunk_bytes=chunk,
            checksums=tuple(checksums),
            checksum=algorithm,
        )


def state_digest(m: Manifest) -> bytes:
    """One digest over all of the state ``m`` describes (module docstring)."""
    return hashlib.blake2b(
        msgpack.packb(
            [
                m.step,
                m.skeleton,
                [[t.name, t.dtype, list(t.shape), t.offset, t.num_bytes] for t in m.tensors],
                m.total_bytes,
                m.chunk_bytes,
                m.checksum,
                list(m.checksums),
            ],
            use_bin_type=True,
        ),
        digest_size=16,
    ).digest()


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Aligned offsets for tensors of the given byte sizes, and the total buffer size."""
    offsets = []
    position = 0
    for size in sizes:
        offsets.append(position)
        position += -(-size // ALIGN_BYTES) * ALIGN_BYTES
    return offsets, position


def chunk_checksums(buffer: memoryview, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    """The digest of every ``chunk_bytes`` of ``buffer`` (the last chunk may be shorter)."""
    return [digest([buffer[i : i + chunk_bytes]]) for i in range(0, len(buffer), chunk_bytes)]


@dataclass(frozen=True, slots=True)
class ByteStripe:
    donor: str
    start: int
    stop: int


def chunk_stripes(
    manifest: Manifest, donors: Sequence[str], healer_index: int = 0, streams_per_donor: int = 1
) -> list[ByteStripe]:
    """Chunk-aligned stripes of the snapshot dealt across donors (lighthouse.rules.plan.assign_stripes),
    ``STRIPES_PER_DONOR`` for each of a donor's streams, so that a stream that finishes early
    takes a stripe its sibling has not started."""
    c = manifest.chunk_bytes
    stripes = assign_stripes(
        manifest.num_chunks,
        donors,
        healer_index=healer_index,
        min_stripe_bytes=1,
        stripes_per_donor=STRIPES_PER_DONOR * streams_per_donor,
    )
    return [ByteStripe(s.donor, s.start * c, min(s.stop * c, manifest.total_bytes)) for s in stripes]
