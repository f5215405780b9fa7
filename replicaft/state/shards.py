"""A sharded (DTensor) tensor's local shard, and a local shard made a DTensor like its parameter.

Across replica groups replicaft moves and averages local shards: group rank r of every group
holds the same shard of an FSDP2 parameter, so the cross-group all-reduce, a heal and a
DiLoCo pseudo-gradient work on ``to_local()`` tensors, which Gloo and NCCL can address (a
DTensor is a wrapper without storage of its own: handing one to a collective reads garbage).
Optimizers, on the other hand, step the DTensor parameters and want DTensor gradients and
moments. These two functions are the way across, for every wrapper that needs it.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (the stored tensor: no autograd node, no copy); a plain
    tensor as it is."""
    with torch.no_grad():
        return t.to_local() if isinstance(t, DTensor) else t


def like_param(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``local`` (shaped like ``param``'s local shard) as a DTensor with ``param``'s mesh,
    placements and global shape, without communication; a plain ``param``'s ``local`` as it is."""
    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )


def check_not_sharded(tensor: torch.Tensor, what: str) -> None:
    """Refuse a DTensor where a collective needs storage to read (see above) with TypeError,
    which Gloo would otherwise meet with an abort of the process."""
    if isinstance(tensor, DTensor):
        raise TypeError(
            f"{what} got a DTensor; pass its local shard (tensor.to_local(), or replicaft.state.shards."
            "local_shard): group rank r of every group holds the same shard"
        )
