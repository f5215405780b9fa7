"""Gradient buckets are all-reduced in index order whatever order backward fills them in, and
their gradients enter them already divided by the contributing groups.

The manager here only records the all-reduces the wrapper issues: what is under test is the
order the wrapper issues them in, which must be the same on every group (buckets.py), and
what they hold.
The end-to-end path (real groups, real collectives) is covered by test_training.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support.routed_train import Routed

from replicaft.config.options import ManagerOptions
from replicaft.errors import GroupError
from replicaft.wrappers.buckets import launch_in_order
from replicaft.wrappers.ddp import DistributedDataParallel


class _Done:
    def wait(self) -> bool:
        return True


class RecordingManager:
    """What the gradient wrapper calls on a manager; records each all-reduced tensor."""

    abandon_generation = 0
    options = ManagerOptions(lighthouse="127.0.0.1:29510", replica_id="g0")

    def __init__(self, contributors: int = 1) -> None:
        self.reduced: list[torch.Tensor] = []
        self.sent: list[torch.Tensor] = []
        """What each all-reduce was given, as it was then."""
        self.averaged: list[bool] = []
        self._plan = SimpleNamespace(num_contributors=contributors)

    def register_state(self, *args: Any) -> None:
        pass

    def register_hooks(self, hooks: Any) -> None:
        pass

    def wait_quorum(self) -> SimpleNamespace:
        return self._plan

    def allreduce(self, tensor: torch.Tensor, *, average: bool = True) -> _Done:
        self.reduced.append(tensor)
        self.sent.append(tensor.clone())
        self.averaged.append(average)
        return _Done()


def wrapped(contributors: int = 1) -> tuple[DistributedDataParallel, RecordingManager]:
    manager = RecordingManager(contributors)
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


@pytest.mark.parametrize("keep_grads", [False, True], ids=["grads-set-to-none", "grads-zeroed-in-place"])
def test_gradients_enter_their_buckets_divided_by_the_contributing_groups(keep_grads: bool) -> None:
    """The buckets are SUMmed, not averaged after: the division rides on the copy into the
    bucket (or, for a gradient already in its slot, one in-place pass)."""
    ddp, manager = wrapped(contributors=4)
    x = torch.randn(2, 8)
    reference = Routed()
    reference.load_state_dict(ddp.module.state_dict())
    reference(x, True).sum().backward()
    reference_grads = {n: p.grad for n, p in reference.named_parameters()}
    name_of = {id(p): n for n, p in ddp.module.named_parameters()}
    for _ in range(2):  # the second step finds each gradient already in its slot when kept
        manager.sent.clear()
        manager.averaged.clear()
        ddp.on_step_start()
        ddp.module.zero_grad(set_to_none=not keep_grads)
        ddp(x, True).sum().backward()
        assert manager.averaged == [False] * 4
        for bucket, sent in zip(ddp._buckets, manager.sent, strict=True):
            want = torch.cat([reference_grads[name_of[id(p)]].reshape(-1) / 4 for p in bucket.params])
            assert torch.allclose(sent, want)


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
