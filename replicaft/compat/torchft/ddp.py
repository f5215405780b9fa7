"""torchft's ``DistributedDataParallel(manager, module)`` on replicaft's bucketed FT all-reduce."""

from __future__ import annotations

from typing import Any

from torch import nn

from replicaft.compat.torchft.manager import Manager
from replicaft.wrappers.ddp import DistributedDataParallel as _DistributedDataParallel

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(_DistributedDataParallel):
    def __init__(self, manager: Manager, module: nn.Module, **kwargs: Any) -> None:
        super().__init__(manager.inner, module, **kwargs)
        manager.note_registered_state(self._state_dict)
