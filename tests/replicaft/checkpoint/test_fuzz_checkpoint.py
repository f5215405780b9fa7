"""Hostile bytes against every decoder of a checkpoint's files: ``manifest.json``
(CheckpointManifest), ``state.msgpack`` (StateLayout), ``tensors.msgpack`` (decode_index,
which chain files and incremental saves read too), chunk records and sealed files
(chunks.py) and directory names (layout.parse_dirname). Issue 19.

These files come off a disk or an object store that may hold anything; a resume falls back
to an older checkpoint on ``CheckpointCorrupt`` and on nothing else, so each decoder must
return a valid object or raise exactly that, naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz_support import (
    FUZZ,
    call_decoder,
    damaged_bytes,
    hostile_values,
    msgpack_values,
    mutated_map,
    shallow_hostile_values,
    without_bytes,
)
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo

from replicaft.checkpoint.chunks import ChunkCodec, open_blob, seal_blob
from replicaft.checkpoint.entries import read_small
from replicaft.checkpoint.index import decode_index
from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.layout import DCP_METADATA_FILE, parse_dirname
from replicaft.checkpoint.legacy import read_dcp_metadata
from replicaft.checkpoint.manifest import CheckpointManifest, StateLayout
from replicaft.checkpoint.places import Place
from replicaft.errors import CheckpointCorrupt

LINEAGE = "3f9c2a1b7e55"
PARENT = f"step-000000030-{LINEAGE}"
MANIFEST = {
    "format": "replicaft-checkpoint",
    "version": 3,
    "step": 40,
    "lineage": LINEAGE,
    "kind": "increment",
    "requires": [PARENT],
    "chain_position": 2,
    "created_unix_s": 1_700_000_000.5,
    "codec": {"compression_level": 3, "key_id": "0123456789abcdef"},
    "files": [
        {"name": "pack-0.bin", "num_bytes": 10, "sha256": "a" * 64},
        {"name": "state.msgpack", "num_bytes": 0, "sha256": "b" * 64},
    ],
    "metadata": {"quorum_id": 3, "digest": "ff"},
}
LAYOUT = {
    "version": 1,
    "skeleton": {"model": {"w": {"__tensor__": 0}, "b": {"__tensor__": 1}}, "step": 40, "t": {"__tuple__": [1, 2]}},
    "tensors": [["model.w", "float32", [4, 4]], ["model.b", "float32", [4], True]],
    "own_ranks": 2,
    "index_sha256": "c" * 64,
}
INDEX = {
    "version": 1,
    "tensors": {"model.w": ["float32", [4, 4], [[[0, 0], [4, 4]]]]},
    "locations": [PARENT],
    "stored": [["model.w", [0, 0], 0, "float32", [4, 4], [[0, 0, 0, 65, 64, b"\x01" * 32]]]],
}
CODEC = ChunkCodec(compression_level=3, key=EncryptionKey.from_bytes(bytes(range(32))))


def check_manifest(raw: bytes) -> None:
    manifest = call_decoder(
        lambda: CheckpointManifest.decode(raw, "ckpt/manifest.json"),
        CheckpointCorrupt,
        "CheckpointManifest.decode",
        len(raw),
    )
    if manifest is not None:
        assert math.isfinite(manifest.created_unix_s) and manifest.step >= 0
        assert all(parse_dirname(r) is not None for r in manifest.requires)
        assert CheckpointManifest.decode(manifest.encode(), "again") == manifest


def test_examples_decode() -> None:
    CheckpointManifest.decode(json.dumps(MANIFEST).encode(), "m")
    StateLayout.decode(msgpack.packb(LAYOUT), "s")
    decode_index(msgpack.packb(INDEX), "i")


@st.composite
def hostile_manifest_json(draw: st.DrawFn) -> bytes:
    body = json.loads(json.dumps(MANIFEST))
    where = draw(st.sampled_from(["top", "files", "codec"]))
    if where == "files":
        body["files"][0] = draw(mutated_map(body["files"][0], values=shallow_hostile_values))
    elif where == "codec":
        body["codec"] = draw(mutated_map(body["codec"], values=shallow_hostile_values))
    else:
        body = draw(mutated_map(body, protected=frozenset({"format"}), values=shallow_hostile_values))
    # Python's json writes and reads NaN and Infinity, so a manifest on disk can hold them.
    return json.dumps(without_bytes(body)).encode()


RAW_JSON_HOSTILE = [
    b'{"format": "replicaft-checkpoint", "version": 1, "step": ' + b"1" * 5000 + b"}",
    b'{"format": "replicaft-checkpoint", "version": 1, "step": 1, "created_unix_s": 1e999, '
    b'"metadata": {}, "files": []}',
    b"[" * 100_000,
    b'{"a": "\xff\xfe"}',
    b"\xef\xbb\xbf{}",
]


@FUZZ
@given(
    raw=st.one_of(
        st.binary(max_size=200),
        st.sampled_from(RAW_JSON_HOSTILE),
        hostile_manifest_json(),
        damaged_bytes(json.dumps(MANIFEST).encode()),
    )
)
def test_manifest_json_decodes_or_raises_checkpoint_corrupt(raw: bytes) -> None:
    check_manifest(raw)


@st.composite
def hostile_layout(draw: st.DrawFn) -> bytes:
    body = dict(LAYOUT)
    if draw(st.booleans()):
        tensors = [list(t) for t in body["tensors"]]
        entry = tensors[draw(st.integers(0, 1))]
        entry[draw(st.integers(0, len(entry) - 1))] = draw(hostile_values)
        body["tensors"] = tensors
    else:
        body = draw(mutated_map(body, protected=frozenset({"version"})))
    return msgpack.packb(body, use_bin_type=True)


@FUZZ
@given(
    raw=st.one_of(
        st.binary(max_size=200),
        msgpack_values.map(msgpack.packb),
        hostile_layout(),
        damaged_bytes(msgpack.packb(LAYOUT)),
    )
)
def test_state_layout_decodes_or_raises_checkpoint_corrupt(raw: bytes) -> None:
    layout = call_decoder(
        lambda: StateLayout.decode(raw, "ckpt/state.msgpack"), CheckpointCorrupt, "StateLayout.decode", len(raw)
    )
    if layout is not None:
        assert StateLayout.decode(layout.encode(), "again") == layout


@st.composite
def hostile_index(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = json.loads(json.dumps({k: v for k, v in INDEX.items() if k != "stored"}))
    stored = [list(s) for s in INDEX["stored"]]
    where = draw(st.sampled_from(["top", "tensor", "stored", "ref"]))
    if where == "tensor":
        entry = list(body["tensors"]["model.w"])
        entry[draw(st.integers(0, 2))] = draw(hostile_values)
        body["tensors"]["model.w"] = entry
    elif where == "stored":
        stored[0][draw(st.integers(0, 5))] = draw(hostile_values)
    elif where == "ref":
        ref = list(stored[0][5][0])
        ref[draw(st.integers(0, 5))] = draw(hostile_values)
        stored[0][5] = [ref]
    body["stored"] = stored
    if where == "top":
        body = draw(mutated_map(body, protected=frozenset({"version"})))
    return msgpack.packb(body, use_bin_type=True)


@FUZZ
@given(
    raw=st.one_of(
        st.binary(max_size=200), msgpack_values.map(msgpack.packb), hostile_index(), damaged_bytes(msgpack.packb(INDEX))
    )
)
def test_tensor_index_decodes_or_raises_checkpoint_corrupt(raw: bytes) -> None:
    call_decoder(lambda: decode_index(raw, "ckpt/tensors.msgpack"), CheckpointCorrupt, "decode_index", len(raw))


CHUNK = b"state bytes " * 20
CHUNK_ID = CODEC.chunk_id(CHUNK)
PLACE = Place.chunk(PARENT, 0, 0, "model.w", (0, 0), 0)
STORED = CODEC.encode(CHUNK_ID, CHUNK, PLACE)


@FUZZ
@given(
    stored=st.one_of(st.binary(max_size=80), damaged_bytes(STORED)),
    raw_len=st.sampled_from([0, 1, len(CHUNK), 4 * 1024 * 1024]),
    plain=st.booleans(),
)
def test_chunk_record_decodes_or_raises_checkpoint_corrupt(stored: bytes, raw_len: int, plain: bool) -> None:
    codec = ChunkCodec(compression_level=3) if plain else CODEC
    data = call_decoder(
        lambda: codec.decode(CHUNK_ID, stored, raw_len, "pack-0.bin@0", PLACE),
        CheckpointCorrupt,
        "ChunkCodec.decode",
        len(stored),
    )
    assert data is None or data == CHUNK


STATE_PLACE = Place.state(PARENT)


@FUZZ
@given(stored=st.one_of(st.binary(max_size=120), damaged_bytes(seal_blob(CODEC, b"layout", STATE_PLACE))))
def test_sealed_file_opens_or_raises_checkpoint_corrupt(stored: bytes) -> None:
    data = call_decoder(
        lambda: open_blob(CODEC, stored, encrypted=True, max_bytes=1 << 20, where="state.msgpack", place=STATE_PLACE),
        CheckpointCorrupt,
        "open_blob",
        len(stored),
    )
    assert data is None or data == b"layout"


# -- sealed pieces and their places (issue 37) --------------------------------------------------

CHECKPOINTS = [PARENT, f"step-000000040-{LINEAGE}", "step-000000030-0123456789ab", "not a name"]


@st.composite
def places(draw: st.DrawFn) -> Place:
    """Any place a reader may expect a piece at: a state or a chunk, near PLACE or far from it."""
    checkpoint = draw(st.sampled_from(CHECKPOINTS))
    if draw(st.booleans()):
        return Place.state(checkpoint)
    return Place.chunk(
        checkpoint,
        draw(st.sampled_from([0, 1, 1 << 20])),
        draw(st.sampled_from([0, 1, len(STORED)])),
        draw(st.sampled_from(["model.w", "model.b", "", "model.w\x00"])),
        draw(st.sampled_from([(0, 0), (4, 0), ()])),
        draw(st.sampled_from([0, 4 << 20])),
    )


def with_place(stored: bytes, said: bytes) -> bytes:
    """``stored`` (a sealed chunk record) with its clear place replaced by ``said``: what one
    without the key does to make a piece claim the place it was moved to."""
    length = int.from_bytes(stored[1:3], "big")
    return stored[:1] + len(said).to_bytes(2, "big") + said + stored[3 + length :]


@FUZZ
@given(
    stored=st.one_of(st.binary(max_size=120), damaged_bytes(STORED), st.just(STORED)),
    place=st.one_of(st.just(PLACE), places()),
)
def test_sealed_chunk_opens_only_intact_and_where_it_was_sealed_for(stored: bytes, place: Place) -> None:
    """Arbitrary bytes, flipped bits and another place (wrong associated data) never decode and
    always raise CheckpointCorrupt; only the intact record read where it was sealed for does."""
    data = call_decoder(
        lambda: CODEC.decode(CHUNK_ID, stored, len(CHUNK), "pack-0.bin@0", place),
        CheckpointCorrupt,
        "ChunkCodec.decode",
        len(stored),
    )
    assert data is None or (data == CHUNK and place == PLACE and stored == STORED)


@FUZZ
@given(place=places(), said=st.one_of(st.binary(max_size=40), msgpack_values))
def test_a_sealed_chunk_whose_clear_place_is_rewritten_never_opens(place: Place, said: Any) -> None:
    """The place a record shows is checked by its seal: rewriting it (to the place it is read
    at, or to anything else) fails, as CheckpointCorrupt, wherever the record is read."""
    claim = said if isinstance(said, bytes) else msgpack.packb(said, use_bin_type=True)
    for forged in (with_place(STORED, place.encode()), with_place(STORED, claim[:0xFFFF])):
        data = call_decoder(
            lambda forged=forged: CODEC.decode(CHUNK_ID, forged, len(CHUNK), "pack-0.bin@0", place),
            CheckpointCorrupt,
            "ChunkCodec.decode",
            len(forged),
        )
        assert data is None or (place == PLACE and forged == STORED)


@FUZZ
@given(
    stored=st.one_of(st.binary(max_size=120), damaged_bytes(seal_blob(CODEC, b"layout", STATE_PLACE))),
    place=st.one_of(st.just(STATE_PLACE), places()),
)
def test_sealed_file_opens_only_as_the_state_it_was_sealed_for(stored: bytes, place: Place) -> None:
    sealed = seal_blob(CODEC, b"layout", STATE_PLACE)
    for blob in (stored, sealed):
        data = call_decoder(
            lambda blob=blob: open_blob(CODEC, blob, encrypted=True, max_bytes=1 << 20, where="state", place=place),
            CheckpointCorrupt,
            "open_blob",
            len(blob),
        )
        assert data is None or (data == b"layout" and place == STATE_PLACE)


def packed(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=60), damaged_bytes(PLACE.encode()), hostile_values.map(packed)))
def test_place_decodes_or_raises_checkpoint_corrupt(raw: bytes) -> None:
    call_decoder(lambda: Place.decode(raw, "pack-0.bin@0"), CheckpointCorrupt, "Place.decode", len(raw))


@FUZZ
@given(
    name=st.one_of(
        st.text(max_size=40),
        st.from_regex(r"step-[0-9]{9,30}(-[0-9a-f]{12})?", fullmatch=True),
        st.integers(9, 6000).map(lambda n: "step-" + "1" * n),
        st.from_regex(r"step-\d{9}", fullmatch=True),
    )
)
def test_directory_name_parses_or_is_not_a_checkpoint(name: str) -> None:
    parsed = call_decoder(lambda: parse_dirname(name), (), "parse_dirname")
    if parsed is not None:
        assert 0 <= parsed.step < 2**63 and parsed.step == int(name.split("-")[1])


def dcp_records() -> dict[str, Any]:
    """A version-2 checkpoint's DCP metadata, with its records by name (to damage one)."""
    chunk = dcp_metadata.ChunkStorageMetadata(torch.Size([0]), torch.Size([4]))
    tensor = dcp_metadata.TensorStorageMetadata(
        dcp_metadata.TensorProperties(dtype=torch.float32), torch.Size([4]), [chunk]
    )
    index = dcp_metadata.MetadataIndex("w", torch.Size([0]), 0)
    info = _StorageInfo("__0_0.distcp", 0, 16)
    metadata = dcp_metadata.Metadata({"w": tensor}, storage_data={index: info})
    return {"metadata": metadata, "tensor": tensor, "index": index, "info": info}


