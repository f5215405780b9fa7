"""Gradient buckets are all-reduced in index order whatever order backward fills them in.

The manager here only records the all-reduces the wrapper issues: what is under test is the
order the wrapper issues them in, which must be the same on every group (buckets.py).
The end-to-end path (real groups, real collectives) is covered by test_training.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from routed_train import Routed

from replicaft.buckets import launch_in_order
from replicaft.ddp import DistributedDataParallel
from replicaft.errors import GroupError
from replicaft.options import ManagerOptions


class _Done:
    def wait(self) -> bool:
        return True


class RecordingManager:
    """What the gradient wrapper calls on a manager; records each all-reduced tensor."""

    abandon_generation = 0
    options = ManagerOptions(lighthouse="127.0.0.1:29510", replica_id="g0")

    def __init__(self) -> None:
        self.reduced: list[torch.Tensor] = []

    def register_state(self, *args: Any) -> None:
        pass

    def register_hooks(self, hooks: Any) -> None:
        pass

    def allreduce(self, tensor: torch.Tensor) -> _Done:
        self.reduced.append(tensor)
        return _Done()


def wrapped() -> tuple[DistributedDataParallel, RecordingManager]:
    manager = RecordingManager()
    ddp = DistributedDataParallel(manager, Routed(), bucket_cap_mb=1e-6)  # type: ignore[arg-type]
    return ddp, manager


def bucket_indices(ddp: DistributedDataParallel, reduced: list[torch.Tensor]) -> list[int]:
    return [next(i for i, b in enumerate(ddp._buckets) if b.buffer is t) for t in reduced]


@pytest.mark.parametrize("use_b", [True, False], ids=["every-parameter", "b-unused"])
def test_buckets_are_reduced_in_index_order_whichever_parameters_the_batch_used(use_b: bool) -> None:
    ddp, manager = wrapped()
    assert len(ddp._buckets) == 4  # one parameter each: b.bias, b.weight, a.bias, a.weight
    ddp(torch.randn(2, 8), use_b).sum().backward()
    # With b unused, a's buckets (2, 3) fill during backward and b's only at its end:
    # launched as they filled, this group would reduce 2, 3, 0, 1 and a group whose batch
    # used b would reduce 0, 1, 2, 3, pairing different buckets.
    assert bucket_indices(ddp, manager.reduced) == [0, 1, 2, 3]


def test_a_second_backward_in_one_step_is_refused_by_name() -> None:
    ddp, _ = wrapped()
    loss = ddp(torch.randn(2, 8), True).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(GroupError, match="second backward"):
        loss.backward()


def test_launch_in_order_stops_at_the_first_bucket_not_full() -> None:
    launched: list[int] = []
    full = {0: True, 1: True, 2: False, 3: True}
    assert launch_in_order([0, 1, 2, 3], 0, full.__getitem__, launched.append) == 2
    assert launch_in_order([0, 1, 2, 3], 2, lambda _: True, launched.append) == 4
    assert launched == [0, 1, 2, 3]
