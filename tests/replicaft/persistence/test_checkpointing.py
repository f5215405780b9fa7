"""Persistent checkpoints in a real job: resume when every group died, heal otherwise, preemption.

Real processes train ``examples/train_ddp.py`` with ``REPLICAFT_CHECKPOINT_DIR`` set; the
tests kill groups with real signals and read the structured events and the directory.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest
from conftest import start_lighthouse
from support.training_events import (
    CHECKPOINT_INTERVAL_STEPS,
    assert_digests_agree,
    assert_samples_exactly_once,
    committed_digest,
    read_events,
    start_checkpointing_group,
    wait_for_event,
)

from replicaft.checkpoint import CheckpointReader

pytestmark = pytest.mark.slow


def flip_a_byte(checkpoint: Path) -> Path:
    shard = sorted(checkpoint.glob("pack-*.bin"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


@pytest.mark.parametrize(
    ("corrupt_newest", "width"),
    [(False, 64), (True, 64), (False, 600)],
    # width 600: tensors over 1 MiB, which the writer copies behind the next step (BackgroundCapture)
    ids=["newest", "newest_corrupt", "newest_copied_in_background"],
)
@pytest.mark.timeout(240)
def test_every_group_killed_resume_from_checkpoint_bitwise(tmp_path: Path, corrupt_newest: bool, width: int) -> None:
    # min_replicas=2: the restarted groups form their first quorum together and both resume
    # from disk. Without it the first one back may form a quorum alone (seen in CI, when the
    # other's session registered late), and the other then heals from it instead.
    lh = start_lighthouse("--min-replicas", "2", status=False)
    args = ("--steps", "60", "--step-delay", "0.02", "--width", str(width))
    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ("g0", "g1")}
    events = tmp_path / "events"
    wait_for_event(
        events,
        lambda e: e["event"] == "checkpoint" and e["ok"] and e["checkpoint_step"] >= 2 * CHECKPOINT_INTERVAL_STEPS,
        120,
        "two checkpoints",
    )
    for g in groups.values():
        g.kill()
    published = [i for i in CheckpointReader(tmp_path / "ckpt").list() if i.valid]
    assert len(published) >= 2, published
    expected = published[0]
    if corrupt_newest:
        flip_a_byte(published[0].path)
        expected = published[1]
    before = len(read_events(events))

    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ("g0", "g1")}
    for rid in groups:
        resume = wait_for_event(
            events, lambda e, rid=rid: e["event"] == "resume" and e["replica_id"] == rid, 120, f"{rid} resumed"
        )
        assert resume["checkpoint_step"] == expected.step, (resume, expected)
        assert resume["digest"] == committed_digest(events, expected.step), "resumed state differs from what was saved"
    for rid, g in groups.items():
        assert g.wait_exit(150) == 0, f"{rid}\n{g.output_tail()}"
    starts = [e for e in read_events(events) if e["event"] == "checkpoint_start"]
    assert starts and all((e["background_copy_bytes"] > 0) == (width > 64) for e in starts), starts
    assert not [e for e in read_events(events) if e["event"] == "checkpoint" and not e["ok"]]
    assert not [e for e in read_events(events)[before:] if e["event"] == "heal_start" and e["max_step"] > 0]
    assert_digests_agree(events, min_steps=55)
    assert_samples_exactly_once(events, min_steps=60)
    # The checkpoint carried the loss trajectory, and the resumed run trains on as it did (issue 23).
    verdicts = {e["replica_id"]: e for e in read_events(events) if e["event"] == "resume_verdict"}
    assert sorted(verdicts) == ["g0", "g1"], verdicts
    assert all(v["verdict"] == "ok" and v["checkpoint_step"] == expected.step for v in verdicts.values()), verdicts


@pytest.mark.timeout(200)
def test_group_restarting_while_peers_alive_heals_and_reads_no_checkpoint(tmp_path: Path) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    args = ("--steps", "50", "--step-delay", "0.02")
    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ("g0", "g1")}
    events = tmp_path / "events"
    wait_for_event(events, lambda e: e["event"] == "checkpoint" and e["ok"], 120, "a checkpoint")
    groups["g1"].kill()
    groups["g1"] = start_checkpointing_group(lh.grpc_address, "g1", tmp_path, *args)
    heal = wait_for_event(
        events,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e.get("base_step", 0) > 0,
        120,
        "g1 healed",
    )
    assert heal["ok"]
    for rid, g in groups.items():
        assert g.wait_exit(150) == 0, f"{rid}\n{g.output_tail()}"
    assert not [e for e in read_events(events) if e["event"] == "resume"]
    assert_digests_agree(events, min_steps=45)


@pytest.mark.parametrize("action", ["warn", "stop"])
@pytest.mark.timeout(200)
def test_resume_into_a_changed_loss_is_reported_diverged_issue_23(tmp_path: Path, action: str) -> None:
    # The same script resumed with its loss scaled by 10 (a changed normalisation): the
    # checkpoint verifies and loads, and only the loss trajectory shows the run is not the same.
    # A checkpoint of step 20 or later: the trajectory of the first ten steps holds the steep
    # initial descent, whose spread allows almost anything (resume_check.py is lenient by design).
    # The resumed run goes on for a checkpoint interval past the newest checkpoint, whichever
    # that is when the first run is killed (on a loaded host it may be past step 20): the verdict
    # needs resume_verify_steps (5) new steps, and a run resumed at its end would judge none.
    lh = start_lighthouse(status=False)
    delay = ("--step-delay", "0.02")
    group = start_checkpointing_group(lh.grpc_address, "g0", tmp_path, "--steps", "100000", *delay)
    events = tmp_path / "events"
    wait_for_event(
        events,
        lambda e: e["event"] == "checkpoint" and e["ok"] and e["checkpoint_step"] >= 2 * CHECKPOINT_INTERVAL_STEPS,
        120,
        "a checkpoint of step 20",
        group,
    )
    group.kill()
    newest = max(i.step for i in CheckpointReader(tmp_path / "ckpt").list())
    steps = str(newest + CHECKPOINT_INTERVAL_STEPS)
    group = start_checkpointing_group(
        lh.grpc_address, "g0", tmp_path, "--steps", steps, *delay, "--loss-scale", "10",
        REPLICAFT_RESUME_VERIFY_ACTION=action,
    )  # fmt: skip
    resume = wait_for_event(events, lambda e: e["event"] == "resume", 120, "the resume", group)
    assert resume["checkpoint_step"] == newest, resume
    verdict = wait_for_event(events, lambda e: e["event"] == "resume_verdict", 120, "the resume's verdict", group)
    assert group.wait_exit(150) == (0 if action == "warn" else 1), group.output_tail()
    assert verdict["verdict"] == "diverged" and verdict["checkpoint_step"] == resume["checkpoint_step"], verdict
    assert verdict["new_mean"] > 3 * verdict["reference_mean"] and verdict["action"] == action, verdict
    assert "the loss diverged after the resume" in group.output_tail(200)
    if action == "stop":  # it stopped before the diverged run saved anything
        assert "train_ddp: [g0/0] after the resume from checkpoint step" in group.output_tail(200)
        assert max(i.step for i in CheckpointReader(tmp_path / "ckpt").list()) == resume["checkpoint_step"]


@pytest.mark.timeout(200)
def test_sigterm_to_the_writer_saves_its_step_before_exit(tmp_path: Path) -> None:
    lh = start_lighthouse(status=False)
    args = ("--steps", "400", "--step-delay", "0.02")
    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ("g0", "g1")}
    events = tmp_path / "events"
    wait_for_event(
        events, lambda e: e["event"] == "commit" and e["replica_id"] == "g0" and e["step"] >= 13, 120, "g0 at step 13"
    )
    groups["g0"].send_signal(signal.SIGTERM)
    assert groups["g0"].wait_exit(60) == 143, groups["g0"].output_tail()
    g0_steps = [
        e["step"] for e in read_events(events) if e["event"] == "commit" and e["replica_id"] == "g0" and e["committed"]
    ]
    saved = [e for e in read_events(events) if e["event"] == "checkpoint" and e["replica_id"] == "g0" and e["ok"]]
    assert saved and saved[-1]["checkpoint_step"] == max(g0_steps), f"g0 committed up to {max(g0_steps)}; saved {saved}"
    assert groups["g1"].popen.poll() is None, "the other group just goes on"


@pytest.mark.timeout(420)
def test_random_kills_then_every_group_killed_samples_exactly_once(tmp_path: Path) -> None:
    """Issue 7's acceptance run: three random SIGKILLs (each group restarted, as an orchestrator
    would), then every group killed at once and resumed from disk; across all of it, and across
    epoch boundaries, every sample trains in exactly one committed step."""
    rng = random.Random(7)
    lh = start_lighthouse(status=False)
    args = ("--steps", "100", "--step-delay", "0.02", "--dataset-size", "300")
    ids = ("g0", "g1", "g2")
    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ids}
    events = tmp_path / "events"
    step = 5
    for _ in range(3):
        step += rng.randint(6, 12)
        victim = rng.choice(ids)
        wait_for_event(
            events, lambda e, s=step: e["event"] == "commit" and e["committed"] and e["step"] >= s, 120, f"step {step}"
        )
        groups[victim].kill()
        groups[victim] = start_checkpointing_group(lh.grpc_address, victim, tmp_path, *args)
    wait_for_event(
        events,
        lambda e: e["event"] == "checkpoint" and e["ok"] and e["checkpoint_step"] >= step,
        180,
        "a checkpoint after the kills",
    )
    for g in groups.values():
        g.kill()
    restarted_at = time.time()
    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ids}
    # The first groups back find nobody ahead and resume from disk; a group that starts later
    # finds them ahead and heals from them instead (it reads no checkpoint).
    wait_for_event(events, lambda e: e["event"] == "resume" and e["ts"] > restarted_at, 120, "a resume from disk")
    for rid in ids:
        wait_for_event(
            events,
            lambda e, rid=rid: (
                e["replica_id"] == rid
                and e["ts"] > restarted_at
                and (e["event"] == "resume" or (e["event"] == "heal_end" and e["ok"] and e.get("base_step", 0) > 0))
            ),
            120,
            f"{rid} back from disk or from a peer",
        )
    for rid, g in groups.items():
        assert g.wait_exit(240) == 0, f"{rid}\n{g.output_tail()}"
    positions = max(e["samples"][1] for e in read_events(events) if e["event"] == "commit" and e["committed"])
    assert positions > 2 * 300, "the run should cross at least one epoch boundary"
    assert_digests_agree(events, min_steps=90)
    assert_samples_exactly_once(events, min_steps=100)


@pytest.mark.timeout(120)
def test_a_loss_that_blows_up_is_recorded_and_training_goes_on_issue_37(tmp_path: Path) -> None:
    """``--loss-scale inf``: every loss is infinite. ``report_metrics`` raised and the group
    exited with 1 (bug 6), and the script's ``checkpoint_tags(config=vars(args))`` refused the
    infinite value in its config first. Now each is a ``non_finite_metric`` event, the run
    trains its steps, saves its checkpoints without the loss, and exits 0."""
    lh = start_lighthouse(status=False)
    group = start_checkpointing_group(lh.grpc_address, "g0", tmp_path, "--steps", "12", "--loss-scale", "inf")
    assert group.wait_exit(100) == 0, group.output_tail()
    events = read_events(tmp_path / "events")
    blown = [e for e in events if e["event"] == "non_finite_metric"]
    # The first loss is infinite; its gradients make the weights NaN, and every loss after is NaN.
    assert len(blown) >= 12 and blown[0]["value"] == "inf", blown[:3]
    assert {(e["metric"], e["value"]) for e in blown} <= {("loss", "inf"), ("loss", "nan")}, blown[:3]
    saved = [e for e in events if e["event"] == "checkpoint" and e["ok"]]
    assert saved, "no checkpoint was saved"
    for info in CheckpointReader(tmp_path / "ckpt").list():
        metadata = json.loads((info.path / "manifest.json").read_text())["metadata"]
        assert "loss" not in metadata.get("metrics", {}), (info.step, metadata)
        assert "config_hash" in metadata, metadata  # the config, inf and all, was hashed
