"""torchft's ``DistributedSampler``: shards a dataset over ``num_replica_groups`` groups.

Kept with torchft's semantics (shard ``group_rank + num_replicas * replica_rank`` of
``num_replicas * num_replica_groups``), which are lossy under failures: a dead group's shard
is not trained meanwhile, and a step that does not commit still consumed its batch. For
exactly-once data use ``replicaft.data.ExactlyOnceSampler`` (DDP) or the leases of
``replicaft.local_sgd`` (DiLoCo).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler as _TorchSampler

__all__ = ["DistributedSampler"]


class DistributedSampler(_TorchSampler):  # type: ignore[type-arg]
    def __init__(
        self,
        dataset: Dataset,  # type: ignore[type-arg]
        replica_rank: int,
        num_replica_groups: int,
        group_rank: int | None = None,
        num_replicas: int | None = None,
        **kwargs: Any,
    ) -> None:
        group_rank = dist.get_rank() if group_rank is None else group_rank
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        self.global_rank = group_rank + num_replicas * replica_rank
        self.global_world_size = num_replicas * num_replica_groups
        super().__init__(dataset, rank=self.global_rank, num_replicas=self.global_world_size, **kwargs)
