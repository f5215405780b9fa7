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

An optimizer that holds inner optimizers (torchtitan's ``OptimizersContainer``, whose
``optimizers`` are the ``torch.optim`` ones that step) also has their param groups' live
hyperparameters registered, as ``optimizer_param_groups``, loaded after everything else. Its
own ``state_dict`` may not carry them: ``TorchFTOptimizersContainer`` answers with a cache taken
at its construction (``cache_state_dict``, same moment tensors, but the learning rate of step
0), torchtitan's LR scheduler writes each step's rate into the inner optimizers' groups, and its
``load_state_dict`` restores only ``last_epoch``. A healer took the donor's moments and weights
with the learning rate of step 0 (4e-4 where the donor stepped with 8e-4), and after its first
step every parameter differed (issue 43). torchft heals the same cache, so it has the same gap.
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


def _inner_param_groups(optim: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The param groups of the optimizers ``optim`` steps (its ``optimizers``), live."""
    return [group for inner in optim.optimizers for group in inner.param_groups]  # type: ignore[attr-defined]


def _hyperparameters(optim: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "param_groups": [
            {k: v for k, v in group.items() if k not in ("params", "param_names")}
            for group in _inner_param_groups(optim)
        ]
    }


def _load_hyperparameters(optim: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    for group, healed in zip(_inner_param_groups(optim), state["param_groups"], strict=True):
        group.update(healed)


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
            if hasattr(self.optimizer, "optimizers"):
                optim = self.optimizer
                self.manager.register_state(
                    "optimizer_param_groups", lambda: _hyperparameters(optim), lambda s: _load_hyperparameters(optim, s)
                )
            self._compat_manager.note_registered_state(self.optimizer.state_dict)
            self._compat_manager = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._register_at_first_use()
        super().zero_grad(set_to_none)

    def step(self) -> bool:
        self._register_at_first_use()
        return super().step()
