"""torchft 0.2.0's public modules on replicaft: a torchft program runs with its import changed,
or with none at all under ``replicaft-launch --torchft`` (``import torchft`` resolves here).

    import replicaft.compat.torchft as torchft          # was: import torchft

Modules, as in torchft: the top level, ``manager``, ``ddp``, ``optim``, ``data``,
``local_sgd``, ``checkpointing`` (and ``.transport``, ``.pg_transport``, ``.http_transport``),
``process_group``, ``coordination`` (and ``_torchft``, the name of torchft's Rust module),
``futures``, ``work``, ``utils``, ``multiprocessing`` and ``torchcomms``: all present with
replicaft installed without torchft.
Each module's docstring says what differs and what fails at construction. Importing runs
nothing but definitions (torchft's sets up OpenTelemetry loggers).
"""

from replicaft.compat.torchft.data import DistributedSampler
from replicaft.compat.torchft.ddp import DistributedDataParallel
from replicaft.compat.torchft.manager import Manager, WorldSizeMode
from replicaft.compat.torchft.optim import OptimizerWrapper as Optimizer
from replicaft.compat.torchft.process_group import (
    ProcessGroupBabyNCCL,
    ProcessGroupBabyXCCL,
    ProcessGroupGloo,
    ProcessGroupNCCL,
    ProcessGroupXCCL,
)

__all__ = [
    "DistributedDataParallel",
    "DistributedSampler",
    "Manager",
    "Optimizer",
    "ProcessGroupBabyNCCL",
    "ProcessGroupBabyXCCL",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "ProcessGroupXCCL",
    "WorldSizeMode",
]
