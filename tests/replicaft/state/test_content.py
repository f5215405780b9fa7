"""Content hashes (replicaft/state/content.py): one pass names the chunks and makes the digest, and
a capture into a reused buffer keeps the hashes of what did not change, soundly."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
import torch
import xxhash

from replicaft.checkpoint import CheckpointReader, CheckpointWriter
from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.layout import MANIFEST_FILE, TENSORS_FILE
from replicaft.state.content import CHUNK_BYTES, buffer_hashes, chunk_hashes, copy_changed
from replicaft.state.flat import Flat, content_hashes, digest, flatten, step_digest
from replicaft.transfer.capture import BackgroundCapture
from replicaft.transfer.snapshot import Snapshot
from replicaft.transfer.spare import SpareBuffer


def sha(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


@pytest.mark.parametrize(
    "sizes", [[], [0], [1], [CHUNK_BYTES], [CHUNK_BYTES + 1, 7], [3 * CHUNK_BYTES, 5, 2 * CHUNK_BYTES - 3]]
)
def test_chunk_hashes_are_each_pieces_sha256_in_order_whatever_the_threads(sizes: list[int]) -> None:
    buffers = [memoryview(torch.randint(0, 256, (n,), dtype=torch.uint8).numpy()).cast("B") for n in sizes]
    expected = [tuple(sha(b[s : s + CHUNK_BYTES]) for s in range(0, len(b), CHUNK_BYTES)) for b in buffers]
    assert chunk_hashes(buffers) == expected


def test_digest_from_given_hashes_equals_the_digest_that_reads_the_state() -> None:
    flat = flatten({"w": torch.arange(3 * CHUNK_BYTES // 4, dtype=torch.float32), "n": 7, "b": torch.ones(3)})
    assert digest(flat, content_hashes(flat.tensors)) == digest(flat)


def test_the_step_digest_is_blake2b_over_the_skeleton_and_each_pieces_xxh3_128() -> None:
    """The scheme step_digest names, from its definition: every group and the reference run
    must compute the same bytes from the same state."""
    w = torch.arange(CHUNK_BYTES // 4 + 9, dtype=torch.float32)
    flat = flatten({"w": w, "n": 7})
    data = memoryview(w.numpy()).cast("B")
    h = hashlib.blake2b(digest_size=16)
    h.update(msgpack.packb(flat.skeleton, use_bin_type=True))
    h.update(f"{w.dtype}{tuple(w.shape)}".encode())
    h.update(b"".join(xxhash.xxh3_128_digest(data[s : s + CHUNK_BYTES]) for s in range(0, len(data), CHUNK_BYTES)))
    assert step_digest(flat) == h.hexdigest() != digest(flat)


@pytest.mark.parametrize("state_digest", [digest, step_digest], ids=["digest", "step_digest"])
def test_digest_tells_apart_a_byte_a_dtype_a_shape_and_a_value(state_digest: Callable[[Flat], str]) -> None:
    w = torch.arange(2 * CHUNK_BYTES // 4 + 5, dtype=torch.float32)
    base = state_digest(flatten({"w": w, "n": 1}))
    flipped = w.clone()
    flipped[-1] += 1  # in the last, partial piece
    assert state_digest(flatten({"w": w.clone(), "n": 1})) == base
    assert (
        len(
            {
                base,
                state_digest(flatten({"w": flipped, "n": 1})),
                state_digest(flatten({"w": w.view(torch.int32), "n": 1})),
                state_digest(flatten({"w": w[:-1], "n": 1})),
                state_digest(flatten({"w": w, "n": 2})),
            }
        )
        == 5
    )


def test_copy_changed_keeps_only_whole_unchanged_pieces_it_has_hashes_for() -> None:
    size = 3 * CHUNK_BYTES + 100
    old = torch.randint(0, 256, (size,), dtype=torch.uint8)
    new = old.clone()
    new[CHUNK_BYTES + 5] ^= 1  # piece 1 changed
    dst = old.clone()
    offset = 4096
    known = {
        (offset + s, min(CHUNK_BYTES, size - s)): sha(old[s : s + CHUNK_BYTES].numpy())
        for s in range(0, size, CHUNK_BYTES)
    }
    del known[(offset + 2 * CHUNK_BYTES, CHUNK_BYTES)]  # piece 2 unchanged but never hashed
    kept: dict[tuple[int, int], bytes] = {}
    copy_changed(new, dst, offset=offset, lo=0, size=size, known=known, kept=kept)
    assert torch.equal(dst, new)
    assert set(kept) == {(offset, CHUNK_BYTES), (offset + 3 * CHUNK_BYTES, 100)}
    assert all(kept[k] == known[k] for k in kept)


def test_copy_changed_of_a_piece_range_that_cuts_pieces_copies_them() -> None:
    size = 2 * CHUNK_BYTES
    src = torch.randint(0, 256, (size,), dtype=torch.uint8)
    dst = src.clone()
    known = {
        (0, CHUNK_BYTES): sha(src[:CHUNK_BYTES].numpy()),
        (CHUNK_BYTES, CHUNK_BYTES): sha(src[CHUNK_BYTES:].numpy()),
    }
    kept: dict[tuple[int, int], bytes] = {}
    lo = CHUNK_BYTES // 2
    copy_changed(src[lo:], dst[lo:], offset=0, lo=lo, size=size, known=known, kept=kept)
    assert set(kept) == {(CHUNK_BYTES, CHUNK_BYTES)}  # the first piece was only partly in range


def test_buffer_hashes_reads_only_what_it_does_not_know_and_learns_it() -> None:
    data = torch.randint(0, 256, (2 * CHUNK_BYTES + 64,), dtype=torch.uint8)
    spans = [(0, CHUNK_BYTES + 10), (CHUNK_BYTES + 64, CHUNK_BYTES)]
    lie = b"\x01" * 32
    known = {(0, CHUNK_BYTES): lie}  # trusted as given: it must come from a capture that compared
    hashes = buffer_hashes(data.numpy().data, spans, known)
    view = data.numpy().data
    assert hashes == [(lie, sha(view[CHUNK_BYTES : CHUNK_BYTES + 10])), (sha(view[CHUNK_BYTES + 64 :]),)]
    assert set(known) == {(0, CHUNK_BYTES), (CHUNK_BYTES, 10), (CHUNK_BYTES + 64, CHUNK_BYTES)}


def frozen_state(step: int) -> dict[str, object]:
    torch.manual_seed(0)
    frozen = torch.randn(3 * CHUNK_BYTES // 4)  # three pieces that never change
    return {"frozen": frozen, "trained": torch.full((1000,), float(step)), "step": step}


def test_a_capture_into_its_last_buffer_keeps_the_unchanged_pieces_hashes() -> None:
    first = Snapshot.capture(flatten(frozen_state(1)), step=1, quorum_id=1, replica_id="g", with_checksums=False)
    assert first.content == {}
    buffer_hashes(first.buffer.numpy().data, [(t.offset, t.num_bytes) for t in first.manifest.tensors], first.content)
    second = Snapshot.capture(
        flatten(frozen_state(2)),
        step=2,
        quorum_id=1,
        replica_id="g",
        with_checksums=False,
        out=first.buffer,
        content=first.content,
    )
    frozen_spec = next(t for t in second.manifest.tensors if t.name.endswith("frozen"))
    assert second.content is not None and set(second.content) == {
        (frozen_spec.offset + s, CHUNK_BYTES) for s in range(0, 3 * CHUNK_BYTES, CHUNK_BYTES)
    }
    flat = flatten(frozen_state(2))
    assert digest(
        Flat(flat.skeleton, list(flat.tensors), flat.names),
        buffer_hashes(
            second.buffer.numpy().data, [(t.offset, t.num_bytes) for t in second.manifest.tensors], second.content
        ),
    ) == digest(flat)


def test_a_background_capture_keeps_hashes_and_a_spare_taken_plainly_forgets_them() -> None:
    first = Snapshot.capture(flatten(frozen_state(1)), step=1, quorum_id=1, replica_id="g", with_checksums=False)
    buffer_hashes(first.buffer.numpy().data, [(t.offset, t.num_bytes) for t in first.manifest.tensors], first.content)
    capture = BackgroundCapture(
        flatten(frozen_state(2)), step=2, quorum_id=1, replica_id="g", out=first.buffer, content=first.content
    )
    second, why = capture.finish(timeout_s=30)
    assert second is not None and len(second.content or {}) == 3, why
    spare = SpareBuffer()
    spare.give(second.buffer, second.content)
    buffer = spare.take()  # a heal's live snapshot: it writes the buffer its own way
    assert buffer is not None
    spare.give(buffer)
    assert spare.take_with_content()[1] is None


@pytest.mark.parametrize("encrypted", [False, True])
def test_saves_captured_into_the_last_buffer_restore_bitwise_and_write_only_what_changed(
    tmp_path: Path, encrypted: bool
) -> None:
    key = EncryptionKey.from_bytes(b"k" * 32) if encrypted else None
    snapshot = None
    with CheckpointWriter(tmp_path, keep_last=5, chain_length=5, encryption_key=key) as writer:
        for step in (1, 2, 3):
            snapshot = Snapshot.capture(
                flatten(frozen_state(step)),
                step=step,
                quorum_id=1,
                replica_id="g",
                with_checksums=False,
                out=snapshot.buffer if snapshot else None,
                content=snapshot.content if snapshot else None,
            )
            result = writer.save_async(snapshot, step).wait(60)
            assert result.ok, result.reason
            assert (result.num_bytes < CHUNK_BYTES) == (step > 1)  # the frozen pieces are written once
    loaded = CheckpointReader(tmp_path, encryption_key=key).load_latest_valid()
    assert loaded is not None and loaded.step == 3
    assert digest(flatten(loaded.state)) == digest(flatten(frozen_state(3)))
    assert json.loads((loaded.path / MANIFEST_FILE).read_text())["metadata"]["digest"] == digest(
        flatten(frozen_state(3))
    )


def test_an_increment_reads_its_parents_index_again_once_that_file_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer keeps the chunks of the index it published last, for the next increment; an
    index damaged since (rewritten in place) is read again and, unreadable, makes the save
    write every chunk (chainfiles.known_chunks), never refer into a damaged parent."""
    with CheckpointWriter(tmp_path, keep_last=5, chain_length=5) as writer:
        first = writer.save_async(
            Snapshot.capture(flatten(frozen_state(1)), step=1, quorum_id=1, replica_id="g"), 1
        ).wait(60)
        second = writer.save_async(
            Snapshot.capture(flatten(frozen_state(2)), step=2, quorum_id=1, replica_id="g"), 2
        ).wait(60)
        assert first.ok and second.ok and second.path is not None and second.num_bytes < CHUNK_BYTES  # from memory
        index = second.path / TENSORS_FILE
        index.write_bytes(b"\xff" * index.stat().st_size)  # same size: only reading it tells
        third = writer.save_async(
            Snapshot.capture(flatten(frozen_state(3)), step=3, quorum_id=1, replica_id="g"), 3
        ).wait(60)
    assert third.ok and third.num_bytes > 3 * CHUNK_BYTES, third
    assert "this save writes every chunk" in caplog.text
