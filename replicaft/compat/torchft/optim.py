"""torchft's ``OptimizerWrapper(manager, optim)`` (exported as ``torchft.Optimizer``).

The optimizer is registered with replicaft's manager (its state healed, a healer's replay
stepping it) at the wrapper's first ``zero_grad`` or ``step``, not at construction: torchtitan
builds a wrapper in every mode and, under DiLoCo and LocalSGD, never calls it (its container
steps the inner optimizer itself, ``TorchFTOptimizersContainer``). That inner optimizer is the
group's own; registered, a healer's replay stepped it over the donor's synced DTensor weights
with plain-tensor moments ("got mixed torch.Tensor and DTensor").

What is registered loads a healed state with its plain tensors made DTensors again where the
optimizer's own state holds DTensors (FSDP2 parameters' moments; aliasing.py's
``restore_dtensors``): ``torch.optim``'s load keeps a plain tensor plain beside a DTensor
parameter, and the next step fails the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from replicaft.compat.torchft.aliasing import restore_dtensors
from replicaft.compat.torchft.manager import Manager
from replicaft.wrappers.optim import Optimizer as _Optimizer

__all__ = ["OptimizerWrapper"]


class _HealedAsDTensors:
    """What replicaft's manager registers for ``optim`` (its state, its load, its step for a
    replay): ``optim`` itself, but for a load that restores DTensors."""

    def __init__(self, optim: torch.optim.Optimizer) -> None:
        self._optim = optim

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self._optim.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self._optim.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._optim.load_state_dict(restore_dtensors(state, self._optim.state_dict()))

    def step(self) -> None:
        self._optim.step()


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
            self.manager.register_optimizer(_HealedAsDTensors(self.optimizer))  # type: ignore[arg-type]
            self._compat_manager.note_registered_state(self.optimizer.state_dict)
            self._compat_manager = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._register_at_first_use()
        super().zero_grad(set_to_none)

    def step(self) -> bool:
        self._register_at_first_use()
        return super().step()
