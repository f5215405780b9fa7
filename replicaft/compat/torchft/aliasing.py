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

Rejected: serving the script's state and not the registered ones (replicaft's replay and
checkpoints use those), and comparing values instead of identity (a copy that happens to be
equal now may not be later).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["ALIASED", "TensorKey", "resolve_aliased", "strip_aliased", "tensor_keys"]

ALIASED = "replicaft.compat: the same tensor as a state replicaft registers"
"""Stands in a served state for a tensor the heal moves as part of a registered state."""

TensorKey = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype]


def _key(t: torch.Tensor) -> TensorKey:
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
    (this process's own state), or dropped where ``own`` has none."""
    if not isinstance(state, Mapping):
        return state
    out = {}
    for k, v in state.items():
        mine = own.get(k) if isinstance(own, Mapping) else None
        if isinstance(v, str) and v == ALIASED:
            if mine is not None:
                out[k] = mine
        else:
            out[k] = resolve_aliased(v, mine)
    return out
