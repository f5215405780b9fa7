"""replicaft: fault-tolerant data-parallel training for PyTorch.

Importing runs nothing but definitions, and does not import torch until a name that needs it
(``Manager``, the wrappers, the data sampler, ...) is first used: torch-free parts such as the
launcher's supervisor do not pay for importing torch (about two seconds here). Type checkers
see every name through the ``TYPE_CHECKING`` imports below. See README.md for the concepts
(replica group, quorum, heal, commit) and the step protocol.
"""

import gc
import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from replicaft.config.options import ManagerOptions as ManagerOptions
from replicaft.errors import CheckpointCorrupt as CheckpointCorrupt
from replicaft.errors import GroupBroken as GroupBroken
from replicaft.errors import GroupError as GroupError
from replicaft.errors import HealError as HealError
from replicaft.errors import OptionsError as OptionsError
from replicaft.errors import ReplicaftError as ReplicaftError
from replicaft.errors import StateError as StateError
from replicaft.errors import StepMismatch as StepMismatch

if TYPE_CHECKING:
    from replicaft.column.process_group import ManagedWork as ManagedWork
    from replicaft.data import ExactlyOnceSampler as ExactlyOnceSampler
    from replicaft.data import StepDataLoader as StepDataLoader
    from replicaft.local_sgd import DiLoCo as DiLoCo
    from replicaft.local_sgd import LocalSGD as LocalSGD
    from replicaft.manager import Manager as Manager
    from replicaft.state.registry import StepHooks as StepHooks
    from replicaft.wrappers.ddp import DistributedDataParallel as DistributedDataParallel
    from replicaft.wrappers.fsdp import FaultTolerantFSDP as FaultTolerantFSDP
    from replicaft.wrappers.fsdp import shard_optimizer_state as shard_optimizer_state
    from replicaft.wrappers.managed_group import ManagedProcessGroup as ManagedProcessGroup
    from replicaft.wrappers.optim import Optimizer as Optimizer

_NEEDS_TORCH = {
    "DiLoCo": "replicaft.local_sgd",
    "DistributedDataParallel": "replicaft.wrappers.ddp",
    "ExactlyOnceSampler": "replicaft.data",
    "FaultTolerantFSDP": "replicaft.wrappers.fsdp",
    "LocalSGD": "replicaft.local_sgd",
    "ManagedProcessGroup": "replicaft.wrappers.managed_group",
    "ManagedWork": "replicaft.column.process_group",
    "Manager": "replicaft.manager",
    "Optimizer": "replicaft.wrappers.optim",
    "StepDataLoader": "replicaft.data",
    "StepHooks": "replicaft.state.registry",
    "shard_optimizer_state": "replicaft.wrappers.fsdp",
}
"""Where each name that needs torch lives; imported on first use."""


def __getattr__(name: str) -> Any:
    module = _NEEDS_TORCH.get(name)
    if module is None:
        raise AttributeError(f"module 'replicaft' has no attribute {name!r}")
    value = getattr(_import_collector_paused(module), name)
    globals()[name] = value
    return value


def _import_collector_paused(module: str) -> ModuleType:
    """Import ``module`` with Python's cyclic garbage collector paused.

    The training side's modules define a few hundred classes and dataclasses; the objects that
    builds set off the collector's full passes, and each full pass walks every object torch
    has made (hundreds of thousands). Measured at a cold start here: 0.22 s to import the
    Manager and the wrappers with the collector on, 0.12 s with it paused; nothing an import
    makes is garbage, so pausing it loses nothing. A restarted group's time to its first
    commit (benchmarks/recovery.py) is the figure this serves."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(module)
    finally:
        if was_enabled:
            gc.enable()


__all__ = [
    "CheckpointCorrupt",
    "DiLoCo",
    "DistributedDataParallel",
    "ExactlyOnceSampler",
    "FaultTolerantFSDP",
    "GroupBroken",
    "GroupError",
    "HealError",
    "LocalSGD",
    "ManagedProcessGroup",
    "ManagedWork",
    "Manager",
    "ManagerOptions",
    "Optimizer",
    "OptionsError",
    "ReplicaftError",
    "StateError",
    "StepDataLoader",
    "StepHooks",
    "StepMismatch",
    "shard_optimizer_state",
]
