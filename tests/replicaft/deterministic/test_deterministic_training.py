"""The deterministic mode across real processes: a run with a SIGKILL ends where the fault-free run ends.

Three replica groups run ``examples/train_ddp.py`` (BatchNorm, AdamW, an LR schedule) with
``REPLICAFT_DETERMINISTIC=1`` against a real lighthouse, twice with the same seed and data: a
fault-free reference, and a run in which g2 is SIGKILLed in the middle of a step's all-reduce,
the survivors go on as two groups, and g2 restarts and heals. Every step both runs committed
must leave bitwise-identical state (the digests of the event logs), not only the final one.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import start_lighthouse
from support.training_events import assert_digests_agree, read_events, start_group, wait_for_event

pytestmark = pytest.mark.slow

STEPS = 40
ARGS = ("--steps", str(STEPS), "--batch-size", "24", "--width", "32")
FAULTY_ARGS = (*ARGS, "--step-delay", "0.1")
"""The faulty run is paced so the survivors are still training when g2 is back from its restart;
the reference has nothing to wait for (the delay is a sleep, outside what the digests cover)."""
DETERMINISTIC = {"REPLICAFT_DETERMINISTIC": "1", "REPLICAFT_VIRTUAL_SHARDS": "6"}


def digests(events: Path) -> dict[int, str]:
    """The digest of every committed step (the groups agree on each: checked first)."""
    assert_digests_agree(events, min_steps=STEPS)
    return {e["step"]: e["digest"] for e in read_events(events) if e["event"] == "committed"}


@pytest.mark.timeout(240)
def test_group_killed_and_healed_ends_bitwise_where_the_fault_free_run_ends(tmp_path: Path) -> None:
    reference, faulty = tmp_path / "reference", tmp_path / "faulty"
    lh = start_lighthouse(status=False)
    groups = {rid: start_group(lh.grpc_address, rid, reference, *ARGS, **DETERMINISTIC) for rid in ("g0", "g1", "g2")}
    for rid, g in groups.items():
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    lh.process.kill()

    lh = start_lighthouse(status=False)
    groups = {
        rid: start_group(
            lh.grpc_address,
            rid,
            faulty,
            *FAULTY_ARGS,
            fault_points="allreduce@6" if rid == "g2" else None,
            **DETERMINISTIC,
        )
        for rid in ("g0", "g1", "g2")
    }
    assert groups["g2"].wait_exit(90) == -signal.SIGKILL
    restarted_at = time.time()
    groups["g2"] = start_group(lh.grpc_address, "g2", faulty, *FAULTY_ARGS, **DETERMINISTIC)
    heal = wait_for_event(
        faulty,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g2" and e["ts"] > restarted_at,
        90,
        "g2 healed after its restart",
    )
    assert heal["ok"], heal
    for rid, g in groups.items():
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"

    commits = [e for e in read_events(faulty) if e["event"] == "commit" and e["committed"]]
    assert {e["num_contributors"] for e in commits} >= {2, 3}, "the faulty run never changed membership"
    want, got = digests(reference), digests(faulty)
    assert max(want) == max(got) == STEPS
    differing = sorted(step for step in want if got.get(step) != want[step])
    assert not differing, f"steps whose state differs from the fault-free run: {differing}"
