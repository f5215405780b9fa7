"""torchft's ``torchft.torchcomms``: ``ProcessGroupTorchComms``, refused at construction.

torchft wraps a ``torchcomms.TorchComm`` communicator (``mccl``, NCCL shrink/grow) and
reconfigures it on every quorum. replicaft builds and rebuilds its cross-group groups itself
(Gloo or NCCL, per quorum, abandoning a hung one: replicaft/column/process_group.py), so there
is no communicator of the caller's for it to adopt. The module imports without torchcomms
installed, so a program that only names the class still loads; building one raises, naming
the groups to use instead.
"""

from __future__ import annotations

from replicaft.compat.torchft.process_group import ProcessGroup
from replicaft.errors import OptionsError

__all__ = ["ProcessGroupTorchComms"]


class ProcessGroupTorchComms(ProcessGroup):
    """Not supported: see the module docstring."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise OptionsError(
            "ProcessGroupTorchComms (a torchcomms communicator) is not supported by replicaft, which builds its "
            "own cross-group groups; use torchft.process_group.ProcessGroupNCCL (GPUs) or ProcessGroupGloo (CPU)"
        )
