"""Multipart upload parts, pure: their size, their CRC32s as S3 writes them, and the checks of
a store's answers against what was sent (objectstore.py does the I/O).

Why CRC32 and not Content-MD5 (issue 22): MD5 runs at ~0.8 GB/s on one core of the 2-core
machine the benchmark runs on, zlib's CRC32 at ~6.6 GB/s, and the uploader shares those cores
with training (and, on loopback, with the server). Naming an algorithm also matters to the
server: moto, given an upload that names none, builds a whole-object checksum when it is
completed, copying and hashing every byte once more (CompleteMultipartUpload of 256 MiB took
1.1-1.5 s, against 0.46 s for boto3's upload, which names CRC32). With Content-MD5 on 16 MiB
parts, ``python -m benchmarks checkpoint_storage`` measured 0.36-0.79x of boto3's
``upload_file``; with CRC32 on 8 MiB parts, 0.89-1.24x (three runs). CRC32 guards against damage in transit,
which is all a part checksum is for; the SHA-256 guards the content end to end. Small files
(one request) keep Content-MD5: its cost there is negligible and every store checks it.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from dataclasses import dataclass
from typing import Any

PART_CHECKSUM = "CRC32"
"""The checksum every part of an upload carries (S3's flexible checksums)."""
MAX_PARTS = 10_000
"""S3's limit on the parts of one upload."""


class Transient(Exception):
    """A failure worth retrying that boto3 does not raise itself (a short body, a bad ETag)."""


def part_size(num_bytes: int, part_bytes: int) -> int:
    """The part size for a file of ``num_bytes``: ``part_bytes``, or the smallest whole number
    of MiB that fits the file in S3's 10 000 parts. A function of the file's size alone, so a
    resumed upload cuts the file where the crashed one did."""
    mib = 1024 * 1024
    return max(part_bytes, -(-num_bytes // (MAX_PARTS * mib)) * mib)


def crc32_b64(crc: int) -> str:
    """A CRC32 as S3 writes it: the 4 bytes big-endian, base64."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def composite_crc32(part_crcs: list[int]) -> str:
    """The object checksum S3 keeps for a multipart upload with CRC32 parts: the CRC32 of the
    parts' CRC32s (4 bytes each, big-endian, in part order), base64, without its ``-N`` suffix."""
    return crc32_b64(zlib.crc32(b"".join(c.to_bytes(4, "big") for c in part_crcs)))


def stored_composite_crc32(head: dict[str, Any]) -> str | None:
    """The composite CRC32 of a HEAD answer, without its ``-N``; None from a store that keeps
    none, or keeps a full-object CRC32 instead (``ChecksumType`` FULL_OBJECT: not comparable)."""
    value = head.get("ChecksumCRC32")
    if not value or head.get("ChecksumType", "COMPOSITE") != "COMPOSITE":
        return None
    return str(value).partition("-")[0]


@dataclass(frozen=True, slots=True)
class ListedPart:
    """A part an unfinished upload already holds, as ListParts describes it."""

    etag: str
    crc32: str | None
    """None from a store whose listing carries no checksums (moto's)."""


def listed_part_matches(listed: ListedPart, data: bytes, crc: int) -> bool:
    """Whether the stored part is the local one: by its checksum when listed, else its ETag as an MD5."""
    if listed.crc32 is not None:
        return listed.crc32 == crc32_b64(crc)
    return listed.etag.strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest()


def check_part(response: dict[str, Any], data: bytes, crc32: str, what: str) -> None:
    """The store's answer to a part must carry our CRC32; one that carries no checksum at all
    (a store that predates them) must return the MD5 of what we sent as its ETag."""
    answered = response.get("ChecksumCRC32")
    if answered is not None:
        if answered != crc32:
            raise Transient(f"{what}: the store's CRC32 {answered} is not the CRC32 {crc32} of what was sent")
        return
    check_etag(response, hashlib.md5(data, usedforsecurity=False).hexdigest(), what)


def check_etag(response: dict[str, Any], md5_hex: str, what: str) -> None:
    etag = str(response.get("ETag", "")).strip('"')
    if etag and "-" not in etag and etag != md5_hex:
        raise Transient(f"{what}: the store's ETag {etag} is not the MD5 {md5_hex} of what was sent")
