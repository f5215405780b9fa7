"""``replicaft.ManagedProcessGroup``: the manager's all-reduce as a real c10d process group.

Across real processes (a real lighthouse, SIGKILL, restart): two groups train an FSDP2 model
whose gradients are averaged only through ``dist.all_reduce(group=ManagedProcessGroup(...),
op=AVG)`` in FSDP2's all-reduce hook, as torchtitan's HSDP does (tests/support/managed_group_train.py).
One group is killed mid-all-reduce and restarted; it heals, and the digests of every committed
step are equal across the groups. A second run slows the donor so the heal outlasts steps,
which the healer replays from the gradients it recorded (gradient_record.py).

In one process: the c10d surface (registration, functional collectives, DeviceMesh) on a
manager whose quorum is a single group.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from conftest import REPO_ROOT, start_lighthouse
from support.training_events import assert_digests_agree, read_events, start_group, wait_for_event
from torch.distributed.device_mesh import DeviceMesh

import replicaft
from replicaft.errors import OptionsError

SCRIPT = str(REPO_ROOT / "tests" / "support" / "managed_group_train.py")


def commits_of(events: Path, replica_id: str, after_ts: float = 0.0) -> list[int]:
    return [
        e["step"]
        for e in read_events(events)
        if e["event"] == "committed" and e["replica_id"] == replica_id and e["ts"] > after_ts
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_groups_averaging_through_the_managed_group_survive_a_killed_group_with_equal_digests(
    tmp_path: Path,
) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    g0 = start_group(lh.grpc_address, "g0", tmp_path, "60", "0.05", script=SCRIPT)
    g1 = start_group(lh.grpc_address, "g1", tmp_path, "60", "0.05", script=SCRIPT, fault_points="allreduce@12")
    assert g1.wait_exit(90) == -signal.SIGKILL, g1.output_tail()
    restarted_at = time.time()
    g1 = start_group(lh.grpc_address, "g1", tmp_path, "60", "0.05", script=SCRIPT)
    heal = wait_for_event(
        tmp_path,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e.get("base_step", 0) > 0,
        90,
        "g1 healed after its restart",
        g1,
    )
    assert heal["ok"], heal
    for rid, g in (("g0", g0), ("g1", g1)):
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    assert_digests_agree(tmp_path, min_steps=55)
    after_restart = commits_of(tmp_path, "g1", restarted_at)
    assert min(after_restart) > 11, f"the restarted g1 started over instead of healing: {sorted(after_restart)[:5]}"
    assert max(after_restart) >= 59


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_heal_slower_than_a_step_replays_the_gradients_averaged_through_the_group(tmp_path: Path) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    args = ("80", "0.1")
    g0 = start_group(lh.grpc_address, "g0", tmp_path, *args, script=SCRIPT, fault_points="slow_serve@10")
    g1 = start_group(lh.grpc_address, "g1", tmp_path, *args, script=SCRIPT, fault_points="allreduce@15")
    assert g1.wait_exit(90) == -signal.SIGKILL, g1.output_tail()
    g1 = start_group(lh.grpc_address, "g1", tmp_path, *args, script=SCRIPT)
    heal = wait_for_event(
        tmp_path,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e.get("base_step", 0) > 0,
        90,
        "g1 heal after restart",
        g1,
    )
    assert heal["ok"], heal
    assert heal["replayed_steps"] >= 1, f"the slowed transfer did not outlast a step: {heal}"
    for rid, g in (("g0", g0), ("g1", g1)):
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    assert_digests_agree(tmp_path, min_steps=75)


@pytest.fixture
def solo_manager(tmp_path: Path) -> Iterator[replicaft.Manager]:
    """A started manager whose quorum is this one group, inside a one-rank default group."""
    lh = start_lighthouse(status=False)
    options = replicaft.ManagerOptions(lighthouse=lh.grpc_address, replica_id="solo", events_dir=str(tmp_path))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with replicaft.Manager(options) as manager:
            yield manager
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_group_serves_c10d_functional_collectives_and_a_device_mesh(solo_manager: replicaft.Manager) -> None:
    pg = replicaft.ManagedProcessGroup(solo_manager).register("dp_replicate_solo")
    solo_manager.start_quorum()
    t = torch.full((3,), 4.0)
    dist.all_reduce(t, group=pg, op=dist.ReduceOp.AVG)
    work = dist.all_reduce(t, group=pg, op=dist.ReduceOp.SUM, async_op=True)
    assert work.wait() and torch.equal(t, torch.full((3,), 4.0))
    assert torch.equal(funcol.all_reduce(torch.ones(2), "avg", group=pg).wait(), torch.ones(2))
    assert pg.size() == 1 and pg.group_name and pg.errored() is None
    mesh = DeviceMesh.from_group(pg, "cpu", mesh_dim_names=("dp_replicate",))
    assert mesh.get_group("dp_replicate") is pg
    assert solo_manager.should_commit()
    with pytest.raises(OptionsError, match="already registered"):
        replicaft.ManagedProcessGroup(solo_manager).register("dp_replicate_solo")


def test_what_the_group_cannot_do_fails_with_the_alternative() -> None:
    with pytest.raises(OptionsError, match="torchft.process_group.ManagedProcessGroup"):
        replicaft.ManagedProcessGroup(object())  # type: ignore[arg-type]


def unstarted_manager(tmp_path: Path) -> replicaft.Manager:
    """Built, never started: the constructor opens nothing (manager.py)."""
    return replicaft.Manager(
        replicaft.ManagerOptions(lighthouse="127.0.0.1:1", replica_id="u", events_dir=str(tmp_path))
    )


def test_only_one_tensor_and_sum_avg_max_are_accepted_and_register_needs_a_default_group(tmp_path: Path) -> None:
    pg = replicaft.ManagedProcessGroup(unstarted_manager(tmp_path))
    with pytest.raises(OptionsError, match="one tensor"):
        pg.allreduce([torch.ones(1), torch.ones(1)], dist.AllreduceOptions())
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.PRODUCT
    with pytest.raises(OptionsError, match="only SUM, AVG and MAX"):
        pg.allreduce([torch.ones(1)], opts)
    with pytest.raises(OptionsError, match="AVG needs floats"):
        pg.allreduce([torch.ones(1, dtype=torch.int64)], dist.ReduceOp.AVG)
    with pytest.raises(OptionsError, match="init_process_group first"):
        pg.register("dp_replicate")
    with pytest.raises(OptionsError, match="not registered"):
        _ = pg.group_name