@st.composite
def hostile_dcp_metadata(draw: st.DrawFn) -> bytes:
    """``.metadata`` pickled with one attribute of one record replaced or missing (the
    records are the allowed classes: a planted file can give them any state)."""
    records = dcp_records()
    record = records[draw(st.sampled_from(sorted(records)))]
    name = draw(st.sampled_from([f.name for f in dataclasses.fields(record)]))
    if draw(st.booleans()):
        object.__setattr__(record, name, draw(shallow_hostile_values))
    else:
        object.__delattr__(record, name)
    return pickle.dumps(records["metadata"])


DCP_DIR = Path(tempfile.mkdtemp(prefix="fuzz-dcp-")) / "step-000000001"
DCP_DIR.mkdir()


@FUZZ
@given(
    raw=st.one_of(
        hostile_dcp_metadata(), damaged_bytes(pickle.dumps(dcp_records()["metadata"])), st.binary(max_size=100)
    )
)
def test_dcp_metadata_decodes_or_raises_checkpoint_corrupt(raw: bytes) -> None:
    (DCP_DIR / DCP_METADATA_FILE).write_bytes(raw)
    call_decoder(
        lambda: read_dcp_metadata(DCP_DIR, frozenset({"__0_0.distcp"})),
        CheckpointCorrupt,
        "read_dcp_metadata",
        len(raw),
    )


