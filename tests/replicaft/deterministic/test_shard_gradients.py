"""The deterministic mode inside the DDP wrapper (shard_gradients.py), groups as threads of one process.

A unit test of the arithmetic and the bookkeeping, not of the network: each "group" is a
thread with its own copy of the model and its own DDP wrapper, and the fake manager's
all-reduce meets the other threads' at a barrier (the integration test,
test_deterministic_training.py, runs real processes over Gloo). The same 6 shards of a global
batch, dealt to 1, 2 or 3 groups, must leave bitwise-identical averaged gradients and
BatchNorm statistics: dropout is seeded per shard, BatchNorm restored before each shard.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import torch
from torch import nn

from lighthouse.rules.plan import StepPlan
from replicaft.config.options import ManagerOptions
from replicaft.deterministic.rules import owned_shards
from replicaft.errors import GroupError
from replicaft.wrappers.ddp import DistributedDataParallel

SHARDS = 6
SHARD_SIZE = 4
FORWARD = threading.Lock()


class _Done:
    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def wait(self) -> bool:
        return True

    def tensor(self) -> torch.Tensor:
        return self._tensor


class Column:
    """The all-reduce the fake managers of one quorum meet at."""

    def __init__(self, size: int) -> None:
        self._barrier = threading.Barrier(size, timeout=30)
        self._deposits: dict[str, torch.Tensor] = {}

    def allreduce(self, replica_id: str, tensor: torch.Tensor, reduce: str) -> None:
        self._deposits[replica_id] = tensor.clone()
        self._barrier.wait()
        values = [self._deposits[k] for k in sorted(self._deposits)]
        result = values[0].clone()
        for v in values[1:]:
            result = torch.maximum(result, v) if reduce == "max" else result + v
        self._barrier.wait()
        tensor.copy_(result)


class ThreadManager:
    """What the DDP wrapper asks of a manager, for one group of a quorum of threads."""

    abandon_generation = 0

    def __init__(self, column: Column, replica_id: str, donors: tuple[str, ...], *, healing: bool = False) -> None:
        self.options = ManagerOptions(
            lighthouse="127.0.0.1:29510", replica_id=replica_id, deterministic=True, virtual_shards=SHARDS, seed=7
        )
        self.plan = StepPlan(
            quorum_id=1,
            incarnation=1,
            replica_id=replica_id,
            replica_rank=0,
            num_replicas=len(donors),
            max_step=3,
            step=3 if not healing else 0,
            donors=donors,
            healers=(replica_id,) if healing else (),
            participants=(),
        )
        self._column = column
        self.fields: dict[str, Any] = {}

    def register_state(self, *args: Any) -> None:
        pass

    def register_hooks(self, hooks: Any) -> None:
        pass

    def wait_quorum(self) -> StepPlan:
        return self.plan

    def current_step(self) -> int:
        return 3

    def annotate_commit(self, **fields: Any) -> None:
        self.fields.update(fields)

    def allreduce(self, tensor: torch.Tensor, *, reduce: str = "sum", average: bool = True) -> _Done:
        assert not average, "the deterministic mode reduces without averaging"
        if self.plan.healing:
            tensor.zero_()
        self._column.allreduce(self.options.replica_id, tensor, reduce)
        return _Done(tensor)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))


DATA = torch.randn(SHARDS * SHARD_SIZE, 8, generator=torch.Generator().manual_seed(3))
LABELS = torch.randn(SHARDS * SHARD_SIZE, 1, generator=torch.Generator().manual_seed(4))


def one_group(manager: ThreadManager, net: nn.Module, out: dict[str, Any]) -> None:
    ddp = DistributedDataParallel(manager, net, bucket_cap_mb=0.0005)  # type: ignore[arg-type]
    ddp.on_step_start()
    shards = (
        list(owned_shards(SHARDS, manager.plan.donors, manager.options.replica_id)) if not manager.plan.healing else []
    )
    for k in shards or [0]:  # a group without shards still runs one backward
        x, y = DATA[k * SHARD_SIZE : (k + 1) * SHARD_SIZE], LABELS[k * SHARD_SIZE : (k + 1) * SHARD_SIZE]
        with FORWARD:  # torch's generator is one per process: threads take turns seeding and drawing
            prediction = ddp(x)
        nn.functional.mse_loss(prediction, y).backward()
    ddp.on_commit()
    out[manager.options.replica_id] = (
        [p.grad.clone() for p in net.parameters()],
        [b.clone() for b in net.buffers()],
        manager.fields,
    )


def train_step(donors: tuple[str, ...], healers: tuple[str, ...] = ()) -> dict[str, Any]:
    everyone = donors + healers
    column = Column(len(everyone))
    out: dict[str, Any] = {}
    threads = [
        threading.Thread(
            target=one_group,
            args=(ThreadManager(column, rid, donors, healing=rid in healers), copy.deepcopy(model()), out),
        )
        for rid in everyone
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == len(everyone), "a group thread failed"
    return out


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("donors", [("g0", "g1"), ("g0", "g1", "g2"), ("a", "b", "c", "d", "e", "f")])
def test_gradients_and_batchnorm_statistics_do_not_depend_on_the_grouping(donors: tuple[str, ...]) -> None:
    alone = train_step(("g0",))["g0"]
    for grads, buffers, _ in train_step(donors).values():
        assert same(grads, alone[0])
        assert same(buffers, alone[1])


def test_a_healer_contributes_zeros_and_receives_the_same_average() -> None:
    alone = train_step(("g0",))["g0"]
    out = train_step(("g0", "g1"), healers=("g2",))
    for grads, buffers, _ in out.values():
        assert same(grads, alone[0]) and same(buffers, alone[1])


def test_the_commit_carries_the_fixed_point_bound() -> None:
    _, _, fields = train_step(("g0",))["g0"]
    assert 0 < fields["fixed_point_bound"] < 1e-15


def test_a_backward_beyond_the_owned_shards_is_refused() -> None:
    manager = ThreadManager(Column(1), "g0", ("g0", "g1", "g2"))  # a quorum of one thread: reductions are its own
    ddp = DistributedDataParallel(manager, model())  # type: ignore[arg-type]
    ddp.on_step_start()
    for _ in range(2):  # g0 owns shards 0 and 1 of 6
        nn.functional.mse_loss(ddp(DATA[:4]), LABELS[:4]).backward()
    with pytest.raises(GroupError, match=r"backward ran 3 times in one step; .* owns \(2: shards \[0, 1\]\)"):
        nn.functional.mse_loss(ddp(DATA[:4]), LABELS[:4]).backward()


def test_an_evaluation_forward_after_the_commit_keeps_the_committed_statistics() -> None:
    manager = ThreadManager(Column(1), "g0", ("g0",))
    net = model()
    ddp = DistributedDataParallel(manager, net)  # type: ignore[arg-type]
    ddp.on_step_start()
    for k in range(SHARDS):
        nn.functional.mse_loss(ddp(DATA[k * SHARD_SIZE : (k + 1) * SHARD_SIZE]), LABELS[:SHARD_SIZE]).backward()
    ddp.on_commit()
    committed = [b.clone() for b in net.buffers()]
    net.eval()
    with torch.no_grad():
        ddp(DATA)
    assert same([b.clone() for b in net.buffers()], committed)
