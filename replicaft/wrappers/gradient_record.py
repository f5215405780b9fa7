"""What a healer replays when gradients are averaged through a process group, not a wrapper.

replicaft's DDP and FSDP wrappers own their gradient buckets and capture them for a healer's
replay (heal/catchup.py). Gradients averaged through a :class:`ManagedProcessGroup` pass
through tensors the caller owns and may free at once (FSDP2's reduce-scatter outputs), so the
step is captured where it ends instead: the gradients the registered optimizers' parameters
hold when the healer records the step, which is what the donors' optimizers applied. The
capture runs only on a healer that records a step while its fetch is in flight (one copy of
the gradients per recorded step); a group that is up to date never pays for it.
"""

from __future__ import annotations

import torch

from replicaft.manager import Manager
from replicaft.state.registry import StepHooks

__all__ = ["GradientRecord"]


class GradientRecord(StepHooks):
    """Captures the registered optimizers' gradients for a replay, and restores the current
    step's gradients after it."""

    def __init__(self, manager: Manager) -> None:
        self._manager = manager
        self._current: list[torch.Tensor | None] | None = None
        """This step's own gradients while earlier steps are replayed into the parameters."""

    def capture_step(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else p.grad.detach().clone() for p in self._manager.optimizer_parameters()]

    def replay_prepare(self, record: list[torch.Tensor | None]) -> None:
        params = self._manager.optimizer_parameters()
        if self._current is None:
            self._current = [p.grad for p in params]
        for p, grad in zip(params, record, strict=True):
            p.grad = grad

    def end_replay(self) -> None:
        if self._current is None:
            return
        for p, grad in zip(self._manager.optimizer_parameters(), self._current, strict=True):
            p.grad = grad
        self._current = None
