"""``tensors.msgpack``: which tensors a checkpoint holds and where each chunk of them is. Pure.

It replaces DCP's pickled ``.metadata``: the same facts DCP's planner needs to load (every
tensor's dtype, global size and the pieces it was saved in, each piece's offsets and sizes),
plus, for every piece, the chunks its bytes are made of, each as a *chunk reference*::

    [location, pack, offset, stored_len, raw_len, id]

``location`` indexes ``locations``, the checkpoint directories whose packs hold chunks: the
checkpoint itself and, for an incremental save, the earlier checkpoints of its chain whose
chunks it reuses. ``pack`` is the rank whose pack file (``pack-<rank>.bin``) holds it, at
``offset``, ``stored_len`` bytes as stored (chunks.py), ``raw_len`` bytes once decoded, named
by ``id``. A reader needs nothing else to load, and a writer needs nothing else to know
which chunks an increment can reuse.

Decoding validates every field and raises :class:`CheckpointCorrupt` naming it: the file
comes off a disk that may hold anything, and is decoded without running code (msgpack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from lighthouse.errors import shown
from replicaft.checkpoint.chunks import ID_BYTES
from replicaft.checkpoint.layout import parse_dirname
from replicaft.errors import CheckpointCorrupt
from replicaft.state.content import CHUNK_BYTES
from replicaft.state.flat import DTYPES

INDEX_VERSION = 1
MAX_RANKS = 1 << 20


@dataclass(frozen=True, slots=True)
class ChunkRef:
    location: str
    """The checkpoint directory name whose pack holds the chunk."""
    pack: int
    offset: int
    stored_len: int
    raw_len: int
    chunk_id: bytes


@dataclass(frozen=True, slots=True)
class StoredPiece:
    """One piece DCP saved (a whole tensor, or one shard of a sharded one) and its chunks."""

    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[ChunkRef, ...]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode_index(metadata: Metadata, pieces: dict[MetadataIndex, StoredPiece]) -> bytes:
    """``tensors.msgpack`` for DCP's ``metadata`` (tensors only) and the pieces' chunks."""
    tensors = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise TypeError(
                f"{fqn} is a {type(entry).__name__}; checkpoints hold tensors only (plain values go to state.msgpack)"
            )
        tensors[fqn] = [
            dtype_name(entry.properties.dtype),
            list(entry.size),
            [[list(c.offsets), list(c.sizes)] for c in entry.chunks],
        ]
    locations: dict[str, int] = {}
    stored = []
    for index, piece in pieces.items():
        refs = [
            [locations.setdefault(r.location, len(locations)), r.pack, r.offset, r.stored_len, r.raw_len, r.chunk_id]
            for r in piece.chunks
        ]
        stored.append(
            [
                index.fqn,
                list(index.offset) if index.offset is not None else None,
                index.index,
                piece.dtype,
                list(piece.shape),
                refs,
            ]
        )
    return msgpack.packb(
        {"version": INDEX_VERSION, "tensors": tensors, "locations": list(locations), "stored": stored},
        use_bin_type=True,
    )


def decode_index(raw: bytes, where: str) -> tuple[Metadata, dict[MetadataIndex, StoredPiece]]:
    """DCP metadata and the pieces' chunks from ``tensors.msgpack``; raises CheckpointCorrupt."""
    try:
        o = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise CheckpointCorrupt(f"{where} is not valid msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(o, dict) or o.get("version") != INDEX_VERSION:
        raise CheckpointCorrupt(f"{where} is not a version {INDEX_VERSION} tensor index")
    tensors, locations, stored = o.get("tensors"), o.get("locations"), o.get("stored")
    if not isinstance(tensors, dict) or not isinstance(locations, list) or not isinstance(stored, list):
        raise CheckpointCorrupt(f"{where} lacks tensors, locations or stored")
    if not all(isinstance(loc, str) and parse_dirname(loc) is not None for loc in locations):
        raise CheckpointCorrupt(f"{where}: locations {shown(locations)} are not all checkpoint names")
    state_dict_metadata: dict[str, Any] = {}
    for fqn, entry in tensors.items():
        ok = (
            isinstance(entry, list)
            and len(entry) == 3
            and _dtype(entry[0])
            and _dims(entry[1])
            and isinstance(entry[2], list)
            and all(
                isinstance(c, list)
                and len(c) == 2
                and _dims(c[0])
                and _dims(c[1])
                and len(c[0]) == len(c[1]) == len(entry[1])
                for c in entry[2]
            )
        )
        if not ok:
            raise CheckpointCorrupt(f"{where}: tensor {shown(fqn)} = {shown(entry)} is not [dtype, size, pieces]")
        state_dict_metadata[fqn] = TensorStorageMetadata(
            TensorProperties(dtype=DTYPES[entry[0]]),
            torch.Size(entry[1]),
            [ChunkStorageMetadata(torch.Size(c[0]), torch.Size(c[1])) for c in entry[2]],
        )
    pieces = {}
    for i, s in enumerate(stored):
        ok = (
            isinstance(s, list)
            and len(s) == 6
            and isinstance(s[0], str)
            and s[0] in tensors
            and (s[1] is None or _dims(s[1]))
            and (s[2] is None or _count(s[2]))
            and _dtype(s[3])
            and _dims(s[4])
            and isinstance(s[5], list)
        )
        if not ok:
            raise CheckpointCorrupt(f"{where}: stored[{i}] is not [fqn, offset, index, dtype, shape, chunks]")
        refs = tuple(_ref(r, locations, f"{where}: stored[{i}] ({s[0]})") for r in s[5])
        num_bytes = _numel(s[4]) * DTYPES[s[3]].itemsize
        if sum(r.raw_len for r in refs) != num_bytes:
            raise CheckpointCorrupt(
                f"{where}: {s[0]}'s chunks hold {sum(r.raw_len for r in refs)} bytes, its shape {num_bytes}"
            )
        index = MetadataIndex(s[0], torch.Size(s[1]) if s[1] is not None else None, s[2])
        pieces[index] = StoredPiece(s[3], tuple(s[4]), refs)
    return Metadata(state_dict_metadata, storage_data=pieces), pieces


def _ref(r: Any, locations: list[str], where: str) -> ChunkRef:
    ok = (
        isinstance(r, list)
        and len(r) == 6
        and _count(r[0])
        and r[0] < len(locations)
        and _count(r[1])
        and r[1] < MAX_RANKS
        and _count(r[2])
        and _count(r[3])
        and _count(r[4])
        and 0 < r[4] <= CHUNK_BYTES
        and isinstance(r[5], bytes)
        and len(r[5]) == ID_BYTES
    )
    if not ok:
        raise CheckpointCorrupt(f"{where}: chunk reference {shown(r)} is malformed")
    return ChunkRef(locations[r[0]], r[1], r[2], r[3], r[4], r[5])


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _dtype(value: Any) -> bool:
    """A dtype's name; ``in DTYPES`` alone raises TypeError for a list (issue 19)."""
    return isinstance(value, str) and value in DTYPES


def _dims(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 64 and all(_count(d) for d in value)


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
