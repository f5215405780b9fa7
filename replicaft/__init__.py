"""replicaft: fault-tolerant data-parallel training for PyTorch.

Importing runs nothing but definitions, and does not import torch until ``Manager``,
``DistributedDataParallel`` or ``Optimizer`` is first used. See README.md for the concepts
(replica group, quorum, heal, commit) and the step protocol.
"""

import importlib
from typing import Any

from replicaft.errors import GroupBroken as GroupBroken
from replicaft.errors import GroupError as GroupError
from replicaft.errors import HealError as HealError
from replicaft.errors import OptionsError as OptionsError
from replicaft.errors import ReplicaftError as ReplicaftError
from replicaft.errors import StateError as StateError
from replicaft.errors import StepMismatch as StepMismatch
from replicaft.options import ManagerOptions as ManagerOptions

_NEEDS_TORCH = {"DistributedDataParallel": "replicaft.ddp", "Manager": "replicaft.manager", "Optimizer": "replicaft.optim"}
"""Imported on first use, so that torch-free parts (the launcher's supervisor, ``replicaft.errors``)
do not pay for importing torch (about two seconds here)."""


def __getattr__(name: str) -> Any:
    module = _NEEDS_TORCH.get(name)
    if module is None:
        raise AttributeError(f"module 'replicaft' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DistributedDataParallel",
    "GroupBroken",
    "GroupError",
    "HealError",
    "Manager",
    "ManagerOptions",
    "Optimizer",
    "OptionsError",
    "ReplicaftError",
    "StateError",
    "StepMismatch",
]
