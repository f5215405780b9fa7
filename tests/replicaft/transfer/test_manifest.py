"""The heal manifest (replicaft/transfer/manifest.py): layout, checksums, stripes, strict decoding."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lighthouse.errors import ProtocolError
from replicaft.transfer.checksum import ALGORITHM, digest
from replicaft.transfer.manifest import (
    ALIGN_BYTES,
    MANIFEST_VERSION,
    MAX_MANIFEST_BYTES,
    MAX_TENSORS,
    Manifest,
    TensorSpec,
    chunk_checksums,
    chunk_stripes,
    layout,
)


def manifest_for(buffer: bytes, chunk_bytes: int, tensors: tuple[TensorSpec, ...] = (), step: int = 5) -> Manifest:
    return Manifest(
        step=step,
        quorum_id=2,
        replica_id="g1",
        skeleton={"model": {f"t{i}": {"__tensor__": i} for i in range(len(tensors))}, "step": step},
        tensors=tensors,
        total_bytes=len(buffer),
        chunk_bytes=chunk_bytes,
        checksums=tuple(chunk_checksums(memoryview(buffer), chunk_bytes)),
    )


def sized_manifest(total_bytes: int, chunk_bytes: int) -> Manifest:
    return Manifest(5, 2, "g1", {}, (), total_bytes, chunk_bytes, (bytes(16),) * -(-total_bytes // chunk_bytes))


# -- layout and checksums -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "offsets", "total"),
    [
        ([], [], 0),
        ([1], [0], 64),
        ([64], [0], 64),
        ([0, 0], [0, 0], 0),
        ([64, 1, 0, 65], [0, 64, 128, 128], 256),
        ([4, 8, 12], [0, 64, 128], 192),
    ],
)
def test_layout_places_each_tensor_at_the_next_64_byte_boundary(
    sizes: list[int], offsets: list[int], total: int
) -> None:
    assert layout(sizes) == (offsets, total)


@settings(deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=30))
def test_layout_offsets_aligned_and_disjoint(sizes: list[int]) -> None:
    offsets, total = layout(sizes)
    assert all(o % ALIGN_BYTES == 0 for o in offsets)
    ends = [o + s for o, s in zip(offsets, sizes, strict=True)]
    assert all(end <= nxt for end, nxt in zip(ends, offsets[1:], strict=False))
    assert sum(sizes) <= total < sum(sizes) + ALIGN_BYTES * (len(sizes) + 1)
    assert all(end <= total for end in ends)


@pytest.mark.parametrize(
    ("length", "chunk_bytes", "num_chunks"),
    [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (12, 4, 3), (13, 4, 4), (10, 100, 1)],
)
def test_chunk_checksums_one_digest_per_chunk_last_one_partial(length: int, chunk_bytes: int, num_chunks: int) -> None:
    data = bytes(range(length))
    digests = chunk_checksums(memoryview(data), chunk_bytes)
    assert digests == [digest([memoryview(data[i : i + chunk_bytes])]) for i in range(0, length, chunk_bytes)]
    assert len(digests) == num_chunks


def test_a_chunk_spread_over_pieces_has_its_digest_and_one_flipped_bit_changes_it() -> None:
    data = bytes(i % 251 for i in range(1000))
    manifest = manifest_for(data, chunk_bytes=100)
    view = memoryview(data)
    assert digest([view[200:300]]) == manifest.checksums[2]
    assert digest([view[200:230], view[230:231], view[231:300]]) == manifest.checksums[2]  # split across tensors
    corrupted = bytearray(data)
    corrupted[250] ^= 0x01
    assert digest([memoryview(corrupted)[200:250], memoryview(corrupted)[250:300]]) != manifest.checksums[2]
    assert digest([view[200:299]]) != manifest.checksums[2]  # one byte short


def test_manifest_with_overlapping_or_unordered_tensors_is_rejected() -> None:
    good = manifest_for(bytes(256), chunk_bytes=100)
    overlapping = dataclasses.replace(
        good, tensors=(TensorSpec("a", "uint8", (128,), 0, 128), TensorSpec("b", "uint8", (128,), 64, 128))
    )
    with pytest.raises(ProtocolError, match=r"tensors\[1\] \(b\) at offset 64 overlaps"):
        Manifest.decode(overlapping.encode())


# -- stripes --------------------------------------------------------------------------------


@st.composite
def manifests_and_donors(draw: st.DrawFn) -> tuple[Manifest, list[str], int]:
    chunk_bytes = draw(st.integers(1, 1 << 20))
    num_chunks = draw(st.integers(0, 200))
    total = 0 if num_chunks == 0 else (num_chunks - 1) * chunk_bytes + draw(st.integers(1, chunk_bytes))
    donors = draw(st.lists(st.text("abcdefg", min_size=1, max_size=3), min_size=1, max_size=6, unique=True))
    return sized_manifest(total, chunk_bytes), donors, draw(st.integers(0, 20))


@settings(deadline=None)
@given(manifests_and_donors())
def test_chunk_stripes_cover_every_byte_once_chunk_aligned_from_given_donors(
    case: tuple[Manifest, list[str], int],
) -> None:
    manifest, donors, healer_index = case
    stripes = chunk_stripes(manifest, donors, healer_index)
    position = 0
    for stripe in stripes:
        assert stripe.start == position
        assert stripe.stop > stripe.start
        assert stripe.start % manifest.chunk_bytes == 0
        assert stripe.stop % manifest.chunk_bytes == 0 or stripe.stop == manifest.total_bytes
        assert stripe.donor in donors
        position = stripe.stop
    assert position == manifest.total_bytes
    if manifest.num_chunks >= len(donors):
        assert {s.donor for s in stripes} == set(donors)


def test_chunk_stripes_of_an_empty_snapshot_are_empty() -> None:
    assert chunk_stripes(sized_manifest(0, 64), ["a", "b"]) == []


def test_chunk_stripes_rotate_the_first_donor_by_healer_index() -> None:
    manifest = sized_manifest(100 * 64, 64)
    firsts = [chunk_stripes(manifest, ["a", "b", "c"], healer_index=i)[0].donor for i in range(4)]
    assert firsts == ["a", "b", "c", "a"]


def test_chunk_stripes_with_one_chunk_use_one_donor() -> None:
    stripes = chunk_stripes(sized_manifest(10, 64), ["a", "b"])
    assert [(s.donor, s.start, s.stop) for s in stripes] == [("a", 0, 10)]


# -- encode and decode ----------------------------------------------------------------------


def good_manifest() -> Manifest:
    data = bytes(range(256)) * 2
    tensors = (TensorSpec("state.model.w", "float32", (4, 8), 0, 128), TensorSpec("state.step", "int64", (), 128, 8))
    return manifest_for(data, chunk_bytes=200, tensors=tensors)


def test_encoded_manifest_decodes_to_itself() -> None:
    manifest = good_manifest()
    decoded = Manifest.decode(manifest.encode())
    assert decoded == manifest
    assert decoded.same_state_as(manifest)


@settings(deadline=None)
@given(st.integers(0, 2**62), st.integers(0, 2**62), st.text(min_size=1, max_size=128))
def test_manifest_with_any_ids_decodes_to_itself(step: int, quorum_id: int, replica_id: str) -> None:
    manifest = Manifest(step, quorum_id, replica_id, {"x": [1, {"a": None}]}, (), 0, 64, ())
    assert Manifest.decode(manifest.encode()) == manifest


def test_same_state_as_ignores_who_serves_it_but_not_the_bytes() -> None:
    manifest = good_manifest()
    other_donor = Manifest(**{**_fields(manifest), "replica_id": "g7", "quorum_id": 9})
    other_bytes = Manifest(**{**_fields(manifest), "checksums": (bytes(16),) + manifest.checksums[1:]})
    other_step = Manifest(**{**_fields(manifest), "step": 6})
    assert manifest.same_state_as(other_donor)
    assert not manifest.same_state_as(other_bytes)
    assert not manifest.same_state_as(other_step)


def _fields(manifest: Manifest) -> dict[str, Any]:
    return {name: getattr(manifest, name) for name in Manifest.__dataclass_fields__}


def good_body() -> dict[str, Any]:
    return msgpack.unpackb(good_manifest().encode(), raw=False, strict_map_key=False)


def with_change(**changes: Any) -> bytes:
    body = good_body()
    for key, value in changes.items():
        if value is _DELETE:
            del body[key]
        else:
            body[key] = value
    return msgpack.packb(body, use_bin_type=True)


_DELETE = object()


def with_tensor(index: int, entry: Any) -> bytes:
    body = good_body()
    body["tensors"][index] = entry
    return msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(b"\xc1", "Manifest is not valid msgpack", id="not_msgpack"),
        pytest.param(b"", "Manifest is not valid msgpack", id="empty"),
        pytest.param(msgpack.packb([1, 2]), "Manifest must be a msgpack map, got list", id="not_a_map"),
        pytest.param(
            with_change(v=_DELETE), f"Manifest.v is None; this side reads version {MANIFEST_VERSION}", id="no_version"
        ),
        pytest.param(
            with_change(v=1), f"Manifest.v is 1; this side reads version {MANIFEST_VERSION}", id="older_version"
        ),
        pytest.param(
            with_change(v=4), f"Manifest.v is 4; this side reads version {MANIFEST_VERSION}", id="newer_version"
        ),
        pytest.param(with_change(v="1"), "Manifest.v is '1'", id="version_as_string"),
        pytest.param(with_change(step=_DELETE), "Manifest.step is missing", id="no_step"),
        pytest.param(with_change(step=-1), "Manifest.step is -1", id="negative_step"),
        pytest.param(with_change(step="5"), "Manifest.step is str '5'; expected an integer", id="step_as_string"),
        pytest.param(with_change(step=True), "Manifest.step is bool", id="step_as_bool"),
        pytest.param(with_change(quorum_id=1.5), "Manifest.quorum_id is float", id="float_quorum_id"),
        pytest.param(with_change(replica_id=""), "Manifest.replica_id is empty", id="empty_replica_id"),
        pytest.param(
            with_change(replica_id="x" * 129), "Manifest.replica_id is 129 characters long", id="long_replica_id"
        ),
        pytest.param(with_change(skeleton=_DELETE), "Manifest.skeleton is missing", id="no_skeleton"),
        pytest.param(with_change(total_bytes=-1), "Manifest.total_bytes is -1", id="negative_total"),
        pytest.param(with_change(total_bytes=2**63), "Manifest.total_bytes is 9223372036854775808", id="huge_total"),
        pytest.param(with_change(chunk_bytes=0), "Manifest.chunk_bytes is 0", id="zero_chunk"),
        pytest.param(
            with_change(tensors={"a": 1}),
            f"Manifest.tensors must be a list of at most {MAX_TENSORS} entries",
            id="tensors_not_list",
        ),
        pytest.param(
            with_change(checksums=[bytes(16)]),
            "Manifest.checksums must list one digest per 200-byte chunk of 512 bytes",
            id="too_few_digests",
        ),
        pytest.param(
            with_change(checksums=[bytes(16)] * 4), "Manifest.checksums must list one digest", id="too_many_digests"
        ),
        pytest.param(
            with_change(checksums=[bytes(16), bytes(16), 7]),
            "Manifest.checksums[2] is 7; expected 16 bytes",
            id="crc_as_digest",
        ),
        pytest.param(
            with_change(checksums=[bytes(16), bytes(15), bytes(16)]), "Manifest.checksums[1] is b'", id="short_digest"
        ),
        pytest.param(with_change(checksum=_DELETE), "Manifest.checksum is missing", id="no_algorithm"),
        pytest.param(
            with_change(checksum="crc32"),
            f"Manifest.checksum is 'crc32'; this side verifies chunks with {ALGORITHM!r} only",
            id="unknown_algorithm",
        ),
        pytest.param(with_change(checksum=32), "Manifest.checksum is int", id="algorithm_not_str"),
        pytest.param(with_tensor(0, ["w", "float32", [4, 8], 0]), "Manifest.tensors[0] is malformed", id="short_entry"),
        pytest.param(
            with_tensor(1, ["s", "int64", 8, 128, 8]), "Manifest.tensors[1] is malformed", id="shape_not_list"
        ),
        pytest.param(with_tensor(0, "w"), "Manifest.tensors[0] is malformed", id="entry_not_list"),
        pytest.param(
            with_tensor(0, [7, "float32", [4, 8], 0, 128]), "Manifest.tensors[0].name is int", id="name_not_str"
        ),
        pytest.param(
            with_tensor(0, ["w", "f" * 33, [4, 8], 0, 128]),
            "Manifest.tensors[0].dtype is 33 characters",
            id="long_dtype",
        ),
        pytest.param(
            with_tensor(0, ["w", "float32", [4, -8], 0, 128]), "Manifest.tensors[0].shape is -8", id="negative_dim"
        ),
        pytest.param(
            with_tensor(1, ["s", "int64", [], 513, 8]), "Manifest.tensors[1].offset is 513", id="offset_past_end"
        ),
        pytest.param(
            with_tensor(1, ["s", "int64", [], 128, 600]), "Manifest.tensors[1].num_bytes is 600", id="size_past_end"
        ),
        pytest.param(
            with_tensor(1, ["s", "int64", [], 508, 8]),
            "Manifest.tensors[1] (s) ends past total_bytes=512",
            id="ends_past_end",
        ),
    ],
)
def test_decode_rejects_malformed_manifest_naming_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        Manifest.decode(raw)
    assert message in str(raised.value)


def test_decode_rejects_an_oversized_manifest_before_parsing_it() -> None:
    with pytest.raises(
        ProtocolError, match=f"Manifest is {MAX_MANIFEST_BYTES + 1} bytes; the limit is {MAX_MANIFEST_BYTES}"
    ):
        Manifest.decode(bytes(MAX_MANIFEST_BYTES + 1))


@settings(deadline=None)
@given(st.binary(max_size=200))
def test_decode_of_arbitrary_bytes_is_a_manifest_or_a_protocol_error(raw: bytes) -> None:
    try:
        Manifest.decode(raw)
    except ProtocolError:
        pass


@settings(deadline=None)
@given(st.integers(0, len(good_manifest().encode()) - 1), st.integers(1, 255))
def test_decode_of_a_manifest_with_one_byte_changed_never_raises_anything_else(position: int, xor: int) -> None:
    raw = bytearray(good_manifest().encode())
    raw[position] ^= xor
    try:
        Manifest.decode(bytes(raw))
    except ProtocolError:
        pass