# -- regression tests for what the fuzzing found (issue 19) -------------------------------------


def manifest_with(**changes: Any) -> bytes:
    return json.dumps({**MANIFEST, **changes}).encode()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (manifest_with(created_unix_s=math.nan), r"field 'created_unix_s' = nan is not a finite number"),
        (manifest_with(created_unix_s=math.inf), r"field 'created_unix_s' = inf is not a finite number"),
        (RAW_JSON_HOSTILE[0], r"ckpt/manifest.json is not valid JSON \(Exceeds the limit \(4300 digits\)"),
        (manifest_with(version=3.0), r"version 3.0"),
        (
            manifest_with(files=[{"name": "pack-0.bin\x00", "num_bytes": 1, "sha256": "a" * 64}]),
            r"files\[0\].name 'pack-0.bin\\x00' is not a plain file name",
        ),
        (manifest_with(requires=["step-" + "1" * 5000]), r"requires .* are not earlier checkpoints"),
    ],
)
def test_manifest_refuses_what_no_writer_writes_issue_19(raw: bytes, message: str) -> None:
    with pytest.raises(CheckpointCorrupt, match=message):
        CheckpointManifest.decode(raw, "ckpt/manifest.json")


def test_layout_with_a_non_string_dtype_is_corrupt_not_a_type_error_issue_19() -> None:
    body = {**LAYOUT, "tensors": [["model.w", ["float32"], [4, 4]]]}
    with pytest.raises(CheckpointCorrupt, match=r"s: tensors\[0\]"):
        StateLayout.decode(msgpack.packb(body), "s")


