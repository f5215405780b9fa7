"""replicaft: fault-tolerant data-parallel training for PyTorch.

Importing runs nothing but definitions. See README.md for the concepts (replica group, quorum,
heal, commit) and the step protocol.
"""

from replicaft.ddp import DistributedDataParallel as DistributedDataParallel
from replicaft.errors import GroupBroken as GroupBroken
from replicaft.errors import GroupError as GroupError
from replicaft.errors import HealError as HealError
from replicaft.errors import OptionsError as OptionsError
from replicaft.errors import ReplicaftError as ReplicaftError
from replicaft.errors import StateError as StateError
from replicaft.errors import StepMismatch as StepMismatch
from replicaft.manager import Manager as Manager
from replicaft.optim import Optimizer as Optimizer
from replicaft.options import ManagerOptions as ManagerOptions

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
