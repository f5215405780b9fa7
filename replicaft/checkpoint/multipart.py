"""Multipart uploads to an S3-API store, resumable after a crash of the uploader.

A file larger than ``part_bytes`` goes up as a multipart upload of
``part_bytes`` parts (larger when the file would need more than S3's 10 000), ``max_concurrency``
at a time. An uploader that crashed leaves the upload open on the server; the next one finds it
(ListMultipartUploads), keeps every part whose listed checksum (or, when the listing has none,
ETag as an MD5) matches the local part (ListParts) and sends only the rest. An upload the server
forgot (NoSuchUpload: it was aborted, or the server lost its state), or one an older uploader
opened without a CRC32, starts over.

Every part carries its CRC32 (parts.py says why, and checks the store's answers). The store's
calls, with their retry policy, are :class:`~replicaft.checkpoint.objectstore.ObjectStore`'s;
this module is what a multipart upload asks of them.
"""

from __future__ import annotations

import logging
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicaft.checkpoint.parts import PART_CHECKSUM, ListedPart, check_part, crc32_b64, listed_part_matches, part_size
from replicaft.errors import ObjectStoreError

if TYPE_CHECKING:
    from replicaft.checkpoint.objectstore import ObjectStore

logger = logging.getLogger(__name__)


class UploadGone(Exception):
    """The server no longer knows the multipart upload: start the file over."""


class MultipartUploads:
    """The multipart uploads of one store, ``max_concurrency`` parts at a time on its pool."""

    def __init__(self, store: ObjectStore, pool: ThreadPoolExecutor, where: str) -> None:
        self._store = store
        self._pool = pool
        self._where = where
        """How the store is named in messages."""

    def upload(self, path: Path, key: str, num_bytes: int, metadata: dict[str, str], *, resume: bool) -> list[int]:
        """Upload ``path`` in parts, continuing an upload left open where ``resume``; the parts'
        CRC32s, in order (for the composite check). Raises UploadGone when the server forgot it."""
        store = self._store
        bucket, client = store.location.bucket, store.client
        size = part_size(num_bytes, store.part_bytes)
        parts = [(n + 1, off, min(size, num_bytes - off)) for n, off in enumerate(range(0, num_bytes, size))]
        upload_id, done = self._open(key) if resume else (None, {})
        if upload_id is None:
            upload_id = store.call(
                f"start multipart {key}",
                lambda: client().create_multipart_upload(
                    Bucket=bucket, Key=key, Metadata=metadata, ChecksumAlgorithm=PART_CHECKSUM
                )["UploadId"],
            )
        else:
            logger.info(
                "%s: resuming the upload of %s: %d of %d parts already there", self._where, key, len(done), len(parts)
            )
        with open(path, "rb") as f:
            fd = f.fileno()

            def send(part: tuple[int, int, int]) -> tuple[int, dict[str, Any]]:
                number, offset, length = part
                data = os.pread(fd, length, offset)
                crc = zlib.crc32(data)
                sent = {"PartNumber": number, "ChecksumCRC32": crc32_b64(crc)}
                if number in done and listed_part_matches(done[number], data, crc):
                    return crc, {**sent, "ETag": done[number].etag}

                def put() -> dict[str, Any]:
                    r = client().upload_part(
                        Bucket=bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=data,
                        ChecksumAlgorithm=PART_CHECKSUM,
                        ChecksumCRC32=sent["ChecksumCRC32"],
                    )
                    check_part(r, data, sent["ChecksumCRC32"], f"{key} part {number}")
                    return {**sent, "ETag": r["ETag"]}

                return crc, store.call(f"PUT {key} part {number}/{len(parts)}", put)

            try:
                results = list(self._pool.map(send, parts))
            except ObjectStoreError:
                # Some stores answer a part of an upload they no longer know with a 500 rather
                # than NoSuchUpload (moto does, after a restart): ask before giving up.
                if not self._exists(key, upload_id):
                    raise UploadGone(key) from None
                raise
        store.call(
            f"complete multipart {key}",
            lambda: client().complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": [p for _, p in results]}
            ),
        )
        return [crc for crc, _ in results]

    def _open(self, key: str) -> tuple[str | None, dict[int, ListedPart]]:
        """The newest unfinished multipart upload of ``key`` with CRC32 part checksums, and its
        parts; every other one (older, or opened without CRC32 by an older uploader, whose parts
        the store would refuse to mix with ours) is aborted."""
        store = self._store
        bucket, client = store.location.bucket, store.client
        r = store.call(f"LIST uploads {key}", lambda: client().list_multipart_uploads(Bucket=bucket, Prefix=key))
        uploads = sorted(
            (u for u in r.get("Uploads", []) if u["Key"] == key), key=lambda u: u["Initiated"], reverse=True
        )
        usable = [u for u in uploads[:1] if u.get("ChecksumAlgorithm") == PART_CHECKSUM]
        for stale in uploads[len(usable) :]:
            store.call(
                f"abort {key}",
                lambda u=stale: client().abort_multipart_upload(Bucket=bucket, Key=key, UploadId=u["UploadId"]),
            )
        if not usable:
            return None, {}
        upload_id = usable[0]["UploadId"]
        done: dict[int, ListedPart] = {}
        marker = 0
        while True:
            page = store.call(
                f"LIST parts {key}",
                lambda m=marker: client().list_parts(Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=m),
            )
            done.update({p["PartNumber"]: ListedPart(p["ETag"], p.get("ChecksumCRC32")) for p in page.get("Parts", [])})
            if not page.get("IsTruncated"):
                return upload_id, done
            marker = page["NextPartNumberMarker"]

    def _exists(self, key: str, upload_id: str) -> bool:
        store = self._store
        r = store.call(
            f"LIST uploads {key}",
            lambda: store.client().list_multipart_uploads(Bucket=store.location.bucket, Prefix=key),
        )
        return any(u["UploadId"] == upload_id for u in r.get("Uploads", []))
