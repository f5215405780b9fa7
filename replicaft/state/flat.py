"""Training state as data: flatten a nested state dict into a msgpack skeleton plus tensors.

The heal transfer and the digest both need the whole training state (model, optimizer,
scheduler, manager counters, user extras) as one ordered list of tensors plus plain values,
without pickle. ``flatten`` walks a state dict and replaces every tensor by a reference;
``unflatten`` puts tensors back. Only plain types travel: None, bool, int, float, str, bytes,
lists, tuples and dicts (any key type msgpack can carry). Anything else is refused with the
path to the offending value, so a user learns at registration, not at the first heal.

Sharded values (FSDP2 inside a replica group, replicaft.wrappers.fsdp): a DTensor stands for its local
shard. ``flatten`` puts ``value.to_local()`` in its place, read under ``no_grad`` so it is the
stored tensor itself (no autograd node, no collective, safe on the quorum thread) and a
template filled in place fills the parameter. So the heal moves the rank's own shard (rank r
of a healer pulls rank r of a donor, which holds the same shard), the digest is per rank
(equal across groups column by column), and each rank hands its own shard to a checkpoint.
``unflatten`` gives plain tensors back: putting them into DTensors again is the owner's load
function's job (replicaft.wrappers.fsdp does it for the model and the optimizer). A DTensor with a
``Partial`` placement (a reduction still pending) is refused: its local value is not state.

Next to each tensor ``flatten`` keeps its :class:`Sharding` (None for a plain tensor): the
mesh, placements and global shape of the DTensor it came from. It never travels (a heal moves
only local shards), but a checkpoint writer needs it: DCP keeps one copy of same-named *plain*
tensors as replicas, so the shards must reach it as DTensors again, which is also what lets a
checkpoint saved with one W load with another.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import torch

from replicaft.errors import StateError
from replicaft.state.content import PieceHash, chunk_hashes, sha256_piece, xxh3_piece
from replicaft.state.skeleton import DICT as _DICT
from replicaft.state.skeleton import TENSOR as _TENSOR
from replicaft.state.skeleton import TUPLE as _TUPLE
from replicaft.state.skeleton import SkeletonError, check_skeleton

DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


SMALL_TENSOR_BYTES = 1 << 20
"""State tensors smaller than this (BatchNorm statistics, counters) may be written outside the
optimizer step, by a module's forward: copies behind a step and heals in place leave them out
(they cost next to nothing to handle at once)."""


@dataclass(frozen=True, slots=True)
class Sharding:
    """Where a local shard sits in its DTensor: enough to wrap a copy of the shard as that
    DTensor again (no communication). In-process only, never sent."""

    mesh: Any
    """The DTensor's ``DeviceMesh``."""
    placements: tuple[Any, ...]
    shape: torch.Size
    """The global shape."""
    stride: tuple[int, ...]

    def wrap(self, local: torch.Tensor) -> torch.Tensor:
        """A DTensor over ``local`` (shares its storage)."""
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            local, self.mesh, self.placements, run_check=False, shape=self.shape, stride=self.stride
        )


@dataclass(frozen=True, slots=True)
class Flat:
    skeleton: Any
    """The state with each tensor replaced by ``{"__tensor__": index}``; msgpack-encodable."""
    tensors: list[torch.Tensor]
    names: list[str]
    """Dotted path of each tensor, for error messages and manifests."""
    shardings: list[Sharding | None] | None = None
    """Per tensor, the DTensor it is the local shard of (None: a plain tensor); None when no
    tensor is sharded."""


def _local_shard(value: torch.Tensor, path: str) -> tuple[torch.Tensor, Sharding | None]:
    """A DTensor's local shard (the stored tensor, no copy) and its sharding; any other tensor as it is."""
    # Looked up, not imported: importing torch.distributed.tensor costs about a second, and
    # if nothing has imported it no DTensor can exist.
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None or not isinstance(value, dtensor.DTensor):
        return value, None
    if any(p.is_partial() for p in value.placements):
        raise StateError(
            f"state {path}: a DTensor with placements {value.placements} holds a pending reduction, "
            "not state; reduce it (full_tensor() or redistribute) before registering it"
        )
    with torch.no_grad():
        local = value.to_local().detach()
    return local, Sharding(value.device_mesh, tuple(value.placements), value.shape, value.stride())


