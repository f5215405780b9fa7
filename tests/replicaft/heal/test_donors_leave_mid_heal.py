"""A heal whose donors end their run before it arrives: the healer finishes at their last step.

Real processes: a lighthouse, two groups of ``examples/train_ddp.py``. g1 is SIGKILLed at step
15 and restarted; g0's state server is slowed (``slow_serve``: 1.5 s per range) so g1's fetch
outlasts the five steps g0 has left. g0 finishes its run and stops, serving g1 until it has
every byte (the donor's drain); g1, whose every donor has left at step 20 with its base plus
the steps it recorded reaching 20, applies the heal and ends there too. Before, g1 asked for
a quorum nobody would join and failed at its deadline; g0 stopped mid-transfer.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import start_lighthouse
from support.training_events import assert_digests_agree, read_events, start_group

pytestmark = pytest.mark.slow

STEPS = 20


@pytest.mark.timeout(180)
def test_healer_whose_donors_finish_mid_fetch_ends_at_their_last_step(tmp_path: Path) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    args = ("--steps", str(STEPS), "--width", "1024", "--step-delay", "0.05")
    g0 = start_group(lh.grpc_address, "g0", tmp_path, *args, fault_points="slow_serve@10")
    g1 = start_group(lh.grpc_address, "g1", tmp_path, *args, fault_points="allreduce@15")
    assert g1.wait_exit(120) == -signal.SIGKILL, g1.output_tail()
    g1 = start_group(lh.grpc_address, "g1", tmp_path, *args)

    assert g0.wait_exit(120) == 0, g0.output_tail()
    assert g1.wait_exit(120) == 0, g1.output_tail()

    events = read_events(tmp_path)
    drains = [e for e in events if e["event"] == "drain" and e["replica_id"] == "g0"]
    assert drains and not drains[0]["abandoned"], f"g0 stopped without serving g1 to the end: {drains}"
    healed = [e for e in events if e["event"] == "heal_end" and e["replica_id"] == "g1" and e.get("base_step", 0) > 0]
    assert len(healed) == 1, healed
    heal = healed[0]
    assert heal["ok"], heal
    assert heal["base_step"] + heal["replayed_steps"] == STEPS, f"g1 did not reach g0's last step: {heal}"
    committed = [e for e in events if e["event"] == "committed"]
    last = {rid: max(e["step"] for e in committed if e["replica_id"] == rid) for rid in ("g0", "g1")}
    assert last == {"g0": STEPS, "g1": STEPS}, last
    assert_digests_agree(tmp_path, min_steps=STEPS)
    failed = [e for e in events if e["event"] == "commit" and e["replica_id"] == "g1" and not e["committed"]]
    assert "every donor of this group's heal left at step 20" in failed[-1]["reason"], failed[-1]
