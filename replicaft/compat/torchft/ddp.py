"""torchft's ``DistributedDataParallel(manager, module)`` on replicaft's bucketed FT all-reduce,
and its ``PureDistributedDataParallel``: one manager all-reduce per gradient, as torchft's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from replicaft.column.process_group import ManagedWork
from replicaft.compat.torchft.manager import Manager
from replicaft.state.registry import StepHooks
from replicaft.wrappers.ddp import DistributedDataParallel as _DistributedDataParallel

__all__ = ["DistributedDataParallel", "PureDistributedDataParallel"]


class DistributedDataParallel(_DistributedDataParallel):
    def __init__(self, manager: Manager, module: nn.Module, **kwargs: Any) -> None:
        super().__init__(manager.inner, module, **kwargs)
        manager.note_registered_state(self._state_dict)


class _PendingGrads(StepHooks):
    """The gradient all-reduces of a step, waited for when ``should_commit`` begins: torchft's
    manager waits for the works it started; replicaft's leaves each wait to its caller."""

    def __init__(self) -> None:
        self.works: list[ManagedWork] = []

    def on_step_start(self) -> None:
        self.works.clear()

    def before_vote(self) -> None:
        for work in self.works:
            work.wait()
        self.works.clear()


class PureDistributedDataParallel(nn.Module):
    """Averages each parameter's gradient across the groups with ``manager.allreduce`` as soon
    as backward has accumulated it; the step waits for them before its vote. Unlike
    :class:`DistributedDataParallel` it registers nothing with replicaft: the model travels in
    a heal only through the script's ``state_dict``, and a healer does not replay the steps it
    missed. torchft recommends ``DistributedDataParallel`` too."""

    def __init__(self, manager: Manager, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        pending = _PendingGrads()
        manager.inner.register_hooks(pending)

        def average_grad(p: torch.Tensor) -> None:
            if p.grad is not None:
                pending.works.append(manager.allreduce(p.grad))

        for p in module.parameters():
            p.register_post_accumulate_grad_hook(average_grad)

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.module(*args, **kwargs)
