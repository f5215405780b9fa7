"""An S3-API object store as a checkpoint tier: verified, parallel, retried, resumable transfers of files.

**Client: boto3.** Three were weighed. ``obstore`` (Rust's object_store) is the fastest and
uploads in parallel by itself, but it owns its multipart uploads: there is no way to list
an unfinished upload's parts and continue it from another process, which is what
"resumable after a crash of the uploader" needs. ``s3fs`` (fsspec over aiobotocore) adds a
file-system abstraction, caching and an event loop we would have to own, and hides the same
multipart calls behind it. ``boto3`` exposes every S3 call we need as itself
(CreateMultipartUpload, UploadPart with its checksum, ListMultipartUploads, ListParts,
ranged GetObject), its clients are thread-safe, and it reads credentials the way every S3
tool does (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, instance roles). Its
own retries are turned off: retry.py decides, once, for every call.

**Integrity.** Every part of a multipart upload carries its CRC32 (S3's flexible checksums:
the server recomputes it and refuses a part that arrived damaged with ``BadDigest``, which is
retried), and the checksum the server answers with must be ours. A store that answers with no
checksum (one that predates them) is checked the old way: the part's ETag must be the MD5 of
what was sent. After the upload, the object's composite CRC32 (the CRC32 of its parts' CRC32s),
which the server computes from the bytes it stored, must be the one computed here. The whole
file's SHA-256, from the checkpoint's manifest, is stored as object metadata and checked after
every upload (size and digest) and every download (the downloaded bytes are hashed before
anything reads them). A truncated or altered object therefore fails its download, never its load.

Why CRC32 and not Content-MD5: parts.py.

**Resuming**: multipart.py.

**Downloads** are ranged GETs of ``part_bytes``, ``max_concurrency`` at a time, each written
at its offset; a short body is a transient failure (retried), not a short file.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from replicaft.checkpoint.durable import READ_BYTES
from replicaft.checkpoint.multipart import MultipartUploads, UploadGone
from replicaft.checkpoint.parts import (
    Transient,
    check_etag,
    composite_crc32,
    stored_composite_crc32,
)
from replicaft.checkpoint.retry import RetryPolicy, next_delay
from replicaft.errors import CheckpointCorrupt, ObjectStoreError, ObjectStoreRefused

logger = logging.getLogger(__name__)

T = TypeVar("T")
PART_BYTES = 8 * 1024 * 1024
"""S3 allows parts of 5 MiB to 5 GiB and 10 000 parts. 8 MiB and 10 in flight are boto3's own
``TransferConfig`` defaults: measured against moto on loopback, 8 MiB parts uploaded 256 MiB
faster than 16 MiB ones (the last, slowest parts finish sooner), and ten in flight hold at most
80 MiB in memory. A file of more than 10 000 parts gets larger parts (:func:`part_size`)."""
MAX_CONCURRENCY = 10
SHA256_META = "sha256"
_FATAL_CODES = {
    "InvalidAccessKeyId": "the access key is not known to the store; check AWS_ACCESS_KEY_ID",
    "SignatureDoesNotMatch": "the secret key does not match the access key; check AWS_SECRET_ACCESS_KEY",
    "AccessDenied": "the credentials may not do this; grant s3:GetObject, PutObject, ListBucket, DeleteObject",
    "Forbidden": "the store refused the credentials (a HEAD has no body to say why); check AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, and that they may read and write the bucket",
    "NoSuchBucket": "the bucket does not exist; create it, or fix the checkpoint object store URL",
    "InvalidBucketName": "the bucket name is not valid",
}
_TRANSIENT_4XX = ("RequestTimeout", "SlowDown", "BadDigest")
"""4xx answers worth retrying: ``BadDigest`` is a part whose bytes arrived damaged."""


@dataclass(frozen=True, slots=True)
class StoreLocation:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> StoreLocation:
        if not url.startswith("s3://"):
            raise ObjectStoreError(f"checkpoint object store {url!r} is not an s3:// URL (s3://bucket/prefix)")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not 3 <= len(bucket) <= 63:
            raise ObjectStoreError(
                f"checkpoint object store {url!r}: bucket name {bucket!r} must have 3 to 63 characters"
            )
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)


class ObjectStore:
    """One bucket and prefix of an S3-API store. Thread-safe; no I/O until the first call."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        part_bytes: int = PART_BYTES,
        max_concurrency: int = MAX_CONCURRENCY,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.location = StoreLocation.parse(url)
        self.url = url
        self.endpoint_url = endpoint_url
        if part_bytes < 5 * 1024 * 1024 or max_concurrency < 1:
            raise ObjectStoreError(
                f"part_bytes={part_bytes} (S3 needs >= 5 MiB) / max_concurrency={max_concurrency} (>= 1)"
            )
        self.part_bytes = part_bytes
        self.max_concurrency = max_concurrency
        self.retry = retry or RetryPolicy()
        self._client_lock = threading.Lock()
        self._client_obj: Any = None
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="replicaft-s3")
        self._uploads = MultipartUploads(self, self._pool, self.where)

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r}, endpoint_url={self.endpoint_url!r})"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- calls, with the retry policy --------------------------------------------------

    def client(self) -> Any:
        with self._client_lock:
            if self._client_obj is None:
                import boto3  # ~0.3 s of import: paid only by jobs with an object store
                from botocore.config import Config

                self._client_obj = boto3.session.Session().client(
                    "s3",
                    endpoint_url=self.endpoint_url,
                    config=Config(
                        retries={"total_max_attempts": 1},
                        max_pool_connections=2 * self.max_concurrency,
                        connect_timeout=10,
                        read_timeout=60,
                        request_checksum_calculation="when_required",
                        response_checksum_validation="when_required",
                    ),
                )
            return self._client_obj

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one request), retrying transient failures under the policy."""
        from botocore import exceptions as bex

        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except bex.ClientError as e:
                code = e.response.get("Error", {}).get("Code", "?")
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if code == "NoSuchUpload":
                    raise UploadGone(what) from e
                if code in _FATAL_CODES or (400 <= status < 500 and code not in _TRANSIENT_4XX):
                    fix = _FATAL_CODES.get(code, _FATAL_CODES["Forbidden"] if status == 403 else "")
                    raise ObjectStoreRefused(
                        f"{self.where}: {what} was refused: {code} (HTTP {status}){'; ' + fix if fix else ''}"
                    ) from e
                error: Exception = e
            except bex.NoCredentialsError as e:
                raise ObjectStoreRefused(
                    f"{self.where}: no credentials for {what}; set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or a profile or role boto3 finds)"
                ) from e
            except (
                bex.ConnectionError,
                bex.HTTPClientError,
                bex.IncompleteReadError,
                bex.ResponseStreamingError,
                Transient,
            ) as e:
                error = e
            delay = next_delay(self.retry, attempt=attempt, started=started, now=time.monotonic(), draw=random.random())
            if delay is None:
                raise ObjectStoreError(
                    f"{self.where}: {what} failed {attempt} times in {time.monotonic() - started:.1f}s; "
                    f"last: {type(error).__name__}: {error}"
                ) from error
            logger.warning(
                "%s: %s failed (%s: %s); retry %d in %.2fs",
                self.where,
                what,
                type(error).__name__,
                error,
                attempt,
                delay,
            )
            time.sleep(delay)

    @property
    def where(self) -> str:
        """The store as messages name it: its URL, and the endpoint if not the default."""
        return f"object store {self.url}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    # -- objects -----------------------------------------------------------------------

    def head(self, key: str) -> tuple[int, dict[str, str]] | None:
        """Size and user metadata of ``key``, or None if there is no such object."""
        found = self._head(key)
        return None if found is None else (int(found["ContentLength"]), dict(found.get("Metadata", {})))

    def _head(self, key: str) -> dict[str, Any] | None:
        """The HEAD response of ``key`` with its checksum asked for, or None if there is no such object."""
        from botocore import exceptions as bex

        def head() -> dict[str, Any] | None:
            try:
                return self.client().head_object(Bucket=self.location.bucket, Key=key, ChecksumMode="ENABLED")
            except bex.ClientError as e:
                if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return None
                raise

        return self.call(f"HEAD {key}", head)

    def put_bytes(self, key: str, data: bytes, sha256: str) -> None:
        md5 = hashlib.md5(data, usedforsecurity=False)

        def put() -> None:
            r = self.client().put_object(
                Bucket=self.location.bucket,
                Key=key,
                Body=data,
                ContentMD5=base64.b64encode(md5.digest()).decode(),
                Metadata={SHA256_META: sha256},
            )
            check_etag(r, md5.hexdigest(), key)

        self.call(f"PUT {key}", put)

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        def get() -> bytes:
            r = self.client().get_object(Bucket=self.location.bucket, Key=key)
            if int(r["ContentLength"]) > max_bytes:
                raise ObjectStoreError(f"{key} is {r['ContentLength']} bytes, more than the {max_bytes} expected")
            data = r["Body"].read()
            if len(data) != int(r["ContentLength"]):
                raise Transient(f"GET {key} returned {len(data)} of {r['ContentLength']} bytes")
            return data

        return self.call(f"GET {key}", get)

    def list_keys(self, prefix: str) -> list[str]:
        def page(token: str | None) -> dict[str, Any]:
            kwargs = {"Bucket": self.location.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            return self.client().list_objects_v2(**kwargs)

        keys, token = [], None
        while True:
            r = self.call(f"LIST {prefix}", functools.partial(page, token))
            keys += [o["Key"] for o in r.get("Contents", [])]
            token = r.get("NextContinuationToken")
            if not r.get("IsTruncated") or not token:
                return keys

    def delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self.call(
                f"DELETE {len(batch)} objects",
                lambda b=batch: self.client().delete_objects(Bucket=self.location.bucket, Delete={"Objects": b}),
            )

    # -- files ------------------------------------------------------------------------

    def upload_file(self, path: Path, key: str, *, num_bytes: int, sha256: str) -> None:
        """Upload ``path`` (``num_bytes``, ``sha256`` from its manifest) as ``key``; verified.

        Blocks until done. Raises ObjectStoreError when the store refuses it or keeps failing.
        """
        part_crcs: list[int] | None = None
        if num_bytes <= self.part_bytes:
            self.put_bytes(key, path.read_bytes(), sha256)
        else:
            try:
                part_crcs = self._uploads.upload(path, key, num_bytes, {SHA256_META: sha256}, resume=True)
            except UploadGone:
                logger.warning("%s: the server forgot the multipart upload of %s; uploading it again", self.where, key)
                part_crcs = self._uploads.upload(path, key, num_bytes, {SHA256_META: sha256}, resume=False)
        found = self._head(key)
        if found is None:
            raise ObjectStoreError(f"{self.where}: {key} is missing right after its upload")
        size, meta = int(found["ContentLength"]), found.get("Metadata", {})
        if size != num_bytes or meta.get(SHA256_META) != sha256:
            raise ObjectStoreError(
                f"{self.where}: {key} reads back as {size} bytes with sha256 "
                f"{meta.get(SHA256_META)!r} after its upload, not {num_bytes} bytes with sha256 {sha256[:8]}…"
            )
        stored = stored_composite_crc32(found)
        if part_crcs is not None and stored is not None and stored != composite_crc32(part_crcs):
            # Deleted, or the next attempt would take it for an upload finished before a crash
            # (objecttier.py skips a file whose size and SHA-256 metadata match).
            self.delete_keys([key])
            raise ObjectStoreError(
                f"{self.where}: {key} was stored with composite CRC32 {stored}, but its "
                f"{len(part_crcs)} parts as read from {path} give {composite_crc32(part_crcs)} "
                "(the store holds other bytes); deleted, to be uploaded again by the next attempt"
            )

    def download_file(self, key: str, dest: Path, *, num_bytes: int, sha256: str) -> None:
        """Download ``key`` into ``dest`` with parallel ranged GETs; verify size and SHA-256.

        Raises CheckpointCorrupt when the object is not what the manifest says (truncated,
        altered), ObjectStoreError when the store keeps failing.
        """
        found = self.head(key)
        if found is None:
            raise CheckpointCorrupt(f"{self.where}: {key} is missing")
        if found[0] != num_bytes:
            raise CheckpointCorrupt(
                f"{self.where}: {key} is {found[0]} bytes, the manifest says {num_bytes} (truncated?)"
            )
        ranges = [(off, min(self.part_bytes, num_bytes - off)) for off in range(0, num_bytes, self.part_bytes)]
        with open(dest, "wb") as f:
            f.truncate(num_bytes)
            fd = f.fileno()

            def fetch(rng: tuple[int, int]) -> None:
                offset, length = rng

                def get() -> None:
                    r = self.client().get_object(
                        Bucket=self.location.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
                    )
                    data = r["Body"].read()
                    if len(data) != length:
                        raise Transient(f"GET {key} bytes {offset}+{length} returned {len(data)} bytes")
                    os.pwrite(fd, data, offset)

                self.call(f"GET {key} bytes {offset}+{length}", get)

            list(self._pool.map(fetch, ranges))
            f.flush()
            os.fsync(fd)
        h = hashlib.sha256()
        with open(dest, "rb") as f:
            while chunk := f.read(READ_BYTES):
                h.update(chunk)
        if h.hexdigest() != sha256:
            raise CheckpointCorrupt(
                f"{self.where}: {key} downloaded with sha256 {h.hexdigest()[:8]}…, the manifest "
                f"says {sha256[:8]}… (the object is damaged)"
            )
