"""What one save writes, decided from the snapshot before any I/O: the layout and its size.

Every rank of a W-rank writing group takes the same snapshot shape, so every rank computes the
same plan without talking. A replicated tensor is written once (DCP deduplicates it across
ranks); a sharded tensor is written as its global shape, each rank its shards; and when the
snapshot is sharded with W > 1, a tensor without a sharding may differ between ranks (FSDP's
BatchNorm statistics), so each rank writes its own value under its own key
(``StateLayout.own_ranks``, layout.py's ``dcp_key``). Pure arithmetic over the snapshot's
manifest: no collective, no file.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from replicaft.checkpoint.layout import dcp_key
from replicaft.checkpoint.manifest import SavedTensor, StateLayout
from replicaft.checkpoint.policy import estimate_checkpoint_bytes
from replicaft.checkpoint.reuse import ReuseKey, reuse_key
from replicaft.state.content import CHUNK_BYTES
from replicaft.state.flat import Sharding
from replicaft.transfer.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class SavePlan:
    layout: StateLayout
    """What ``state.msgpack`` records: the skeleton and each tensor's saved name, dtype and shape."""
    shardings: tuple[Sharding | None, ...]
    """The snapshot's sharding of each tensor, None for an unsharded one (same order as the layout)."""
    estimated_bytes: int
    """What the checkpoint will take on disk, for the free-space check (policy.py)."""


def plan_save(snapshot: Snapshot, group_world_size: int) -> SavePlan:
    """The layout and estimated size of ``snapshot`` saved by a group of ``group_world_size`` ranks."""
    shardings = tuple(snapshot.shardings or (None,) * len(snapshot.manifest.tensors))
    sharded = snapshot.shardings is not None
    own_ranks = group_world_size if sharded and group_world_size > 1 else 0
    layout = StateLayout(
        snapshot.manifest.skeleton,
        tuple(
            SavedTensor(t.name, t.dtype, tuple(sh.shape) if sh is not None else t.shape, bool(own_ranks) and sh is None)
            for t, sh in zip(snapshot.manifest.tensors, shardings, strict=True)
        ),
        own_ranks,
    )
    # Replicated tensors are written once; every rank writes its shards and own values.
    shard_factor = group_world_size if sharded else 1
    estimated = estimate_checkpoint_bytes(
        num_tensor_bytes=snapshot.manifest.total_bytes * shard_factor,
        num_tensors=len(layout.tensors),
        num_skeleton_bytes=len(layout.encode()),
    )
    return SavePlan(layout, shardings, estimated)


CHUNK_OVERHEAD_BYTES = 256
"""Above a chunk's raw bytes when stored: zstd's worst-case growth of 4 MiB of incompressible
bytes is about 100 (a few bytes per 128 KiB block)."""


def new_chunk_bytes(
    plan: SavePlan,
    snapshot: Snapshot,
    ids: Sequence[Sequence[bytes]],
    known: Collection[ReuseKey],
    *,
    rank: int,
    group_world_size: int,
    sealed: bool,
) -> int:
    """The bytes group rank ``rank`` appends to its pack when it writes ``snapshot``'s tensors
    as an increment on a parent whose chain holds ``known`` chunks, looked up the way
    storage.py looks them up: ``ids`` are each tensor's chunk ids under the save's codec (the
    content hashes, or the keyed ids of a sealed save), keyed (reuse.reuse_key) by the tensor's
    DCP name and where its shard starts in the global tensor. A rank of a sharded group writes
    all of its own tensors, so a chunk repeated among them is counted once; in a replicated
    group of W > 1, DCP may hand two tensors to two ranks, which each write a chunk they share,
    so there a repeat is counted once per tensor. A lookup that misses only ever counts a chunk
    as new: an over-estimate, never an under-estimate."""
    seen: set[ReuseKey] = set()
    num_new_bytes = 0
    spread = group_world_size > 1 and not plan.layout.own_ranks
    for spec, tensor, sharding, tensor_ids in zip(
        plan.layout.tensors, snapshot.manifest.tensors, plan.shardings, ids, strict=True
    ):
        if spread:
            seen.clear()
        fqn = dcp_key(spec.name, rank if spec.own else None)
        shard = (0,) * len(tensor.shape) if sharding is None or not sealed else global_offset(sharding)
        for n, start in enumerate(range(0, tensor.num_bytes, CHUNK_BYTES)):
            key = reuse_key(tensor_ids[n], fqn, shard, start, sealed=sealed)
            if key not in known and key not in seen:
                seen.add(key)
                num_new_bytes += min(CHUNK_BYTES, tensor.num_bytes - start) + CHUNK_OVERHEAD_BYTES
    return num_new_bytes


def global_offset(sharding: Sharding) -> tuple[int, ...]:
    """Where this rank's shard starts in its global tensor: what DCP names the shard's write
    item by (planner_helpers._create_write_items_for_dtensor), computed the same way."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # a DTensor exists: loaded

    return tuple(compute_local_shape_and_global_offset(sharding.shape, sharding.mesh, sharding.placements)[1])


def increment_bytes(plan: SavePlan, num_new_bytes: int) -> int:
    """What an increment takes on disk when the ranks of its group append ``num_new_bytes`` of
    chunks in all (:func:`new_chunk_bytes`, summed over the ranks that write): its new chunks
    only, where the free-space check once counted the whole state and refused increments that
    fit (issue 37). Never more than the full estimate."""
    return min(
        plan.estimated_bytes,
        estimate_checkpoint_bytes(
            num_tensor_bytes=num_new_bytes,
            num_tensors=len(plan.layout.tensors),
            num_skeleton_bytes=len(plan.layout.encode()),
        ),
    )
