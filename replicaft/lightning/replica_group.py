"""The ranks of one replica group, as Lightning's data-parallel strategies see them.

A group of W > 1 ranks (started by torchrun, e.g. ``replicaft-launch --ranks-per-group 2``)
trains as Lightning's DDP does inside the group: every rank holds the whole model, trains on
its own slice of the group's share, and the gradients are averaged over the group's ranks as
well as across groups (``replicaft.DistributedDataParallel(group=...)``). The group's own
process group, built here from torchrun's environment, carries that and what Lightning asks a
parallel strategy for: barriers, metric reductions (``self.log(..., sync_dist=True)``),
``all_gather`` and boolean decisions. Lightning's ``broadcast`` of Python objects is left a
no-op, as for one rank: it pickles over the wire, and every rank of a group computes the same
objects anyway (paths, stage names), since all of them run the same steps.

A rank of the group dying takes the whole group down (the launcher restarts it); the group's
collectives therefore need no fault tolerance, only a deadline: ``quorum_timeout_s``, the top
of the manager's timeout hierarchy, since one rank may wait there while another is still in
a heal (``heal_timeout_s``) or a cross-group all-reduce (``collective_timeout_s``).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError


class ReplicaGroup:
    """The group's process group (None for one rank), opened by :meth:`open`."""

    def __init__(self) -> None:
        self.process_group: dist.ProcessGroup | None = None
        self.rank = 0
        self.size = 1
        self._created = False

    def open(self, options: ManagerOptions, device: torch.device) -> None:
        """Join the group's process group, from torchrun's ``RANK``, ``WORLD_SIZE`` and
        ``MASTER_ADDR``/``MASTER_PORT`` unless the script initialised one already. Blocks
        until every rank of the group joined, at most ``quorum_timeout_s``."""
        self.rank, self.size = options.group_rank, options.group_world_size
        if self.size == 1:
            return
        if not dist.is_initialized():
            backend = options.backend or ("nccl" if device.type == "cuda" else "gloo")
            dist.init_process_group(
                backend,
                rank=self.rank,
                world_size=self.size,
                timeout=datetime.timedelta(seconds=options.quorum_timeout_s),
            )
            self._created = True
        if dist.get_world_size() != self.size or dist.get_rank() != self.rank:
            raise OptionsError(
                f"the default process group is rank {dist.get_rank()} of {dist.get_world_size()}, but this "
                f"replica group's options say rank {self.rank} of {self.size}; the default group must be "
                "the replica group's own ranks (torchrun's, one torchrun per group)"
            )
        self.process_group = dist.group.WORLD

    def close(self) -> None:
        if self._created:
            dist.destroy_process_group()
            self._created = False
        self.process_group = None

    def barrier(self) -> None:
        if self.process_group is not None:
            dist.barrier(group=self.process_group)

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
        """``tensor`` reduced over the group's ranks (a copy; the input is left alone)."""
        out = tensor.detach().clone()
        if self.process_group is not None:
            dist.all_reduce(out, op=op, group=self.process_group)
        return out

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """The ranks' ``tensor`` stacked along a new first dimension (Lightning's layout)."""
        if self.process_group is None:
            return tensor
        out = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(out, tensor.contiguous(), group=self.process_group)
        return torch.stack(out)
