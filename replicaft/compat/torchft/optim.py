"""torchft's ``OptimizerWrapper(manager, optim)`` (exported as ``torchft.Optimizer``)."""

from __future__ import annotations

import torch

from replicaft.compat.torchft.manager import Manager
from replicaft.wrappers.optim import Optimizer as _Optimizer

__all__ = ["OptimizerWrapper"]


class OptimizerWrapper(_Optimizer):
    """``zero_grad`` starts the quorum, ``step`` commits (and steps only if committed)."""

    def __init__(self, manager: Manager, optim: torch.optim.Optimizer) -> None:
        super().__init__(manager.inner, optim)
        manager.note_registered_state(optim.state_dict)
