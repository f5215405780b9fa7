"""Module buffers (BatchNorm running statistics) kept identical across replica groups.

Used by both gradient wrappers (ddp.py, fsdp.py). At the start of a step the buffers are
backed up; after backward they are averaged across the groups that contribute (healers send
zeros) in one float64 all-reduce; on commit the average is written back, on abort the backup
is restored, so a forward pass of a step that did not commit leaves no trace. DDP's
``broadcast_buffers`` keeps buffers equal within one job; torchft leaves them to drift apart
per group. The backup also serves snapshots taken while forward runs (the quorum thread reads
the step-start values, which is what a healer must receive).
"""

from __future__ import annotations

import torch
from torch import nn

from replicaft.column.process_group import ManagedWork
from replicaft.manager import Manager


class BufferAverager:
    def __init__(self, manager: Manager, module: nn.Module, *, enabled: bool = True) -> None:
        self._manager = manager
        self._module = module
        self.enabled = enabled
        self.backup: dict[str, torch.Tensor] = {}
        self._average: torch.Tensor | None = None
        self._work: ManagedWork | None = None

    def step_start(self) -> None:
        self.refresh_backup()
        self._average = None
        self._work = None

    def refresh_backup(self) -> None:
        self.backup = {n: b.detach().clone() for n, b in self._module.named_buffers()}

    def start_average(self) -> None:
        """Issue the all-reduce of the buffers (after backward, beside the gradients)."""
        if self.enabled and self.backup:
            self._average = self.flat()
            self._work = self._manager.allreduce(self._average)

    def flat(self) -> torch.Tensor:
        """The current buffers as one float64 vector (the layout ``write`` takes)."""
        return torch.cat([b.detach().reshape(-1).to(torch.float64) for _, b in self._module.named_buffers()])

    def adopt(self, average: torch.Tensor) -> None:
        """Take ``average`` (reduced elsewhere: the deterministic mode's exact sum, shard_gradients.py)
        as this step's average, written back on commit as if this averager had reduced it."""
        self._average = average
        self._work = ManagedWork(average, lambda: True)

    def wait(self) -> None:
        if self._work is not None:
            self._work.wait()

    def commit(self) -> None:
        if self._average is not None and self._work is not None:
            self.write(self._average)

    def abort(self) -> None:
        with torch.no_grad():
            for name, b in self._module.named_buffers():
                if name in self.backup:
                    b.copy_(self.backup[name])

    def capture(self) -> torch.Tensor | None:
        """A copy of this step's average, for a healer's replay (None when not averaged)."""
        return self._average.clone() if self._average is not None and self._work is not None else None

    def write(self, average: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for _, b in self._module.named_buffers():
                n = b.numel()
                b.copy_(average[offset : offset + n].reshape(b.shape).to(b.dtype))
                offset += n