def test_layout_whose_skeleton_misnames_its_tensors_is_corrupt_issue_19() -> None:
    body = {**LAYOUT, "skeleton": {"w": {"__tensor__": 0}}}
    with pytest.raises(CheckpointCorrupt, match=r"s: state skeleton names 1 of its 2 tensors"):
        StateLayout.decode(msgpack.packb(body), "s")


@pytest.mark.parametrize("where", ["tensor", "stored"])
def test_index_with_a_non_string_dtype_is_corrupt_not_a_type_error_issue_19(where: str) -> None:
    body = json.loads(json.dumps({k: v for k, v in INDEX.items() if k != "stored"}))
    stored = [list(INDEX["stored"][0])]
    if where == "tensor":
        body["tensors"]["model.w"][0] = ["float32"]
    else:
        stored[0][3] = ["float32"]
    body["stored"] = stored
    with pytest.raises(CheckpointCorrupt, match="i: "):
        decode_index(msgpack.packb(body), "i")


def test_directory_name_with_a_step_too_long_for_an_int_is_not_a_checkpoint_issue_19() -> None:
    assert parse_dirname("step-" + "1" * 5000) is None
    assert parse_dirname("step-" + "\u0661" * 9) is None  # Arabic-Indic digits: not a name we write
    assert parse_dirname("step-000000040").step == 40  # type: ignore[union-attr]


