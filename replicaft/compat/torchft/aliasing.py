"""The tensors a torchft script's ``state_dict`` shares with the states replicaft registers itself.

A torchft script hands the ``Manager`` one ``state_dict`` for what a heal moves, typically
``{"model": m.state_dict(), "optim": optimizer.state_dict()}``. Under the shim,
``DistributedDataParallel`` and ``Optimizer`` also register the model and the optimizer with
replicaft (its heal replays steps on them, its checkpoints name them), so the same tensors
were served twice, loaded twice and hashed twice into every step's digest: torchft's
``train_ddp.py`` healed 6.0 GB for its 3.0 GB of state.

So the script's state is served with each tensor that is the very tensor (same storage, offset,
shape, strides and dtype) of a registered state replaced by :data:`ALIASED`, and before the
script's ``load_state_dict`` sees a healed state, each marker is resolved to the healer's own
tensor at the same place. That own tensor is the one the registered state loads into (the
model's parameters, in place) or is replaced by (the optimizer's moments), so the script's load
neither undoes nor repeats the registered one, in whichever order the two run. A marker with
no counterpart in the healer (a fresh optimizer has no moments yet) is dropped: the registered
optimizer state brings them. Tensors inside lists or tuples are left as they are.

Sharded (DTensor, FSDP2) tensors, as torchtitan's model and optimizer states hold: a DTensor
has no storage of its own, so its identity is its local shard's. A heal gives every tensor back
as a plain tensor (replicaft/state/flat.py moves local shards), so before a load each healed
tensor whose place in the healer's own state holds a DTensor is made a DTensor like it again
(:func:`restore_dtensors`, no communication): torchtitan's loads (``set_model_state_dict``,
``set_optimizer_state_dict``) would otherwise put plain tensors beside DTensor parameters.

Rejected: serving the script's state and not the registered ones (replicaft's replay and
checkpoints use those), and comparing values instead of identity (a copy that happens to be
equal now may not be later).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["ALIASED", "TensorKey", "resolve_aliased", "restore_dtensors", "strip_aliased", "tensor_keys"]

ALIASED = "replicaft.compat: the same tensor as a state replicaft registers"
"""Stands in a served state for a tensor the heal moves as part of a registered state."""

TensorKey = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype]


def _dtensor_type() -> type | None:
    # Looked up, not imported (about a second): if nothing imported it, no DTensor exists.
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def _key(t: torch.Tensor) -> TensorKey:
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(t, dtensor):
        with torch.no_grad():
            t = t.to_local()
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _tensors(state: Any) -> Iterator[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, Mapping):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value)


def tensor_keys(states: Iterable[Any]) -> set[TensorKey]:
    """The identity of every tensor in ``states`` (nested dicts, lists, tuples)."""
    return {_key(t) for state in states for t in _tensors(state)}


def strip_aliased(state: Any, keys: set[TensorKey]) -> Any:
    """``state`` with every tensor in a mapping whose identity is in ``keys`` replaced by
    :data:`ALIASED`; mappings become dicts, nothing is copied."""
    if not isinstance(state, Mapping):
        return state
    return {
        k: ALIASED if isinstance(v, torch.Tensor) and _key(v) in keys else strip_aliased(v, keys)
        for k, v in state.items()
    }


def resolve_aliased(state: Any, own: Any) -> Any:
    """``state`` with each :data:`ALIASED` replaced by the value at the same place in ``own``
    (this process's own state), or dropped where ``own`` has none; and each tensor made a
    DTensor where ``own`` holds one (:func:`restore_dtensors`)."""
    if not isinstance(state, Mapping):
        return restore_dtensors(state, own)
    out = {}
    for k, v in state.items():
        mine = own.get(k) if isinstance(own, Mapping) else None
        if isinstance(v, str) and v == ALIASED:
            if mine is not None:
                out[k] = mine
        else:
            out[k] = resolve_aliased(v, mine)
    return out


def restore_dtensors(state: Any, own: Any) -> Any:
    """``state`` (a healed state: plain tensors) with each tensor whose place in ``own`` holds a
    DTensor made a DTensor with that one's mesh, placements and global shape; the rest as it is.
    Mappings become dicts, lists and tuples stay what they are."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return state
    if isinstance(state, torch.Tensor):
        if isinstance(own, dtensor) and not isinstance(state, dtensor):
            from replicaft.state.shards import like_param

            return like_param(state, own)
        return state
    if isinstance(state, Mapping):
        return {k: restore_dtensors(v, own.get(k) if isinstance(own, Mapping) else None) for k, v in state.items()}
    if isinstance(state, (list, tuple)) and isinstance(own, (list, tuple)) and len(own) == len(state):
        return type(state)(restore_dtensors(v, o) for v, o in zip(state, own, strict=True))
    return state
