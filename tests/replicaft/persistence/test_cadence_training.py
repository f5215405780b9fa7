"""checkpoint_interval="auto" in a real job: the interval is chosen from measured saves, logged with
its inputs, followed by the writer, and shortened when a member loss leaves the job unprotected.

Two real groups train ``examples/train_ddp.py`` against a real lighthouse; the test reads the
``checkpoint_cadence`` and ``checkpoint_start`` events and kills a group with SIGKILL.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ManagedProcess, spawn_python, start_lighthouse
from support.training_events import EXAMPLE, read_events, wait_for_event

from replicaft.checkpoint.cadence import CadenceLimits, FailureHistory, decide_interval

pytestmark = pytest.mark.slow

LIMITS = CadenceLimits(min_s=0.3, max_s=120.0, prior_mtbf_s=300.0)
"""A prior of 300 s and saves of ~0.05 s put the rule's interval (~5 s) well inside the bounds
(a loaded machine once took 1.7 s a save, a 32 s interval: the ceiling leaves room for that);
with one of two groups lost after ~10 s, the member-loss estimate (1/λ + R for the one left,
~20 s) undercuts the prior."""


def start_group(lighthouse: str, replica_id: str, tmp: Path) -> ManagedProcess:
    env = dict(os.environ)
    env.update(
        REPLICAFT_LIGHTHOUSE=lighthouse,
        REPLICAFT_REPLICA_ID=replica_id,
        REPLICAFT_EVENTS_DIR=str(tmp / "events"),
        REPLICAFT_CHECKPOINT_DIR=str(tmp / "ckpt"),
        REPLICAFT_CHECKPOINT_INTERVAL="auto",
        REPLICAFT_CHECKPOINT_INTERVAL_MIN_S=str(LIMITS.min_s),
        REPLICAFT_CHECKPOINT_INTERVAL_MAX_S=str(LIMITS.max_s),
        REPLICAFT_CHECKPOINT_MTBF_PRIOR_S=str(LIMITS.prior_mtbf_s),
    )
    env.pop("REPLICAFT_FAULT_POINTS", None)
    return spawn_python(EXAMPLE, "--steps", "100000", "--step-delay", "0.02", name=replica_id, env=env)


@pytest.mark.timeout(360)
def test_auto_interval_chosen_from_measured_saves_and_shortened_by_a_member_loss(tmp_path: Path) -> None:
    lh = start_lighthouse(status=False)
    groups = {rid: start_group(lh.grpc_address, rid, tmp_path) for rid in ("g0", "g1")}
    events = tmp_path / "events"

    def cadence(e: dict) -> bool:
        return e["event"] == "checkpoint_cadence" and e["replica_id"] == "g0"

    chosen = wait_for_event(
        events, lambda e: cadence(e) and e["cost_s"] is not None, 90, "g0 chose an interval from a save"
    )
    # The logged inputs give the logged interval, by the pure rule, and the rule (not a bound) chose it.
    again = decide_interval(
        blocked_s=chosen["blocked_s"],
        write_s=chosen["write_s"],
        history=FailureHistory(**chosen["history"]),
        limits=LIMITS,
    )
    assert again.interval_s == pytest.approx(chosen["interval_s"]), chosen
    assert LIMITS.min_s < chosen["rule_s"] < LIMITS.max_s and chosen["rule_s"] == pytest.approx(chosen["interval_s"])
    assert (chosen["mtbf_source"], chosen["mtbf_s"], chosen["history"]["max_groups"]) == ("prior", 300.0, 2)
    assert chosen["blocked_s"] >= 0 and chosen["write_s"] > 0

    # The writer follows it: the next save starts about one interval after the one before.
    wait_for_event(
        events,
        lambda e: e["event"] == "checkpoint_start" and e["replica_id"] == "g0" and e["ts"] > chosen["ts"],
        LIMITS.max_s + 30,
        "a save at the chosen interval",
    )
    log = read_events(events)
    starts = [e["ts"] for e in log if e["event"] == "checkpoint_start" and e["replica_id"] == "g0"]
    later = [t for t in starts if t > chosen["ts"]][0]
    before = max(t for t in starts if t < later)
    in_force = [e["interval_s"] for e in log if cadence(e) and e["ts"] < later][-1]
    assert later - before >= 0.85 * in_force, (later - before, in_force)

    # A member loss leaves one group: the member-loss estimate undercuts the prior, the interval shortens.
    groups["g1"].kill()
    lost = wait_for_event(
        events,
        lambda e: cadence(e) and e["mtbf_source"] == "member_losses",
        60,
        "g0 planning for the MTBF its member losses give",
    )
    assert lost["history"]["member_losses"] >= 1 and lost["mtbf_s"] < LIMITS.prior_mtbf_s, lost
    assert lost["interval_s"] < chosen["interval_s"], (lost, chosen)
    groups["g0"].kill()
    assert not [e for e in read_events(events) if e["event"] == "checkpoint" and not e["ok"]]