def flatten(state: Mapping[str, Any]) -> Flat:
    """``state`` as a skeleton plus its tensors in order; DTensors become their local shards."""
    tensors: list[torch.Tensor] = []
    names: list[str] = []
    shardings: list[Sharding | None] = []

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            value, sharding = _local_shard(value, path)
            shardings.append(sharding)
            if str(value.dtype).removeprefix("torch.") not in DTYPES:
                raise StateError(f"state {path}: tensors of dtype {value.dtype} cannot be transferred")
            tensors.append(value)
            names.append(path)
            return {_TENSOR: len(tensors) - 1}
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
            raise StateError(f"state {path}: the integer {value} does not fit in 64 bits; store it as a string")
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        if isinstance(value, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {_TUPLE: [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, Mapping):
            if all(isinstance(k, str) for k in value) and not ({_TENSOR, _TUPLE, _DICT} & set(value)):
                return {k: walk(v, f"{path}.{k}") for k, v in value.items()}
            for k in value:
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise StateError(f"state {path}: key {k!r} of type {type(k).__name__} cannot be transferred")
            return {_DICT: [[k, walk(v, f"{path}[{k!r}]")] for k, v in value.items()]}
        raise StateError(
            f"state {path}: a value of type {type(value).__name__} cannot be transferred without "
            "pickle; return plain types and tensors from your state_dict function"
        )

    skeleton = walk(dict(state), "state")
    return Flat(skeleton, tensors, names, shardings if any(s is not None for s in shardings) else None)


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The state ``flatten`` made ``skeleton`` from, with ``tensors`` in place; StateError for a
    skeleton no ``flatten`` could have made (skeleton.py)."""
    try:
        check_skeleton(skeleton, len(tensors))
    except SkeletonError as e:
        raise StateError(str(e)) from None

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            if _TENSOR in value:
                return tensors[value[_TENSOR]]
            if _TUPLE in value:
                return tuple(walk(v) for v in value[_TUPLE])
            if _DICT in value:
                return {k: walk(v) for k, v in value[_DICT]}
            return {k: walk(v) for k, v in value.items()}
        return value

    return walk(skeleton)


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 CPU view (or copy, for device or non-contiguous tensors) of ``t``'s data."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8)


DIGEST_SCHEME = "blake2b-128/sha256-4mib"
"""How :func:`digest` is computed, recorded beside a digest that is stored (a checkpoint's
manifest): digests of two schemes cannot be compared."""
HASH_BATCH_BYTES = 256 * 1024 * 1024
"""Bytes of host copies (of device tensors) a content pass holds at once."""


def content_hashes(tensors: Sequence[torch.Tensor], piece_hash: PieceHash = sha256_piece) -> list[tuple[bytes, ...]]:
    """Each tensor's content hashes (content.py; SHA-256 pieces unless told), hashed in batches
    of ``HASH_BATCH_BYTES``."""
    out: list[tuple[bytes, ...]] = []
    batch: list[torch.Tensor] = []
    size = 0
    for i, t in enumerate(tensors):
        batch.append(tensor_bytes(t))
        size += batch[-1].numel()
        if size >= HASH_BATCH_BYTES or i == len(tensors) - 1:
            out += chunk_hashes([b.numpy().data for b in batch], piece_hash)
            batch, size = [], 0
    return out


def digest(flat: Flat, hashes: Sequence[Sequence[bytes]] | None = None) -> str:
    """A digest of the whole state: equal digests mean bitwise-equal state (tensors and values).

    It covers the skeleton, each tensor's dtype and shape, and the tensor's content hashes
    (content.py); a caller that already holds those for ``flat.tensors`` (a checkpoint writer,
    whose chunk ids they are) passes them as ``hashes`` and the state is not read again.
    """
    return _combine(flat, content_hashes(flat.tensors) if hashes is None else hashes)


def step_digest(flat: Flat) -> str:
    """The state digest of a step boundary (scheme ``blake2b-128/xxh3-128-4mib``): :func:`digest`
    with each piece hashed by XXH3-128 instead of SHA-256, ~7x cheaper, as it runs after every
    committed step. Equal digests still mean bitwise-equal state. It is the digest of the
    ``committed`` and ``resume`` events and of DiLoCo's sync points, compared only with others
    of its scheme (events of the same job or of its reference run), never with a manifest's.
    The bytes are read here, on the calling thread: the digest is of the state as it is when
    this returns."""
    return _combine(flat, content_hashes(flat.tensors, xxh3_piece))


def _combine(flat: Flat, hashes: Sequence[Sequence[bytes]]) -> str:
    """The BLAKE2b-128 of the skeleton and, tensor by tensor, its dtype, shape and piece hashes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(msgpack.packb(flat.skeleton, use_bin_type=True))
    for t, pieces in zip(flat.tensors, hashes, strict=True):
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(b"".join(pieces))
    return h.hexdigest()
