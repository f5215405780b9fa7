"""torchft's ``LocalSGD`` and ``DiLoCo`` (with torchft's arguments) on replicaft.local_sgd.

What differs from torchft, and why (replicaft/local_sgd/diloco.py has the design): the first
inner step ends with a join sync (all groups take the same weights, a restarted group heals
and joins at the others' next sync) and that step's update is replaced by the synced weights;
a sync that does not commit is retried at once instead of discarding the round; ``should_quantize=True`` sends packed
8-bit pseudo-gradients
(replicaft/local_sgd/wire.py) where torchft sends fp8. ``backup_device``, ``pin_memory``,
``use_bucketization`` and ``bucket_cap_mb`` are accepted: the synced copy lives beside the
parameters and each fragment's pseudo-gradient travels as one flat buffer. The states the
script registered with the manager (its model's local weights and inner optimizer) no longer
travel in a heal (``Manager.keep_user_state_per_group``): they differ between groups by
design, and replicaft heals from the donors' majority where torchft copies one donor; a
healer takes the synced fragments and outer optimizers, and keeps its own inner optimizer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from replicaft.compat.torchft.manager import Manager
from replicaft.local_sgd import DiLoCo as _DiLoCo
from replicaft.local_sgd import LocalSGD as _LocalSGD

__all__ = ["DiLoCo", "LocalSGD"]

logger = logging.getLogger(__name__)


class LocalSGD(_LocalSGD):
    def __init__(self, manager: Manager, model: nn.Module, optimizer: torch.optim.Optimizer, sync_every: int) -> None:
        super().__init__(manager.inner, model, optimizer, sync_every, join_on_enter=False)
        manager.keep_user_state_per_group()


class DiLoCo(_DiLoCo):
    def __init__(
        self,
        manager: Manager,
        model_fragments: list[nn.Module],
        inner_optimizer: torch.optim.Optimizer,
        outer_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        sync_every: int,
        backup_device: torch.device | None = None,
        pin_memory: bool = True,
        use_bucketization: bool = False,
        bucket_cap_mb: int | None = None,
        should_quantize: bool = False,
        fragment_sync_delay: int = 0,
        fragment_update_alpha: float = 0.0,
    ) -> None:
        if backup_device is not None:
            logger.info(
                "backup_device=%s accepted: replicaft keeps each fragment's synced copy beside its parameters",
                backup_device,
            )
        super().__init__(
            manager.inner,
            model_fragments,
            inner_optimizer,
            outer_optimizer,
            sync_every,
            fragment_sync_delay=fragment_sync_delay,
            fragment_update_alpha=fragment_update_alpha,
            wire="int8" if should_quantize else "fp32",
            join_on_enter=False,
        )
        manager.keep_user_state_per_group()
        manager._views.update(
            {f"StreamingDiLoCoFragment_{f.index}": self._fragment_view(f.index) for f in self.fragments}
        )

    def _fragment_view(self, index: int) -> Callable[[], dict[str, Any]]:
        fragment = self.fragments[index]
        return lambda: {"original_parameters": dict(fragment.synced), "outer_optimizer": fragment.outer.state_dict()}
