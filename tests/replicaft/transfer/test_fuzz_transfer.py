"""Hostile bytes against the heal wire's decoders: the donor's manifest
(replicaft/transfer/manifest.py), the state skeleton it carries (replicaft/state/skeleton.py) and
the length-prefixed frames (replicaft/transfer/wire.py). Issue 19.

A healer takes these bytes from a donor it has not verified yet (the vote comes after
decoding), so each must return a valid manifest, skeleton or frame, or raise
``ProtocolError`` (``SkeletonError`` for the skeleton alone; ``ConnectionError`` for a
stream that ends early) before anything is allocated for it.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz_support import (
    FUZZ,
    call_decoder,
    damaged_bytes,
    hostile_values,
    msgpack_values,
    mutated_map,
    nested,
    nested_map,
)

from lighthouse.errors import ProtocolError
from replicaft.state.skeleton import MAX_DEPTH, TENSOR, SkeletonError, check_skeleton
from replicaft.transfer.manifest import (
    CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    Manifest,
    TensorSpec,
    chunk_checksums,
)
from replicaft.transfer.wire import MAX_FRAME_BYTES, recv_frame

BUFFER = bytes(range(256)) * 2
EXAMPLE = Manifest(
    step=5,
    quorum_id=2,
    replica_id="g1",
    skeleton={"model": {"w": {TENSOR: 0}, "b": {TENSOR: 1}}, "step": 5, "extra": {"__tuple__": [1, "a"]}},
    tensors=(TensorSpec("model.w", "float32", (4, 4), 0, 64), TensorSpec("model.b", "float32", (4,), 64, 16)),
    total_bytes=len(BUFFER),
    chunk_bytes=128,
    checksums=tuple(chunk_checksums(memoryview(BUFFER), 128)),
)


def check_manifest(raw: bytes) -> None:
    manifest = call_decoder(lambda: Manifest.decode(raw), ProtocolError, "Manifest.decode", len(raw))
    if manifest is not None:
        assert Manifest.decode(manifest.encode()) == manifest


def test_example_manifest_round_trips() -> None:
    assert Manifest.decode(EXAMPLE.encode()) == EXAMPLE


@FUZZ
@given(raw=st.one_of(st.binary(max_size=300), msgpack_values.map(msgpack.packb), damaged_bytes(EXAMPLE.encode())))
def test_manifest_from_random_bytes_decodes_or_raises_protocol_error(raw: bytes) -> None:
    check_manifest(raw)


@st.composite
def hostile_manifest_body(draw: st.DrawFn) -> dict[str, Any]:
    """The example's map with one field, or one field of one tensor entry, made hostile."""
    body = msgpack.unpackb(EXAMPLE.encode(), raw=False, strict_map_key=False)
    if draw(st.booleans()):
        return draw(mutated_map(body, protected=frozenset({"v"})))
    tensors = [list(t) for t in body["tensors"]]
    entry = tensors[draw(st.integers(0, len(tensors) - 1))]
    where = draw(st.integers(0, len(entry)))
    if where == len(entry):
        entry.append(draw(hostile_values))
    elif where == 2 and draw(st.booleans()):
        entry[2] = [draw(hostile_values), *entry[2]]  # one hostile dimension
    else:
        entry[where] = draw(hostile_values)
    body["tensors"] = tensors
    return body


@FUZZ
@given(body=hostile_manifest_body())
def test_manifest_with_one_hostile_field_decodes_or_raises_protocol_error(body: dict[str, Any]) -> None:
    check_manifest(msgpack.packb(body, use_bin_type=True))


@FUZZ
@given(
    skeleton=st.one_of(hostile_values, st.dictionaries(st.text(max_size=5), hostile_values, max_size=4)),
    num_tensors=st.integers(0, 3),
)
def test_skeleton_is_accepted_or_raises_skeleton_error(skeleton: Any, num_tensors: int) -> None:
    call_decoder(lambda: check_skeleton(skeleton, num_tensors), SkeletonError, "check_skeleton")


@pytest.mark.parametrize("deep", [nested(MAX_DEPTH + 5), nested_map(5000)], ids=["list", "map"])
def test_skeleton_nested_past_the_limit_is_refused_by_name(deep: Any) -> None:
    with pytest.raises(SkeletonError, match="nests deeper than"):
        check_skeleton({"state": deep}, 0)


def test_manifest_with_duplicate_tensor_names_is_refused_issue_19() -> None:
    body = msgpack.unpackb(EXAMPLE.encode(), raw=False)
    body["tensors"][1][0] = "model.w"
    with pytest.raises(ProtocolError, match=r"tensors\[1\]\.name 'model.w' repeats tensors\[0\]"):
        Manifest.decode(msgpack.packb(body, use_bin_type=True))


def test_manifest_with_a_huge_chunk_size_is_refused_before_any_buffer_issue_19() -> None:
    """A healer stages chunk-sized buffers: a donor claiming 1 TiB chunks must not get them."""
    body = msgpack.unpackb(EXAMPLE.encode(), raw=False)
    body["chunk_bytes"] = 1 << 40
    body["checksums"] = body["checksums"][:1]
    with pytest.raises(
        ProtocolError,
        match=rf"Manifest.chunk_bytes is {1 << 40}; expected 1 <= chunk_bytes <= "
        rf"{MAX_CHUNK_BYTES}",
    ):
        Manifest.decode(msgpack.packb(body, use_bin_type=True))
    assert MAX_CHUNK_BYTES >= CHUNK_BYTES


# -- frames --------------------------------------------------------------------------------------


def read_frame_from(wire: bytes) -> dict[str, Any] | None:
    """``recv_frame`` on a socket whose peer sends ``wire`` and closes: never blocks."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(5.0)
        sender = threading.Thread(target=lambda: (theirs.sendall(wire), theirs.shutdown(socket.SHUT_WR)))
        sender.start()
        try:
            return call_decoder(
                lambda: recv_frame(ours, "fuzzed"), (ProtocolError, ConnectionError), "recv_frame", len(wire)
            )
        finally:
            sender.join(timeout=5.0)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    body = draw(st.one_of(st.binary(max_size=200), msgpack_values.map(msgpack.packb)))
    length = draw(st.one_of(st.just(len(body)), st.integers(0, 2**32 - 1), st.sampled_from([MAX_FRAME_BYTES + 1])))
    return struct.pack(">I", length) + body if draw(st.integers(0, 9)) else body[:3]


@FUZZ
@given(wire=frames())
def test_frame_decodes_to_a_map_or_raises_protocol_or_connection_error(wire: bytes) -> None:
    frame = read_frame_from(wire)
    assert frame is None or isinstance(frame, dict)


def test_skeleton_check_does_not_copy_a_long_key_into_every_path_issue_19() -> None:
    """A 1 MB key above 200 values made 200 path strings of 1 MB each (200 MB)."""
    skeleton = {"k" * 1_000_000: [0] * 200}
    call_decoder(lambda: check_skeleton(skeleton, 0), (), "check_skeleton")


def test_skeleton_error_names_the_place_briefly_issue_19() -> None:
    skeleton = {"model": [{"k" * 1000: {"__dict__": [[None, {"__tensor__": 7}]]}}]}
    with pytest.raises(SkeletonError) as info:
        check_skeleton(skeleton, 0)
    assert str(info.value).startswith(f"state skeleton at state.model[0].{'k' * 40}...[None]: tensor reference")
    assert len(str(info.value)) < 300
