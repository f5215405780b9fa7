"""A Lightning job under ``replicaft-launch``: three groups train examples/train_lightning.py,
one is SIGKILLed, restarted by the launcher and healed from its peers, and the job ends with
every group at the same state and ``global_step``."""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, spawn_python
from support.training_events import (
    assert_digests_agree,
    assert_samples_exactly_once,
    commits,
    read_events,
    wait_for_event,
)

EXAMPLE = str(REPO_ROOT / "examples" / "train_lightning.py")
STEPS = 60


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_sigkilled_lightning_group_heals_and_the_job_ends_in_agreement(tmp_path: Path) -> None:
    events = tmp_path / "events"
    env = {k: v for k, v in os.environ.items() if k != "REPLICAFT_TOKEN"}
    # --min-replicas 3: the survivors wait for g1 instead of finishing without it, so g1 must heal.
    launcher = spawn_python(
        "-m", "replicaft.launch", "--groups", "3", "--min-replicas", "3", "--restart-delay", "0.5",
        "--standbys", "0", "--events-dir", str(events),
        EXAMPLE, "--steps", str(STEPS), "--print-every", "5", "--log-dir", str(tmp_path / "logs"),
        name="launcher", env=env,
    )  # fmt: skip
    wait_for_event(
        events, lambda e: e["event"] == "commit" and e["replica_id"] == "g1" and e["committed"] and e["step"] >= 10,
        150, "g1 committed step 10", launcher,
    )  # fmt: skip
    (start,) = [e for e in read_events(events) if e["event"] == "start" and e["replica_id"] == "g1"]
    os.kill(start["pid"], signal.SIGKILL)
    killed_at = time.time()
    heal = wait_for_event(
        events, lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e["ts"] > killed_at,
        150, "g1 healed after the kill", launcher,
    )  # fmt: skip
    assert heal["ok"], heal
    assert launcher.wait_exit(150) == 0, launcher.output_tail()

    log = [line.text for line in launcher.lines("stderr")]
    assert "[launcher] g1 killed by SIGKILL; restart 1 of 10 in 0.5s" in log
    # Every group, the restarted one too, stops at max_steps: its global_step came from its peers.
    out = {line.text.split(" epoch")[0] for line in launcher.lines()}
    assert {f"[g{i}/0] [g{i}] step {STEPS}" for i in range(3)} <= out, sorted(out)[-20:]
    assert assert_digests_agree(events, min_steps=STEPS) >= STEPS
    assert_samples_exactly_once(events, min_steps=STEPS)
    # The global batch is the DataLoader's 32 per group times the job's 3 groups, whoever is up.
    assert {e["samples"][1] - e["samples"][0] for e in commits(events, "g0")} == {96}

    # The loss curve goes on where the job was, not from an untrained model.
    g1 = commits(events, "g1")
    before = [e for e in g1 if e["ts"] < killed_at]
    # The heal step's own loss is the restarted model's, before the heal: left out.
    after = [e for e in g1 if e["ts"] > killed_at and not e["healing"]]
    first_losses = statistics.mean(e["loss"] for e in before[:3])
    assert after and after[0]["step"] > before[-1]["step"], (before[-1], after[:1])
    assert after[0]["loss"] < first_losses / 2, (first_losses, after[0])
    assert statistics.mean(e["loss"] for e in after[-5:]) < statistics.mean(e["loss"] for e in before[-5:])
    # Lightning's own logger, in the restarted group, logs at the committed steps it healed to.
    header, *rows = (tmp_path / "logs" / "g1" / "metrics.csv").read_text().splitlines()
    logged_steps = [int(row.split(",")[header.split(",").index("step")]) for row in rows]
    assert logged_steps and min(logged_steps) >= before[-1]["step"] - 1, logged_steps


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_group_of_two_ranks_loses_one_and_heals_both_from_a_peer(tmp_path: Path) -> None:
    """Two groups of two ranks (torchrun, Gloo): rank 1 of g1 is SIGKILLed, the launcher
    restarts g1 whole, and each of its ranks heals from the same rank of g0."""
    events = tmp_path / "events"
    env = {k: v for k, v in os.environ.items() if k != "REPLICAFT_TOKEN"}
    launcher = spawn_python(
        "-m", "replicaft.launch", "--groups", "2", "--ranks-per-group", "2", "--min-replicas", "2",
        "--restart-delay", "0.5", "--events-dir", str(events),
        EXAMPLE, "--steps", "40", "--print-every", "5", "--log-dir", str(tmp_path / "logs"),
        name="launcher", env=env,
    )  # fmt: skip
    wait_for_event(
        events, lambda e: e["event"] == "commit" and e["replica_id"] == "g1" and e["committed"] and e["step"] >= 10,
        200, "g1 committed step 10", launcher,
    )  # fmt: skip
    (start,) = [
        e for e in read_events(events) if e["event"] == "start" and (e["replica_id"], e["group_rank"]) == ("g1", 1)
    ]
    os.kill(start["pid"], signal.SIGKILL)
    killed_at = time.time()
    for rank in (0, 1):
        heal = wait_for_event(
            events,
            lambda e, r=rank: e["event"] == "heal_end" and (e["replica_id"], e["group_rank"]) == ("g1", r)
            and e["ts"] > killed_at,
            200, f"g1/{rank} healed after the kill", launcher,
        )  # fmt: skip
        assert heal["ok"], heal
    assert launcher.wait_exit(200) == 0, launcher.output_tail()
    # Column by column: rank r of g1 holds rank r of g0's state at every step both committed.
    assert assert_digests_agree(events, min_steps=40) >= 40
    assert_samples_exactly_once(events, min_steps=40)
    # The DataLoader's 32 per rank, times 2 ranks, times 2 groups.
    assert {e["samples"][1] - e["samples"][0] for e in commits(events, "g0")} == {128}
    g1 = [e for e in commits(events, "g1") if e["group_rank"] == 0]
    before = [e for e in g1 if e["ts"] < killed_at]
    after = [e for e in g1 if e["ts"] > killed_at and not e["healing"]]
    assert after and after[0]["step"] > before[-1]["step"], (before[-1], after[:1])
    assert after[0]["loss"] < statistics.mean(e["loss"] for e in before[:3]) / 2, (before[:3], after[0])
