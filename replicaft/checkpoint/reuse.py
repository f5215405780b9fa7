"""Which stored chunks a save may refer to instead of writing them again. Pure.

A chunk of a plain checkpoint is found by its id alone: any tensor, at any offset, whose
bytes hash to that id can refer to it (a zero-filled moment shares one chunk per 4 MiB). A
sealed chunk of an encrypted checkpoint opens only as the tensor and offset it was sealed
for (places.py), so it is found by its id *and* that tensor and offset: an unchanged tensor
still refers to its parent's chunks, but two tensors (or two offsets of one tensor) with
equal bytes are each written, sealed for their own place.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from torch.distributed.checkpoint.metadata import MetadataIndex

from replicaft.checkpoint.index import ChunkRef, StoredPiece

ReuseKey = Hashable


def shard_of(index: MetadataIndex) -> tuple[int, ...]:
    """A stored piece's offsets in its global tensor (a whole tensor's are all zero)."""
    return tuple(index.offset) if index.offset is not None else ()


def reuse_key(chunk_id: bytes, tensor: str, shard: tuple[int, ...], offset: int, *, sealed: bool) -> ReuseKey:
    """What a save looks a chunk it is about to write up by."""
    return (chunk_id, tensor, shard, offset) if sealed else chunk_id


def reusable(pieces: Mapping[MetadataIndex, StoredPiece], *, sealed: bool) -> dict[ReuseKey, ChunkRef]:
    """Every chunk an index refers to, by :func:`reuse_key`: what an increment on it need not write."""
    found: dict[ReuseKey, ChunkRef] = {}
    for index, piece in pieces.items():
        start = 0
        for ref in piece.chunks:
            found[reuse_key(ref.chunk_id, index.fqn, shard_of(index), start, sealed=sealed)] = ref
            start += ref.raw_len
    return found
