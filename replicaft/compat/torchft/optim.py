"""torchft's ``OptimizerWrapper(manager, optim)`` (exported as ``torchft.Optimizer``).

The optimizer is registered with replicaft's manager (its state healed, a healer's replay
stepping it) at the wrapper's first ``zero_grad`` or ``step``, not at construction: torchtitan
builds a wrapper in every mode and, under DiLoCo and LocalSGD, never calls it (its container
steps the inner optimizer itself, ``TorchFTOptimizersContainer``). That inner optimizer is the
group's own; registered, a healer's replay stepped it over the donor's synced DTensor weights
with plain-tensor moments ("got mixed torch.Tensor and DTensor").
"""

from __future__ import annotations

import torch

from replicaft.compat.torchft.manager import Manager
from replicaft.wrappers.optim import Optimizer as _Optimizer

__all__ = ["OptimizerWrapper"]


class OptimizerWrapper(_Optimizer):
    """``zero_grad`` starts the quorum, ``step`` commits (and steps only if committed)."""

    def __init__(self, manager: Manager, optim: torch.optim.Optimizer) -> None:
        # Not super().__init__, which registers the optimizer now (see the module's docstring).
        self.manager = manager.inner
        self.optimizer = optim
        self.lr_scheduler = None
        self._compat_manager: Manager | None = manager

    def _register_at_first_use(self) -> None:
        if self._compat_manager is not None:
            self.manager.register_optimizer(self.optimizer)
            self._compat_manager.note_registered_state(self.optimizer.state_dict)
            self._compat_manager = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._register_at_first_use()
        super().zero_grad(set_to_none)

    def step(self) -> bool:
        self._register_at_first_use()
        return super().step()
