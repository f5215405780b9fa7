"""torchft's process-group names, accepted and mapped: replicaft builds the real group itself.

A torchft script builds a ``ProcessGroupGloo`` (or NCCL, Baby*, XCCL) and hands it to the
``Manager``, which reconfigures it on every quorum. replicaft's manager owns its column
groups (rebuilt per quorum under a unique store prefix, abandoned rather than aborted), so
these objects only carry the backend and the timeout. What replicaft cannot honour fails
here, at construction: XCCL (Intel GPUs) has no replicaft backend. ``FakeProcessGroupWrapper``
(torchft's tests inject a collective error with it) wraps a group and hands a reported error
to the compat manager, whose own ``allreduce`` then fails the step with it; the wrappers'
all-reduces (DDP, DiLoCo) do not see it (compat manager.py, ``_StepWatch``).
``ErrorSwallowingProcessGroupWrapper`` keeps the error a script reports to it; the swallowing
itself is what replicaft's manager does for every collective (a failure fails the step and
never raises into the loop).
"""

from __future__ import annotations

import datetime
from typing import Any

from replicaft.errors import OptionsError
from replicaft.wrappers.managed_group import ManagedProcessGroup as NativeManagedProcessGroup

__all__ = [
    "ErrorSwallowingProcessGroupWrapper",
    "FakeProcessGroupWrapper",
    "ManagedProcessGroup",
    "ProcessGroup",
    "ProcessGroupBabyGloo",
    "ProcessGroupBabyNCCL",
    "ProcessGroupBabyXCCL",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "ProcessGroupXCCL",
]


class ProcessGroup:
    """Names a backend and a collective timeout for the manager's cross-group groups."""

    backend = "gloo"

    def __init__(self, timeout: datetime.timedelta = datetime.timedelta(seconds=60), **_: object) -> None:
        self.timeout = timeout


class ProcessGroupGloo(ProcessGroup):
    backend = "gloo"


class ProcessGroupNCCL(ProcessGroup):
    backend = "nccl"


class ProcessGroupBabyGloo(ProcessGroupGloo):
    """torchft runs a "baby" group in a subprocess so an abort cannot hang the trainer;
    replicaft abandons a hung collective instead (process_group.py), so it maps to Gloo."""


class ProcessGroupBabyNCCL(ProcessGroupNCCL):
    """See ``ProcessGroupBabyGloo``: mapped to NCCL, whose hung collectives replicaft abandons."""


class ProcessGroupXCCL(ProcessGroup):
    backend = "xccl"

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise OptionsError(
            "ProcessGroupXCCL (Intel GPUs) is not supported by replicaft; use ProcessGroupGloo or ProcessGroupNCCL"
        )


class ProcessGroupBabyXCCL(ProcessGroupXCCL):
    pass


class FakeProcessGroupWrapper(ProcessGroup):
    """Wraps a group; ``report_future_error(e)`` fails the next all-reduce through the manager."""

    def __init__(self, pg: ProcessGroup) -> None:
        if not isinstance(pg, ProcessGroup):
            raise OptionsError(f"FakeProcessGroupWrapper({pg!r}): wrap a process group from torchft.process_group")
        super().__init__(pg.timeout)
        self.backend = pg.backend
        self._error: Exception | None = None

    def report_future_error(self, e: Exception) -> None:
        self._error = e

    def take_error(self) -> Exception | None:
        error, self._error = self._error, None
        return error


class ErrorSwallowingProcessGroupWrapper(ProcessGroup):
    """Wraps a group (its backend and timeout are the manager's); ``report_error(e)`` records
    ``e`` for ``error()`` until ``configure`` (torchft's call on a new quorum) clears it.

    torchft's wrapper turns a failed collective into a finished dummy one so that model code
    needs no error handling; replicaft's manager already does that for every all-reduce it runs.
    """

    def __init__(self, pg: ProcessGroup) -> None:
        if not isinstance(pg, ProcessGroup):
            raise OptionsError(
                f"ErrorSwallowingProcessGroupWrapper({pg!r}): wrap a process group from torchft.process_group"
            )
        super().__init__(pg.timeout)
        self.backend = pg.backend
        self._error: Exception | None = None

    def configure(self, *args: object, **kwargs: object) -> None:
        """torchft 0.2.0's per-quorum call: here it only clears the reported error, since
        replicaft's manager builds the quorum's groups itself."""
        self._error = None

    def report_error(self, e: Exception) -> None:
        self._error = e

    def error(self) -> Exception | None:
        return self._error


class ManagedProcessGroup(NativeManagedProcessGroup):
    """torchft's ``ManagedProcessGroup(manager)``: replicaft's c10d group whose all-reduce is the
    manager's (replicaft/wrappers/managed_group.py), over the compat manager's replicaft one."""

    def __init__(self, manager: Any) -> None:
        super().__init__(getattr(manager, "inner", manager))