@pytest.mark.parametrize("stored", [b"\x02", b"\x02" + bytes(5), b"\x03" + bytes(7)])
def test_encrypted_chunk_too_short_for_its_nonce_is_corrupt_issue_19(stored: bytes) -> None:
    with pytest.raises(CheckpointCorrupt, match="pack-0.bin@0"):
        CODEC.decode(CHUNK_ID, stored, len(CHUNK), "pack-0.bin@0", PLACE)


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "encrypted"])
def test_a_place_without_a_seal_is_unknown_flags_issue_37(plain: bool) -> None:
    """Flag 4 (a place) means nothing without flag 2 (sealed): refused, never read as plain bytes."""
    codec = ChunkCodec() if plain else CODEC
    with pytest.raises(CheckpointCorrupt, match="unknown chunk flags 0x4"):
        codec.decode(CHUNK_ID, b"\x04" + CHUNK, len(CHUNK), "pack-0.bin@0", PLACE)


@pytest.mark.parametrize(
    ("record", "name", "value", "message"),
    [
        ("info", "relative_path", ["__0_0.distcp"], r"is stored in \['__0_0.distcp'\]"),
        ("info", "relative_path", None, r"a _StorageInfo without relative_path"),
        ("metadata", "storage_data", None, r"storage_data is a NoneType, not a mapping"),
        ("metadata", "state_dict_metadata", None, r"a Metadata without state_dict_metadata"),
        ("info", "offset", -1, r"'w' is stored at offset, length \(-1, 16\)"),
    ],
)
def test_dcp_metadata_with_a_damaged_record_is_corrupt_issue_19(
    tmp_path: Path, record: str, name: str, value: Any, message: str
) -> None:
    records = dcp_records()
    if value is None:
        object.__delattr__(records[record], name)
    else:
        object.__setattr__(records[record], name, value)
    (tmp_path / DCP_METADATA_FILE).write_bytes(pickle.dumps(records["metadata"]))
    with pytest.raises(CheckpointCorrupt, match=message):
        read_dcp_metadata(tmp_path, frozenset({"__0_0.distcp"}))


def test_reading_a_small_file_allocates_its_size_not_the_limit_issue_19(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_bytes(b"{}")
    assert call_decoder(lambda: read_small(tmp_path / "manifest.json", "m"), (), "read_small") == b"{}"


def test_dcp_metadata_declaring_a_huge_string_is_corrupt_without_allocating_it_issue_19(tmp_path: Path) -> None:
    raw = pickle.dumps(dcp_records()["metadata"], protocol=4)
    at = raw.index(b"\x8c\x0c__0_0.distcp")  # SHORT_BINUNICODE of the data file's name
    damaged = raw[:at] + b"B" + raw[at + 1 :]  # BINBYTES: its length is the next 4 bytes, ~2 GiB
    (tmp_path / DCP_METADATA_FILE).write_bytes(damaged)
    call_decoder(
        lambda: read_dcp_metadata(tmp_path, frozenset({"__0_0.distcp"})),
        CheckpointCorrupt,
        "read_dcp_metadata",
        len(damaged),
    )
