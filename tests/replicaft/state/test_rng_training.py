"""Complete state in real runs (issue 23): dropout and a GradScaler continue bit for bit across a
heal and across a resume from disk.

Two groups train ``examples/train_ddp.py`` with dropout (torch's global generator) and a
``GradScaler`` whose scale grows every 4 steps, against a real lighthouse with
``--min-replicas 2``, beside a fault-free reference run. Each commit event carries the
step's loss, the scale and ``rng``, the fingerprint of the group's generators after the step.

* A group SIGKILLed in a step's all-reduce restarts and heals from the survivor. Until then
  both draw what they drew in the reference run. From the heal on, the healed group holds the
  survivor's generators: they draw alike, step for step (a step with a heal ends where it
  started in every group, rng_state.py), and keep the reference's scale schedule. (Their
  weights leave the reference's at the heal step, whose average has one contributor; what
  must hold there is that the two groups agree, digest by digest.)
* Every group SIGKILLed resumes from a checkpoint: from the checkpoint's step on, every step's
  loss, scale, generators and state digest equal the reference's.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ManagedProcess, start_lighthouse
from support.training_events import (
    assert_digests_agree,
    final_history,
    read_events,
    start_group,
    wait_for_event,
)

pytestmark = pytest.mark.slow

STEPS = 30
ARGS = ("--steps", str(STEPS), "--dropout", "0.3", "--grad-scaler", "--width", "32")


def run_options(root: Path) -> dict[str, str]:
    return {"REPLICAFT_CHECKPOINT_DIR": str(root / "ckpt"), "REPLICAFT_CHECKPOINT_INTERVAL_STEPS": "10"}


Trajectory = dict[tuple[str, int], dict[str, Any]]


def trajectory(events: Path) -> Trajectory:
    """(group, step) -> loss, grad_scale, rng and the state digest of every step the run kept."""
    history = final_history(read_events(events))
    digests = {(e["replica_id"], e["step"]): e["digest"] for e in history if e["event"] == "committed"}
    # torch's generator only: Python's and NumPy's start from OS entropy in each run's processes
    return {
        (e["replica_id"], e["step"]): {
            "loss": e["loss"],
            "grad_scale": e["grad_scale"],
            "rng": e["rng"]["torch"],
            "digest": digests.get((e["replica_id"], e["step"])),
            "healing": e["healing"],
        }
        for e in history
        if e["event"] == "commit" and e["committed"]
    }


def start_groups(root: Path, lighthouse: str, fault_points: dict[str, str] | None = None) -> dict[str, ManagedProcess]:
    return {
        rid: start_group(lighthouse, rid, root, *ARGS, fault_points=(fault_points or {}).get(rid), **run_options(root))
        for rid in ("g0", "g1")
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Trajectory:
    root = tmp_path_factory.mktemp("reference")
    lh = start_lighthouse("--min-replicas", "2", status=False)
    for rid, g in start_groups(root, lh.grpc_address).items():
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    lh.process.kill()
    return trajectory(root)


def assert_matches(
    reference: Trajectory, got: Trajectory, fields: tuple[str, ...], after_step: int = 0, until_step: int = STEPS
) -> None:
    steps = sorted(key for key in got if after_step < key[1] <= until_step)
    assert len(steps) >= 2 * (until_step - after_step), f"the run committed only {steps}"
    differing = [
        (key, field, reference[key][field], got[key][field])
        for key in steps
        for field in fields
        if got[key][field] != reference[key][field]
    ]
    assert not differing, f"(group, step), field, reference, got: {differing[:4]}"


@pytest.mark.timeout(180)
def test_group_killed_and_healed_continues_bitwise_with_dropout_and_grad_scaler(
    tmp_path: Path, reference: Trajectory
) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    groups = start_groups(tmp_path, lh.grpc_address, {"g1": "allreduce@8"})
    assert groups["g1"].wait_exit(90) == -signal.SIGKILL
    restarted_at = time.time()
    groups["g1"] = start_group(lh.grpc_address, "g1", tmp_path, *ARGS, **run_options(tmp_path))
    wait_for_event(
        tmp_path,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e.get("ok") and e["ts"] > restarted_at,
        90,
        "g1 healed after its restart",
    )
    for rid, g in groups.items():
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    got = trajectory(tmp_path)
    assert_matches(reference, got, ("rng", "grad_scale"), until_step=8)
    assert_digests_agree(tmp_path, min_steps=STEPS)
    # From the heal on (applied in a commit, or after replaying the steps its fetch outlasted).
    healed_at = min(step for (rid, step), e in got.items() if rid == "g1" and e["healing"] and step > 8)
    both = [step for step in range(healed_at, STEPS + 1) if ("g1", step) in got]
    assert len(both) >= STEPS - healed_at, f"g1 committed only steps {both} after healing at {healed_at}"
    apart = [
        (step, got["g0", step]["rng"], got["g1", step]["rng"])
        for step in both
        if got["g0", step]["rng"] != got["g1", step]["rng"]
    ]
    assert not apart, f"after the heal the groups' generators differ at (step, g0, g1): {apart[:3]}"
    # The scale a healer annotates in its heal step is its own, the one it unscaled with
    # (GradScalerState then rescales to the donor's): every other step follows the reference.
    scales = [
        (key, e["grad_scale"], reference[key]["grad_scale"])
        for key, e in got.items()
        if not e["healing"] and e["grad_scale"] != reference[key]["grad_scale"]
    ]
    assert not scales, f"(group, step), scale, reference's: {scales[:3]}"


@pytest.mark.timeout(180)
def test_every_group_killed_resumes_from_disk_bitwise_with_dropout_and_grad_scaler(
    tmp_path: Path, reference: Trajectory
) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    groups = start_groups(tmp_path, lh.grpc_address)
    wait_for_event(
        tmp_path, lambda e: e["event"] == "checkpoint" and e["ok"] and e["checkpoint_step"] >= 10, 90, "a checkpoint"
    )
    for g in groups.values():
        g.kill()
    groups = start_groups(tmp_path, lh.grpc_address)
    resumes = [
        wait_for_event(
            tmp_path,
            lambda e, rid=rid: e["event"] == "resume" and e["replica_id"] == rid,
            90,
            f"{rid} resumed from disk",
        )
        for rid in ("g0", "g1")
    ]
    assert resumes[0]["checkpoint_step"] == resumes[1]["checkpoint_step"], resumes
    for rid, g in groups.items():
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    assert_matches(
        reference,
        trajectory(tmp_path),
        ("loss", "grad_scale", "rng", "digest"),
        after_step=resumes[0]["checkpoint_step"],
    )
