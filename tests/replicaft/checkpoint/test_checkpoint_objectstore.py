"""The object-store tier against a real S3-compatible server on loopback, and its failures (issue 22).

The server is SeaweedFS (`weed server -s3`), in its own process, started once for this module by
chaos/s3_server.py, with the fault proxy of chaos/s3_fault_proxy.py in front: a 500 on one part,
a response cut short, an object truncated in the bucket, the uploader
killed mid-upload, the server killed mid-upload, wrong credentials.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import socket
import textwrap
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import spawn_python

import chaos.s3_server as s3_server
from chaos.s3_server import S3Server
from replicaft.checkpoint import CheckpointReader, CheckpointWriter, SaveResult
from replicaft.checkpoint.objectstore import ObjectStore
from replicaft.checkpoint.objecttier import Uploader, stored_checkpoints
from replicaft.checkpoint.options import RetentionPolicy
from replicaft.checkpoint.parts import (
    MAX_PARTS,
    check_part,
    composite_crc32,
    part_size,
    stored_composite_crc32,
)
from replicaft.checkpoint.retry import RetryPolicy
from replicaft.state.flat import digest, flatten
from replicaft.transfer.snapshot import Snapshot

BUCKET = "replicaft-test"
MIB = 1024 * 1024
PART = 5 * MIB
WAIT_S = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    s = S3Server(buckets=[BUCKET]).start()
    yield s
    s.close()


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "replicaft")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "replicaft")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def store_for(
    server: S3Server, prefix: str | None = None, deadline_s: float = 30.0, max_attempts: int = 8
) -> ObjectStore:
    return ObjectStore(
        f"s3://{BUCKET}/{prefix or uuid.uuid4().hex}",
        endpoint_url=server.endpoint,
        part_bytes=PART,
        retry=RetryPolicy(base_delay_s=0.05, max_delay_s=1.0, deadline_s=deadline_s, max_attempts=max_attempts),
    )


def state(step: int, frozen_mib: int = 12) -> dict[str, object]:
    frozen = torch.arange(frozen_mib * MIB // 4, dtype=torch.float32)
    return {"replicaft": {"step": step}, "model": {"embedding": frozen, "head": torch.full((1000,), float(step))}}


def save(writer: CheckpointWriter, step: int, frozen_mib: int = 12) -> SaveResult:
    snap = Snapshot.capture(flatten(state(step, frozen_mib)), step=step, quorum_id=1, replica_id="g0")
    result = writer.save_async(snap, step).wait(WAIT_S)
    assert result.ok, result.reason
    return result


def uploaded(writer: CheckpointWriter) -> list[tuple[int, bool, str]]:
    assert writer.uploader is not None and writer.uploader.wait_idle(WAIT_S)
    return [(u.step, u.ok, u.reason) for u in writer.uploader.pop_finished()]


@pytest.mark.usefixtures("credentials")
def test_checkpoints_upload_in_background_and_restore_on_a_new_machine(server: S3Server, tmp_path: Path) -> None:
    store = store_for(server)
    with CheckpointWriter(tmp_path / "a", object_store=store, keep_last=5) as writer:
        base, increment = save(writer, 10), save(writer, 20)
        results = uploaded(writer)
    assert [(s, ok) for s, ok, _ in results] == [(10, True), (20, True)] and increment.kind == "increment"
    assert stored_checkpoints(store) == [increment.path.name, base.path.name]  # type: ignore[union-attr]

    fresh = tmp_path / "new-machine"
    loaded = CheckpointReader(fresh, object_store=store_for(server, store.location.prefix)).load_latest_valid()

    assert loaded is not None and loaded.step == 20 and digest(flatten(loaded.state)) == digest(flatten(state(20)))
    assert sorted(p.name for p in fresh.iterdir()) == sorted([base.path.name, increment.path.name])  # type: ignore[union-attr]
    assert all(CheckpointReader.verify(p)[0] for p in fresh.iterdir())


@pytest.mark.usefixtures("credentials")
def test_a_500_on_one_part_and_a_cut_response_are_retried(server: S3Server, tmp_path: Path) -> None:
    store = store_for(server)
    before = server.faults(fail_parts=1)["parts"]
    with CheckpointWriter(tmp_path / "a", object_store=store) as writer:
        save(writer, 10)
        assert [ok for _, ok, _ in uploaded(writer)] == [True]
    counters = server.faults(truncate_gets=1)
    assert counters["fail_parts"] == 0 and counters["parts"] - before == 4  # 3 parts of 12 MiB, one sent twice

    loaded = CheckpointReader(tmp_path / "b", object_store=store).load_latest_valid()
    assert loaded is not None and loaded.step == 10 and server.faults()["truncate_gets"] == 0


@pytest.mark.usefixtures("credentials")
def test_truncated_object_in_the_store_fails_its_download_and_resume_falls_back(
    server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_for(server)
    with CheckpointWriter(tmp_path / "a", object_store=store, keep_last=5) as writer:
        save(writer, 10)
        newest = save(writer, 20)
        uploaded(writer)
    assert newest.path is not None
    key = store.location.key(newest.path.name, "pack-0.bin")
    data = server.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    server.client().put_object(Bucket=BUCKET, Key=key, Body=data[: len(data) // 2])  # someone truncated it

    with caplog.at_level(logging.WARNING):
        loaded = CheckpointReader(tmp_path / "b", object_store=store).load_latest_valid()
    assert loaded is not None and loaded.step == 10
    assert f"{key} is {len(data) // 2} bytes, the manifest says {len(data)} (truncated?)" in caplog.text


UPLOADER_CHILD = textwrap.dedent(
    """
    import sys, torch
    from replicaft.checkpoint import CheckpointWriter
    from replicaft.checkpoint.objectstore import ObjectStore
    from replicaft.state.flat import flatten
    from replicaft.transfer.snapshot import Snapshot

    store = ObjectStore(sys.argv[2], endpoint_url=sys.argv[3], part_bytes=5 * 1024 * 1024, max_concurrency=2)
    writer = CheckpointWriter(sys.argv[1], object_store=store)
    state = {"model": {"w": torch.arange(10 * 1024 * 1024, dtype=torch.float32)}}
    print(writer.save_async(Snapshot.capture(flatten(state), step=10, quorum_id=1, replica_id="g0"),
    10).wait(60).status,
          flush=True)
    writer.uploader.wait_idle(600)
    """
)


def wait_for_parts(server: S3Server, at_least: float, timeout_s: float = WAIT_S) -> float:
    deadline = time.monotonic() + timeout_s
    while (parts := server.faults()["parts"]) < at_least:
        assert time.monotonic() < deadline, f"only {parts} parts uploaded after {timeout_s}s"
        time.sleep(0.05)
    return parts


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="SeaweedFS 4.48 lists neither an upload's ChecksumAlgorithm nor its parts' ChecksumCRC32, so "
    "MultipartUploads._open (multipart.py) takes the upload for one opened without CRC32, aborts it and sends "
    "every part again: the upload completes, the resume does not happen (issue 40; AWS and moto list both)",
)
@pytest.mark.usefixtures("credentials")
def test_uploader_killed_mid_upload_resumes_with_the_parts_already_sent(
    server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_for(server)
    before = server.faults(delay_parts_s=0.3)["parts"]
    child = spawn_python("-c", UPLOADER_CHILD, str(tmp_path), store.url, server.endpoint, name="uploader")
    child.wait_for_line(lambda line: line == "published", WAIT_S, what="the local publish")
    wait_for_parts(server, before + 3)
    child.send_signal(signal.SIGKILL)
    child.wait_exit(WAIT_S)
    sent_by_child = server.faults(delay_parts_s=0)["parts"] - before
    assert stored_checkpoints(store) == []  # killed before the manifest went up

    uploader = Uploader(store, tmp_path, retention=RetentionPolicy())
    with caplog.at_level(logging.INFO, logger="replicaft.checkpoint.objectstore"):
        assert uploader.resume_pending() == 1 and uploader.wait_idle(WAIT_S)
    assert [r.ok for r in uploader.pop_finished()] == [True]
    sent_after = server.faults()["parts"] - before - sent_by_child
    reused = re.search(r"resuming the upload of \S+: (\d+) of (\d+) parts already there", caplog.text)
    assert reused is not None and int(reused.group(1)) >= 1, caplog.text
    assert sent_after == int(reused.group(2)) - int(reused.group(1))  # only the missing parts went again
    loaded = CheckpointReader(tmp_path / "restored", object_store=store).load_latest_valid()
    assert loaded is not None and loaded.state["model"]["w"].equal(torch.arange(10 * MIB, dtype=torch.float32))


@pytest.mark.slow
@pytest.mark.usefixtures("credentials")
def test_server_killed_mid_upload_and_restarted_the_upload_completes(tmp_path: Path) -> None:
    server = S3Server(buckets=[BUCKET]).start()
    try:
        # SeaweedFS takes seconds to restart: the retries must span it, not the 8 attempts' ~2 s.
        store = store_for(server, deadline_s=WAIT_S, max_attempts=1000)
        server.faults(delay_parts_s=0.3)
        with CheckpointWriter(tmp_path / "a", object_store=store) as writer:
            save(writer, 10, frozen_mib=24)
            wait_for_parts(server, 2)
            server.kill()  # SIGKILL mid-upload; the proxy answers 503 until it is back
            server.start()
            results = uploaded(writer)
        assert [(s, ok) for s, ok, _ in results] == [(10, True)], results
        loaded = CheckpointReader(tmp_path / "b", object_store=store).load_latest_valid()
        assert loaded is not None and digest(flatten(loaded.state)) == digest(flatten(state(10, frozen_mib=24)))
    finally:
        server.close()


def test_wrong_credentials_fail_at_once_with_the_fix_and_the_local_checkpoint_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = S3Server(buckets=[BUCKET], auth=True).start()
    try:
        access, secret = server.create_credentials()
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", access)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        started = time.monotonic()
        with CheckpointWriter(tmp_path, object_store=store_for(server)) as writer:
            result = save(writer, 10)
            ((step, ok, reason),) = uploaded(writer)
        assert time.monotonic() - started < 20  # refused, not retried for the deadline
        assert (
            not ok and "(HTTP 403); the store refused the credentials" in reason and "check AWS_ACCESS_KEY_ID" in reason
        )
        assert "the local checkpoint is unaffected" in reason and CheckpointReader.verify(result.path)[0]  # type: ignore[arg-type]

        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        with CheckpointWriter(tmp_path, object_store=store_for(server)) as writer:
            save(writer, 20)
            assert [(s, ok) for s, ok, _ in uploaded(writer)] == [(10, True), (20, True)]  # 10 resumed at start
    finally:
        server.close()


@pytest.mark.usefixtures("credentials")
def test_multipart_upload_is_checked_against_the_composite_crc32_the_server_computed(
    server: S3Server, tmp_path: Path
) -> None:
    store = store_for(server)
    path = tmp_path / "pack.bin"
    path.write_bytes(os.urandom(2 * PART + 12345))
    data = path.read_bytes()
    key = store.location.key("pack.bin")
    store.upload_file(path, key, num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    head = server.client().head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    crcs = [zlib.crc32(data[off : off + PART]) for off in range(0, len(data), PART)]
    assert head["ChecksumCRC32"].partition("-")[0] == composite_crc32(crcs)  # the check upload_file makes is live
    assert composite_crc32(crcs) != composite_crc32([zlib.crc32(b"other" + data[:PART]), *crcs[1:]])


@pytest.mark.usefixtures("credentials")
def test_an_upload_opened_without_crc32_is_aborted_and_the_file_sent_again(server: S3Server, tmp_path: Path) -> None:
    store = store_for(server)
    path = tmp_path / "pack.bin"
    path.write_bytes(os.urandom(2 * PART))
    data = path.read_bytes()
    key = store.location.key("pack.bin")
    client = server.client()
    old = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]  # an older uploader's, MD5 parts
    client.upload_part(Bucket=BUCKET, Key=key, UploadId=old, PartNumber=1, Body=data[:PART])

    store.upload_file(path, key, num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    assert [u["UploadId"] for u in client.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", [])] == []
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data
    assert "ChecksumCRC32" in client.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")  # not the old upload


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ({"ChecksumCRC32": "AAAAAQ==", "ETag": '"whatever"'}, True),  # the store checked our CRC32
        ({"ChecksumCRC32": "AAAAAg==", "ETag": '"whatever"'}, False),  # it computed another one
        ({"ETag": f'"{hashlib.md5(b"part").hexdigest()}"'}, True),  # no checksums: the ETag is the MD5
        ({"ETag": f'"{hashlib.md5(b"other").hexdigest()}"'}, False),
    ],
)
def test_a_part_answer_must_carry_our_crc32_or_else_our_md5(response: dict[str, str], ok: bool) -> None:
    if ok:
        check_part(response, b"part", "AAAAAQ==", "k part 1")
    else:
        with pytest.raises(Exception, match="k part 1: the store's"):
            check_part(response, b"part", "AAAAAQ==", "k part 1")


@pytest.mark.parametrize(
    ("num_bytes", "expected"),
    [
        (10 * MIB, 8 * MIB),
        (10_000 * 8 * MIB, 8 * MIB),
        (10_000 * 8 * MIB + 1, 9 * MIB),
        (200 * 1024 * MIB, 21 * MIB),
    ],
)
def test_part_size_fits_any_file_in_ten_thousand_parts(num_bytes: int, expected: int) -> None:
    size = part_size(num_bytes, 8 * MIB)
    assert size == expected and -(-num_bytes // size) <= MAX_PARTS


@pytest.mark.parametrize(
    ("head", "stored"),
    [
        ({"ChecksumCRC32": "AAAAAQ==-3", "ChecksumType": "COMPOSITE"}, "AAAAAQ=="),  # S3
        ({"ChecksumCRC32": "AAAAAQ=="}, "AAAAAQ=="),  # SeaweedFS, moto: no suffix, no type
        ({"ChecksumCRC32": "AAAAAQ==", "ChecksumType": "FULL_OBJECT"}, None),  # another quantity
        ({}, None),  # a store without checksums
    ],
)
def test_only_a_composite_crc32_is_compared_after_an_upload(head: dict[str, str], stored: str | None) -> None:
    assert stored_composite_crc32(head) == stored


def test_a_port_taken_before_the_server_binds_it_is_picked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """weed takes its ports as numbers: one found free may be taken before weed binds it (seen in
    CI). Here another socket holds the first S3 gRPC port picked; the first start picks again."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    picks = iter([taken])
    real = s3_server._free_port
    grpc_index = s3_server._PORTS.index("s3.port.grpc")
    calls = {"n": 0}

    def free_port() -> int:
        calls["n"] += 1
        if calls["n"] == grpc_index + 1:  # the first start's s3.port.grpc
            return next(picks)
        return real()

    monkeypatch.setattr(s3_server, "_free_port", free_port)
    server = S3Server(buckets=[BUCKET])
    try:
        server.start()
        assert server._ports["s3.port.grpc"] != taken
        assert calls["n"] > len(s3_server._PORTS), "the ports were not picked again"
        server.client().head_bucket(Bucket=BUCKET)
    finally:
        server.close()
        squatter.close()
