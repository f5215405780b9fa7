"""DCP's storage layer for replicaft checkpoints: content-addressed chunks in per-rank packs.

**Where DCP stays, and where it does not.** ``torch.distributed.checkpoint`` still decides
*what* is written and read: its planners deduplicate replicated tensors across the ranks of
a group, give each rank its shards (DTensor), and on load reshard a checkpoint of W ranks
into any other W. What it no longer decides is *how bytes are stored*. Its
``FileSystemWriter`` writes each rank's tensors as ``torch.save`` records in one file and the
index as a pickle: nothing in that layout can point into an older checkpoint, so a frozen
embedding is written again at every save; the pickle ran code on load (issue 19); and there
is no place for per-piece compression or encryption. So this module implements DCP's
``StorageWriter``/``StorageReader`` over our own layout:

* each rank appends the chunks (chunks.py) it has to write to ``pack-<rank>.bin``;
* a chunk whose id the parent checkpoint's index already lists is not written: the new
  index refers to it where it is (an *increment*); a *base* writes every chunk;
* the coordinator writes the index as ``tensors.msgpack`` (index.py), never a pickle;
* the reader fetches each piece's chunks (from this checkpoint's packs or its chain's),
  decodes and verifies every one against its id, and hands DCP the tensor.

Compression and encryption are applied to each chunk as it is written, so they are
properties of the checkpoint, identical in every tier it is copied to: encrypted bytes do
not compress, so compressing later, per tier, would need the key in the uploader and a
decrypt-compress-encrypt pass per chunk, for no gain over doing it once here in the
background writer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from replicaft.checkpoint.chunks import ChunkCodec
from replicaft.checkpoint.entries import open_regular, read_small
from replicaft.checkpoint.index import ChunkRef, StoredPiece, decode_index, dtype_name, encode_index
from replicaft.checkpoint.layout import TENSORS_FILE, pack_name
from replicaft.checkpoint.places import Place
from replicaft.checkpoint.reuse import ReuseKey, reuse_key, shard_of
from replicaft.errors import CheckpointCorrupt
from replicaft.state.content import CHUNK_BYTES
from replicaft.state.flat import DTYPES, tensor_bytes


def piece_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a tensor as a flat memoryview (state.tensor_bytes: no copy when already a
    contiguous CPU tensor)."""
    return memoryview(tensor_bytes(tensor).numpy()).cast("B")


class ChunkStorageWriter(StorageWriter):
    """Writes one rank's part of a checkpoint into ``directory`` (the temporary directory).

    ``known`` maps chunks (by reuse.reuse_key) to where the parent checkpoint's chain holds
    them (empty for a base); ``location`` is the final name of the checkpoint being written,
    which its own chunk references carry, and its sealed chunks' places (places.py).
    ``chunk_ids`` pairs the snapshot's tensors with their chunk ids under ``codec`` (the content
    hashes of replicaft/state/content.py, or the keyed ids of a sealed save), taken once before
    the write for the free-space check (saveplan.py), so a tensor DCP hands over as that same
    memory, found by its address ``(data_ptr, nbytes)``, is not hashed again. The address is a
    sound key only while those tensors live and do not change, which a snapshot being saved
    guarantees; any other tensor (a copy, a narrowed shard) is hashed here.
    """

    def __init__(
        self,
        directory: Path,
        *,
        rank: int,
        location: str,
        codec: ChunkCodec,
        known: dict[ReuseKey, ChunkRef],
        chunk_ids: Iterable[tuple[torch.Tensor, Sequence[bytes]]] = (),
    ) -> None:
        super().__init__()
        self.directory = directory
        self.rank = rank
        self.location = location
        self.codec = codec
        self.known = dict(known)
        self.chunk_ids = {
            (t.data_ptr(), t.numel() * t.element_size()): h for t, h in chunk_ids if t.numel() and t.is_contiguous()
        }
        self.num_new_bytes = 0
        """Bytes this rank wrote to its pack (what the save cost)."""

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def storage_meta(self) -> StorageMeta | None:
        return None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results = []
        path = self.directory / pack_name(self.rank)
        with open(path, "ab") as pack:
            offset = pack.tell()
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:
                    raise TypeError(f"{item.index.fqn} is not a tensor; plain values belong in state.msgpack")
                tensor = planner.resolve_data(item)
                assert isinstance(tensor, torch.Tensor)
                data = piece_bytes(tensor)
                hashed = self.chunk_ids.get((tensor.data_ptr(), len(data))) if tensor.is_contiguous() else None
                refs = []
                fqn, shard = item.index.fqn, shard_of(item.index)
                for n, start in enumerate(range(0, len(data), CHUNK_BYTES)):
                    chunk = data[start : start + CHUNK_BYTES]
                    chunk_id = hashed[n] if hashed is not None else self.codec.chunk_id(chunk)
                    key = reuse_key(chunk_id, fqn, shard, start, sealed=self.codec.key is not None)
                    ref = self.known.get(key)
                    if ref is None:
                        place = Place.chunk(self.location, self.rank, offset, fqn, shard, start)
                        stored = self.codec.encode(chunk_id, chunk, place)
                        pack.write(stored)
                        ref = ChunkRef(self.location, self.rank, offset, len(stored), len(chunk), chunk_id)
                        self.known[key] = ref
                        offset += len(stored)
                        self.num_new_bytes += len(stored)
                    refs.append(ref)
                piece = StoredPiece(dtype_name(tensor.dtype), tuple(tensor.shape), tuple(refs))
                results.append(WriteResult(index=item.index, size_in_bytes=len(data), storage_data=piece))
            pack.flush()
            os.fsync(pack.fileno())
        if offset == 0:
            path.unlink()  # nothing new on this rank: no empty pack
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        pieces = {r.index: r.storage_data for rank_results in results for r in rank_results}
        with open(self.directory / TENSORS_FILE, "wb") as f:
            f.write(encode_index(metadata, pieces))
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


