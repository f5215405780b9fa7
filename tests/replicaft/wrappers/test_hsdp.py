"""HSDP (replicaft/wrappers/fsdp.py, and DTensor state in replicaft/state/flat.py).

Unit tests on a one-rank mesh: a DTensor travels as its local shard, a Partial one is
refused, and loaded optimizer moments become DTensors again.

Across real processes: two replica groups of two FSDP2 ranks each, under torchrun. Each group runs
``examples/train_hsdp.py`` (FSDP2 over its two ranks, Gloo, BatchNorm, AdamW,
an LR schedule). One rank of one group is SIGKILLed; its torchrun tears the group down; the
other group keeps committing alone. The killed group is started again (a new torchrun), each
of its ranks heals its own shards from the same rank of the survivor, and from then on the
digests of every committed step agree rank by rank across the groups.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import REPO_ROOT, ManagedProcess, spawn_python, start_lighthouse
from support.training_events import assert_digests_agree, read_events, wait_for_event
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Shard

from replicaft.checkpoint import CheckpointReader
from replicaft.checkpoint.layout import MANIFEST_FILE
from replicaft.errors import StateError
from replicaft.state.flat import flatten, unflatten
from replicaft.wrappers.fsdp import shard_optimizer_state

EXAMPLE = str(REPO_ROOT / "examples" / "train_hsdp.py")
ARGS = ("--steps", "100000", "--step-delay", "0.02", "--norm", "batch")
"""Groups train until the test stops them: a finite --steps would race the restart."""


@pytest.fixture
def one_rank_mesh() -> Iterator[DeviceMesh]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensor_flattens_to_its_local_shard_without_a_copy(one_rank_mesh: DeviceMesh) -> None:
    local = torch.arange(6.0).reshape(3, 2)
    sharded = DTensor.from_local(local, one_rank_mesh, [Shard(0)])
    flat = flatten({"w": torch.nn.Parameter(sharded)})
    (t,) = flat.tensors
    assert type(t) is torch.Tensor and not t.requires_grad
    assert t.data_ptr() == local.data_ptr() and torch.equal(t, local)


def test_partial_dtensor_is_refused_with_its_path(one_rank_mesh: DeviceMesh) -> None:
    pending = DTensor.from_local(torch.ones(2), one_rank_mesh, [Partial()])
    with pytest.raises(StateError, match=r"state\.model\.w.*pending reduction"):
        flatten({"model": {"w": pending}})


def test_loaded_optimizer_moments_become_dtensors_and_step_like_the_original(one_rank_mesh: DeviceMesh) -> None:
    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = fully_shard(torch.nn.Linear(4, 3), mesh=one_rank_mesh)
        return model, shard_optimizer_state(torch.optim.AdamW(model.parameters(), lr=0.1))

    def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()

    model, optimizer = build()
    train_step(model, optimizer)
    flat = flatten(optimizer.state_dict())
    copy_model, copy_optimizer = build()
    with torch.no_grad():
        for p, q in zip(model.parameters(), copy_model.parameters(), strict=True):
            q.to_local().copy_(p.to_local())
    copy_optimizer.load_state_dict(unflatten(flat.skeleton, [t.clone() for t in flat.tensors]))
    moments = [v for state in copy_optimizer.state.values() for k, v in state.items() if k != "step"]
    assert moments and all(isinstance(v, DTensor) for v in moments)
    train_step(model, optimizer)
    train_step(copy_model, copy_optimizer)
    for p, q in zip(model.parameters(), copy_model.parameters(), strict=True):
        assert torch.equal(p.to_local(), q.to_local())


def group_env(lighthouse: str, replica_id: str, events: Path, fault_points: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        REPLICAFT_LIGHTHOUSE=lighthouse,
        REPLICAFT_REPLICA_ID=replica_id,
        REPLICAFT_EVENTS_DIR=str(events),
        REPLICAFT_FAULT_POINTS=fault_points,
    )
    return env


def start_hsdp_group(lighthouse: str, replica_id: str, events: Path) -> ManagedProcess:
    env = group_env(lighthouse, replica_id, events)
    # --shutdown-timeout: when one rank dies, its peer may be waiting on it inside the group
    # (the group's quorum or vote) for up to a collective or quorum timeout before it sees
    # torchrun's SIGTERM; after 5 s torchrun SIGKILLs it, as an orchestrator would.
    return spawn_python(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "5",
        EXAMPLE,
        *ARGS,
        name=replica_id,
        env=env,
    )


def worker_pids(events: Path) -> set[int]:
    return {e["pid"] for e in read_events(events) if e["event"] == "start"}


@contextlib.contextmanager
def stopped_at_exit(groups: dict[str, ManagedProcess], events: Path) -> Iterator[None]:
    """SIGTERM every torchrun (it stops its workers: replicaft exits at the step boundary),
    then SIGKILL any worker this test started that is still alive; killing only the torchrun
    would orphan its workers."""
    try:
        yield
    finally:
        for g in groups.values():
            if g.popen.poll() is None:
                g.send_signal(signal.SIGTERM)
        for g in groups.values():
            with contextlib.suppress(AssertionError):
                g.wait_exit(30)
        for pid in worker_pids(events):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def committed(e: dict, replica_id: str, rank: int) -> bool:
    return e["event"] == "commit" and e["replica_id"] == replica_id and e["group_rank"] == rank and e["committed"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rank_killed_group_down_other_continues_restarted_group_heals_its_shards(tmp_path: Path) -> None:
    lh = start_lighthouse("--progress-timeout", "30", status=False)
    groups = {rid: start_hsdp_group(lh.grpc_address, rid, tmp_path) for rid in ("g0", "g1")}
    with stopped_at_exit(groups, tmp_path):
        wait_for_event(tmp_path, lambda e: committed(e, "g1", 1) and e["step"] >= 5, 90, "g1 rank 1 at step 5")
        start = wait_for_event(
            tmp_path,
            lambda e: e["event"] == "start" and e["replica_id"] == "g1" and e["group_rank"] == 1,
            1,
            "g1/1 start",
        )
        os.kill(start["pid"], signal.SIGKILL)
        killed_at = time.time()
        assert groups["g1"].wait_exit(60) != 0
        for rank in (0, 1):
            wait_for_event(
                tmp_path,
                lambda e, rank=rank: committed(e, "g0", rank) and e["num_contributors"] == 1 and e["ts"] > killed_at,
                30,
                f"g0 rank {rank} committing alone",
            )

        groups["g1"] = start_hsdp_group(lh.grpc_address, "g1", tmp_path)
        restarted_at = time.time()
        heals = [
            wait_for_event(
                tmp_path,
                lambda e, rank=rank: (
                    e["event"] == "heal_end"
                    and e["replica_id"] == "g1"
                    and e["group_rank"] == rank
                    and e["ok"]
                    and e["ts"] > restarted_at
                ),
                90,
                f"g1 rank {rank} healed",
            )
            for rank in (0, 1)
        ]
        assert all(h["num_bytes"] > 0 for h in heals), heals
        healed_step = max(h["step"] for h in heals)
        for rank in (0, 1):
            wait_for_event(
                tmp_path,
                lambda e, rank=rank: (
                    committed(e, "g1", rank) and e["num_contributors"] == 2 and e["step"] >= healed_step + 5
                ),
                30,
                f"g1 rank {rank} contributing 5 steps after its heal",
            )

    assert_digests_agree(tmp_path, min_steps=10)
    # The comparison must have covered the healed group: steps both groups committed after the
    # restart, for both ranks (assert_digests_agree showed their digests are equal).
    both: dict[tuple[int, int], set[str]] = defaultdict(set)
    for e in read_events(tmp_path):
        if e["event"] == "committed" and e["ts"] > restarted_at:
            both[(e["step"], e["group_rank"])].add(e["replica_id"])
    for rank in (0, 1):
        shared = [step for (step, r), rids in both.items() if r == rank and rids == {"g0", "g1"}]
        assert len(shared) >= 5, (
            f"rank {rank}: only steps {sorted(shared)} were committed by both groups after the heal"
        )
    g1_steps = [e["step"] for e in read_events(tmp_path) if committed(e, "g1", 0) and e["ts"] > restarted_at]
    assert min(g1_steps) > 5, f"the restarted g1 started over instead of healing: {sorted(g1_steps)[:5]}"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_heal_slower_than_a_step_replays_missed_steps_on_sharded_state(tmp_path: Path) -> None:
    # One rank per group (FSDP over a mesh of one), so the replay path is tested alone: g0's
    # state server is slowed (slow_serve: 1.5 s per range) so that g1's heal after its restart
    # outlasts several steps; g1 records them and replays them on its healed shards
    # (capture_step, replay_prepare, replay_apply). min_replicas=2 holds g0 until g1 is back.
    lh = start_lighthouse("--min-replicas", "2", status=False)
    # The donor still trains when the slowed transfer ends: --step-delay keeps its 65 steps after
    # the restart well over one slowed range (with one thread per process they took 1.2 s unpaced).
    args = ("--steps", "80", "--norm", "batch", "--step-delay", "0.1")
    faults = {"g0": "slow_serve@10", "g1": "allreduce@15"}
    groups = {
        rid: spawn_python(EXAMPLE, *args, name=rid, env=group_env(lh.grpc_address, rid, tmp_path, faults[rid]))
        for rid in ("g0", "g1")
    }
    assert groups["g1"].wait_exit(120) == -signal.SIGKILL
    groups["g1"] = spawn_python(EXAMPLE, *args, name="g1", env=group_env(lh.grpc_address, "g1", tmp_path))
    heal = wait_for_event(
        tmp_path,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e.get("base_step", 0) > 0,
        90,
        "g1 heal after restart",
    )
    assert heal["ok"], heal
    assert heal["replayed_steps"] >= 1, f"the slowed transfer did not outlast a step: {heal}"
    for rid, g in groups.items():
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    assert_digests_agree(tmp_path, min_steps=75)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sharded_group_killed_whole_resumes_each_rank_from_its_checkpoint_shards(tmp_path: Path) -> None:
    """W = 2 persistent checkpoints through the manager: each rank saves its own shards, and
    after the whole job died each rank resumes bitwise what it had saved (a fresh optimizer
    included, whose moments are read whole and cut to the rank's shard)."""
    lh = start_lighthouse(status=False)
    ckpt = tmp_path / "ckpt"

    def start() -> ManagedProcess:
        env = group_env(lh.grpc_address, "g0", tmp_path)
        env.update(REPLICAFT_CHECKPOINT_DIR=str(ckpt), REPLICAFT_CHECKPOINT_INTERVAL_STEPS="5")
        return spawn_python(
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--shutdown-timeout",
            "5",
            EXAMPLE,
            *ARGS,
            name="g0",
            env=env,
        )

    groups = {"g0": start()}
    with stopped_at_exit(groups, tmp_path):
        for rank in (0, 1):
            wait_for_event(
                tmp_path,
                lambda e, rank=rank: (
                    e["event"] == "checkpoint" and e["ok"] and e["group_rank"] == rank and e["checkpoint_step"] >= 10
                ),
                120,
                f"rank {rank}: a checkpoint at step 10 or later",
            )
        for pid in worker_pids(tmp_path):
            os.kill(pid, signal.SIGKILL)
        groups["g0"].kill()
        newest = next(i for i in CheckpointReader(ckpt).list() if i.valid)
        manifest = json.loads((newest.path / MANIFEST_FILE).read_text())
        assert manifest["metadata"]["group_world_size"] == 2
        assert {"pack-0.bin", "pack-1.bin"} <= {f["name"] for f in manifest["files"]}

        restarted_at = time.time()
        groups["g0"] = start()
        for rank in (0, 1):
            resume = wait_for_event(
                tmp_path,
                lambda e, rank=rank: e["event"] == "resume" and e["group_rank"] == rank and e["ts"] > restarted_at,
                120,
                f"rank {rank} resumed",
            )
            assert resume["checkpoint_step"] == newest.step, (resume, newest)
            saved = [
                e["digest"]
                for e in read_events(tmp_path)
                if e["event"] == "committed"
                and e["group_rank"] == rank
                and e["step"] == newest.step
                and e["ts"] < restarted_at
            ]
            assert saved and resume["digest"] == saved[-1], f"rank {rank}: resumed state differs from what it saved"
            wait_for_event(
                tmp_path,
                lambda e, rank=rank: (
                    committed(e, "g0", rank) and e["ts"] > restarted_at and e["step"] >= newest.step + 3
                ),
                60,
                f"rank {rank} training on after the resume",
            )


@pytest.mark.timeout(200)
def test_sigterm_to_one_rank_of_the_writer_group_stops_both_ranks_after_one_step_and_saves_it(tmp_path: Path) -> None:
    """Preemption of a W = 2 writer group where the signal reaches one rank only (the extreme
    case of two ranks seeing it on either side of a step boundary): the group's vote carries
    it to the other rank, both leave after the same step, and both write their shards of that
    step's emergency checkpoint."""
    lh = start_lighthouse(status=False)
    ckpt = tmp_path / "ckpt"
    env = group_env(lh.grpc_address, "g0", tmp_path)
    env.update(REPLICAFT_CHECKPOINT_DIR=str(ckpt), REPLICAFT_CHECKPOINT_INTERVAL_STEPS="100000")
    groups = {
        "g0": spawn_python(
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--shutdown-timeout",
            "5",
            EXAMPLE,
            *ARGS,
            name="g0",
            env=env,
        )
    }
    with stopped_at_exit(groups, tmp_path):
        wait_for_event(tmp_path, lambda e: committed(e, "g0", 1) and e["step"] >= 5, 90, "rank 1 at step 5")
        start = wait_for_event(tmp_path, lambda e: e["event"] == "start" and e["group_rank"] == 1, 1, "rank 1 start")
        os.kill(start["pid"], signal.SIGTERM)
        stops = [
            wait_for_event(
                tmp_path,
                lambda e, rank=rank: e["event"] == "stop" and e["group_rank"] == rank,
                60,
                f"rank {rank} stops",
            )
            for rank in (0, 1)
        ]
        assert all("SIGTERM" in s["reason"] for s in stops), stops
        groups["g0"].wait_exit(60)
    events = read_events(tmp_path)
    last = {rank: max(e["step"] for e in events if committed(e, "g0", rank)) for rank in (0, 1)}
    assert last[0] == last[1], f"the ranks left after different steps: {last}"
    saved = [e for e in events if e["event"] == "checkpoint" and e["ok"]]
    assert {e["group_rank"] for e in saved} == {0, 1} and {e["checkpoint_step"] for e in saved} == {last[0]}, saved
    (newest,) = [i for i in CheckpointReader(ckpt).list() if i.valid]
    manifest = json.loads((newest.path / MANIFEST_FILE).read_text())
    assert manifest["metadata"]["reason"] == "preemption"
    assert {"pack-0.bin", "pack-1.bin"} <= {f["name"] for f in manifest["files"]}
