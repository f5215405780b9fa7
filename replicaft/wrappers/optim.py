"""The optimizer wrapper: ``zero_grad`` starts the step's quorum, ``step`` commits or skips.

The optimizer (every moment and step count) and an LR scheduler are registered with the
manager (``Manager.register_optimizer``): a heal transfers their state, a checkpoint saves it,
and a healer's replay of the steps it missed steps them directly, so nothing calls back into
this wrapper while its ``step`` is on the stack. The scheduler steps only when the optimizer
really stepped, so the learning rate follows committed steps, not attempts.
"""

from __future__ import annotations

from typing import Any

import torch

from replicaft.manager import Manager


class Optimizer:
    """Wrap ``optimizer`` (and optionally ``lr_scheduler``) for fault-tolerant training."""

    def __init__(
        self,
        manager: Manager,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.manager = manager
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        manager.register_optimizer(optimizer, lr_scheduler)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start the step: the quorum is requested in the background while forward runs."""
        self.manager.start_quorum()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> bool:
        """Apply the step if it commits; returns whether it did."""
        if not self.manager.should_commit():
            return False
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return True

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> dict[torch.Tensor, Any]:
        """The optimizer's per-parameter state (its moments), as ``torch.optim.Optimizer.state``."""
        return self.optimizer.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add parameters to the optimizer. A heal and a replay read the optimizer's groups when
        they run, so the new ones are included from then on; every group must add the same
        parameters at the same step, or their optimizer states no longer match."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