class ChunkStorageReader(StorageReader):
    """Reads a checkpoint written by :class:`ChunkStorageWriter`.

    ``locate`` maps a location (a checkpoint directory name the index refers to) to its
    directory; it raises CheckpointCorrupt for one that is not part of the checkpoint's
    verified chain. Every chunk is decoded and checked against its id before DCP sees it.
    """

    def __init__(self, path: Path, *, codec: ChunkCodec, locate: Callable[[str], Path]) -> None:
        super().__init__()
        self.path = path
        self.codec = codec
        self.locate = locate
        self.pieces: dict[MetadataIndex, StoredPiece] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        where = f"{self.path.name}/{TENSORS_FILE}"
        metadata, self.pieces = decode_index(read_small(self.path / TENSORS_FILE, where), where)
        metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        packs: dict[tuple[str, int], Any] = {}
        try:
            for req in plan.items:
                if req.type == LoadItemType.BYTE_IO:
                    raise CheckpointCorrupt(f"{self.path.name}: {req.storage_index.fqn} is not a tensor")
                piece = self.pieces.get(req.storage_index)
                if piece is None:
                    raise CheckpointCorrupt(f"{self.path.name}/{TENSORS_FILE} has no chunks for {req.storage_index}")
                whole = self._assemble(req.storage_index, piece, packs)
                tensor = narrow_tensor_by_index(whole, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise CheckpointCorrupt(
                        f"{self.path.name}: {req.storage_index.fqn} is {list(tensor.size())} in the "
                        f"checkpoint, {list(target.size())} where it is loaded"
                    )
                target.copy_(tensor)
                planner.commit_tensor(req, target)
        finally:
            for f in packs.values():
                f.close()
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _assemble(self, index: MetadataIndex, piece: StoredPiece, packs: dict[tuple[str, int], Any]) -> torch.Tensor:
        out = torch.empty(piece.shape, dtype=DTYPES[piece.dtype])
        data = piece_bytes(out) if out.numel() else memoryview(bytearray())
        start = 0
        for ref in piece.chunks:
            key = (ref.location, ref.pack)
            if key not in packs:
                name = f"{ref.location}/{pack_name(ref.pack)}"
                packs[key] = open_regular(self.locate(ref.location) / pack_name(ref.pack), name)
            f = packs[key]
            where = f"{ref.location}/{pack_name(ref.pack)}@{ref.offset}"
            stored = os.pread(f.fileno(), ref.stored_len, ref.offset)
            if len(stored) != ref.stored_len:
                raise CheckpointCorrupt(f"{where}: {len(stored)} of {ref.stored_len} bytes there (truncated)")
            place = Place.chunk(ref.location, ref.pack, ref.offset, index.fqn, shard_of(index), start)
            data[start : start + ref.raw_len] = self.codec.decode(ref.chunk_id, stored, ref.raw_len, where, place)
            start += ref.raw_len
        return out

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False
