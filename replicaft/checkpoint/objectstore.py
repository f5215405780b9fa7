"""An S3-API object store as a checkpoint tier: verified, parallel, retried, resumable transfers of files.

**Client: boto3.** Three were weighed. ``obstore`` (Rust's object_store) is the fastest and
uploads in parallel by itself, but it owns its multipart uploads: there is no way to list
an unfinished upload's parts and continue it from another process, which is what
"resumable after a crash of the uploader" needs. ``s3fs`` (fsspec over aiobotocore) adds a
file-system abstraction, caching and an event loop we would have to own, and hides the same
multipart calls behind it. ``boto3`` exposes every S3 call we need as itself
(CreateMultipartUpload, UploadPart with Content-MD5, ListMultipartUploads, ListParts,
ranged GetObject), its clients are thread-safe, and it reads credentials the way every S3
tool does (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, instance roles). Its
own retries are turned off: retry.py decides, once, for every call.

**Integrity.** Every part is sent with its Content-MD5 (the server rejects a part that
arrived damaged) and its returned ETag is compared with that MD5 (a server that accepted
something else is caught). The whole file's SHA-256, from the checkpoint's manifest, is
stored as object metadata and checked after every upload (size and digest) and every
download (the downloaded bytes are hashed before anything reads them). A truncated or
altered object therefore fails its download, never its load.

**Resuming.** A file larger than ``part_bytes`` goes up as a multipart upload of
``part_bytes`` parts, ``max_concurrency`` at a time. An uploader that crashed leaves the
upload open on the server; the next one finds it (ListMultipartUploads), keeps every part
whose ETag matches the local part's MD5 (ListParts) and sends only the rest. An upload the
server forgot (NoSuchUpload: it was aborted, or the server lost its state) starts over.

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
from replicaft.checkpoint.retry import RetryPolicy, next_delay
from replicaft.errors import CheckpointCorrupt, ObjectStoreError

logger = logging.getLogger(__name__)

T = TypeVar("T")
PART_BYTES = 16 * 1024 * 1024
"""S3 allows parts of 5 MiB to 5 GiB and 10 000 parts: 16 MiB parts reach 156 GiB files, and
eight in flight keep a link busy without holding more than 128 MiB in memory."""
MAX_PARTS = 10_000
MAX_CONCURRENCY = 8
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
            raise ObjectStoreError(f"checkpoint object store {url!r}: bucket name {bucket!r} must have 3 to 63 characters")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)


class _Transient(Exception):
    """A failure worth retrying that boto3 does not raise itself (a short body, a bad ETag)."""


class _UploadGone(Exception):
    """The server no longer knows the multipart upload: start the file over."""


class ObjectStore:
    """One bucket and prefix of an S3-API store. Thread-safe; no I/O until the first call."""

    def __init__(
        self, url: str, *, endpoint_url: str | None = None, part_bytes: int = PART_BYTES,
        max_concurrency: int = MAX_CONCURRENCY, retry: RetryPolicy | None = None,
    ) -> None:
        self.location = StoreLocation.parse(url)
        self.url = url
        self.endpoint_url = endpoint_url
        if part_bytes < 5 * 1024 * 1024 or max_concurrency < 1:
            raise ObjectStoreError(f"part_bytes={part_bytes} (S3 needs >= 5 MiB) / max_concurrency={max_concurrency} (>= 1)")
        self.part_bytes = part_bytes
        self.max_concurrency = max_concurrency
        self.retry = retry or RetryPolicy()
        self._client_lock = threading.Lock()
        self._client_obj: Any = None
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="replicaft-s3")

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
                    "s3", endpoint_url=self.endpoint_url,
                    config=Config(
                        retries={"total_max_attempts": 1}, max_pool_connections=2 * self.max_concurrency,
                        connect_timeout=10, read_timeout=60, request_checksum_calculation="when_required",
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
                    raise _UploadGone(what) from e
                if code in _FATAL_CODES or (400 <= status < 500 and code not in ("RequestTimeout", "SlowDown")):
                    fix = _FATAL_CODES.get(code, _FATAL_CODES["Forbidden"] if status == 403 else "")
                    raise ObjectStoreError(f"{self._where()}: {what} was refused: {code} (HTTP {status}){'; ' + fix if fix else ''}") from e
                error: Exception = e
            except bex.NoCredentialsError as e:
                raise ObjectStoreError(f"{self._where()}: no credentials for {what}; set AWS_ACCESS_KEY_ID and "
                                       "AWS_SECRET_ACCESS_KEY (or a profile or role boto3 finds)") from e
            except (bex.ConnectionError, bex.HTTPClientError, bex.IncompleteReadError, bex.ResponseStreamingError,
                    _Transient) as e:
                error = e
            delay = next_delay(self.retry, attempt=attempt, started=started, now=time.monotonic(), draw=random.random())
            if delay is None:
                raise ObjectStoreError(f"{self._where()}: {what} failed {attempt} times in {time.monotonic() - started:.1f}s; "
                                       f"last: {type(error).__name__}: {error}") from error
            logger.warning("%s: %s failed (%s: %s); retry %d in %.2fs", self._where(), what, type(error).__name__,
                           error, attempt, delay)
            time.sleep(delay)

    def _where(self) -> str:
        return f"object store {self.url}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    # -- objects -----------------------------------------------------------------------

    def head(self, key: str) -> tuple[int, dict[str, str]] | None:
        """Size and user metadata of ``key``, or None if there is no such object."""
        from botocore import exceptions as bex

        def head() -> tuple[int, dict[str, str]] | None:
            try:
                r = self.client().head_object(Bucket=self.location.bucket, Key=key)
            except bex.ClientError as e:
                if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return None
                raise
            return int(r["ContentLength"]), dict(r.get("Metadata", {}))

        return self.call(f"HEAD {key}", head)

    def put_bytes(self, key: str, data: bytes, sha256: str) -> None:
        md5 = hashlib.md5(data, usedforsecurity=False)

        def put() -> None:
            r = self.client().put_object(Bucket=self.location.bucket, Key=key, Body=data,
                                         ContentMD5=base64.b64encode(md5.digest()).decode(), Metadata={SHA256_META: sha256})
            _check_etag(r, md5.hexdigest(), key)

        self.call(f"PUT {key}", put)

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        def get() -> bytes:
            r = self.client().get_object(Bucket=self.location.bucket, Key=key)
            if int(r["ContentLength"]) > max_bytes:
                raise ObjectStoreError(f"{key} is {r['ContentLength']} bytes, more than the {max_bytes} expected")
            data = r["Body"].read()
            if len(data) != int(r["ContentLength"]):
                raise _Transient(f"GET {key} returned {len(data)} of {r['ContentLength']} bytes")
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
            self.call(f"DELETE {len(batch)} objects",
                      lambda b=batch: self.client().delete_objects(Bucket=self.location.bucket, Delete={"Objects": b}))

    # -- files ------------------------------------------------------------------------

    def upload_file(self, path: Path, key: str, *, num_bytes: int, sha256: str) -> None:
        """Upload ``path`` (``num_bytes``, ``sha256`` from its manifest) as ``key``; verified.

        Blocks until done. Raises ObjectStoreError when the store refuses it or keeps failing.
        """
        if num_bytes <= self.part_bytes:
            self.put_bytes(key, path.read_bytes(), sha256)
        else:
            try:
                self._multipart(path, key, num_bytes, sha256, resume=True)
            except _UploadGone:
                logger.warning("%s: the server forgot the multipart upload of %s; uploading it again", self._where(), key)
                self._multipart(path, key, num_bytes, sha256, resume=False)
        found = self.head(key)
        if found is None or found[0] != num_bytes or found[1].get(SHA256_META) != sha256:
            raise ObjectStoreError(f"{self._where()}: {key} reads back as {found!r} after its upload, not {num_bytes} "
                                   f"bytes with sha256 {sha256[:8]}…")

    def _multipart(self, path: Path, key: str, num_bytes: int, sha256: str, *, resume: bool) -> None:
        bucket, client = self.location.bucket, self.client
        parts = [(n + 1, off, min(self.part_bytes, num_bytes - off)) for n, off in enumerate(range(0, num_bytes, self.part_bytes))]
        if len(parts) > MAX_PARTS:
            raise ObjectStoreError(f"{path} needs {len(parts)} parts of {self.part_bytes} bytes; S3 allows {MAX_PARTS}")
        upload_id, done = self._open_upload(key) if resume else (None, {})
        if upload_id is None:
            upload_id = self.call(f"start multipart {key}", lambda: client().create_multipart_upload(
                Bucket=bucket, Key=key, Metadata={SHA256_META: sha256})["UploadId"])
        else:
            logger.info("%s: resuming the upload of %s: %d of %d parts already there", self._where(), key,
                        len(done), len(parts))
        with open(path, "rb") as f:
            fd = f.fileno()

            def send(part: tuple[int, int, int]) -> dict[str, Any]:
                number, offset, length = part
                data = os.pread(fd, length, offset)
                md5 = hashlib.md5(data, usedforsecurity=False)
                if done.get(number) == md5.hexdigest():
                    return {"PartNumber": number, "ETag": f'"{md5.hexdigest()}"'}

                def put() -> dict[str, Any]:
                    r = client().upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data,
                                             ContentMD5=base64.b64encode(md5.digest()).decode())
                    _check_etag(r, md5.hexdigest(), f"{key} part {number}")
                    return {"PartNumber": number, "ETag": r["ETag"]}

                return self.call(f"PUT {key} part {number}/{len(parts)}", put)

            try:
                sent = list(self._pool.map(send, parts))
            except ObjectStoreError:
                # Some stores answer a part of an upload they no longer know with a 500 rather
                # than NoSuchUpload (moto does, after a restart): ask before giving up.
                if not self._upload_exists(key, upload_id):
                    raise _UploadGone(key) from None
                raise
        self.call(f"complete multipart {key}", lambda: client().complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": sent}))

    def _open_upload(self, key: str) -> tuple[str | None, dict[int, str]]:
        """The newest unfinished multipart upload of ``key`` and its parts' MD5s; older ones are aborted."""
        bucket, client = self.location.bucket, self.client
        r = self.call(f"LIST uploads {key}", lambda: client().list_multipart_uploads(Bucket=bucket, Prefix=key))
        uploads = sorted((u for u in r.get("Uploads", []) if u["Key"] == key), key=lambda u: u["Initiated"], reverse=True)
        if not uploads:
            return None, {}
        for stale in uploads[1:]:
            self.call(f"abort {key}", lambda u=stale: client().abort_multipart_upload(Bucket=bucket, Key=key, UploadId=u["UploadId"]))
        upload_id = uploads[0]["UploadId"]
        done: dict[int, str] = {}
        marker = 0
        while True:
            page = self.call(f"LIST parts {key}", lambda m=marker: client().list_parts(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=m))
            done.update({p["PartNumber"]: p["ETag"].strip('"') for p in page.get("Parts", [])})
            if not page.get("IsTruncated"):
                return upload_id, done
            marker = page["NextPartNumberMarker"]

    def _upload_exists(self, key: str, upload_id: str) -> bool:
        r = self.call(f"LIST uploads {key}", lambda: self.client().list_multipart_uploads(Bucket=self.location.bucket, Prefix=key))
        return any(u["UploadId"] == upload_id for u in r.get("Uploads", []))

    def download_file(self, key: str, dest: Path, *, num_bytes: int, sha256: str) -> None:
        """Download ``key`` into ``dest`` with parallel ranged GETs; verify size and SHA-256.

        Raises CheckpointCorrupt when the object is not what the manifest says (truncated,
        altered), ObjectStoreError when the store keeps failing.
        """
        found = self.head(key)
        if found is None:
            raise CheckpointCorrupt(f"{self._where()}: {key} is missing")
        if found[0] != num_bytes:
            raise CheckpointCorrupt(f"{self._where()}: {key} is {found[0]} bytes, the manifest says {num_bytes} (truncated?)")
        ranges = [(off, min(self.part_bytes, num_bytes - off)) for off in range(0, num_bytes, self.part_bytes)]
        with open(dest, "wb") as f:
            f.truncate(num_bytes)
            fd = f.fileno()

            def fetch(rng: tuple[int, int]) -> None:
                offset, length = rng

                def get() -> None:
                    r = self.client().get_object(Bucket=self.location.bucket, Key=key,
                                                 Range=f"bytes={offset}-{offset + length - 1}")
                    data = r["Body"].read()
                    if len(data) != length:
                        raise _Transient(f"GET {key} bytes {offset}+{length} returned {len(data)} bytes")
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
            raise CheckpointCorrupt(f"{self._where()}: {key} downloaded with sha256 {h.hexdigest()[:8]}…, the manifest "
                                    f"says {sha256[:8]}… (the object is damaged)")


def _check_etag(response: dict[str, Any], md5_hex: str, what: str) -> None:
    etag = str(response.get("ETag", "")).strip('"')
    if etag and "-" not in etag and etag != md5_hex:
        raise _Transient(f"{what}: the store's ETag {etag} is not the MD5 {md5_hex} of what was sent")
