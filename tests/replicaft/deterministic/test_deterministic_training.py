"""The deterministic mode across real processes: a run with a SIGKILL ends where the fault-free run ends.

Three replica groups run ``examples/train_ddp.py`` (BatchNorm, AdamW, an LR schedule) with
``REPLICAFT_DETERMINISTIC=1`` against a real lighthouse: a run in which g2 is SIGKILLed in the
middle of a step's all-reduce, the survivors go on as two groups, and g2 restarts and heals;
then a fault-free reference with the same seed and data, as many steps as the faulty run
committed. Every step both runs committed must leave bitwise-identical state (the digests of
the event logs), not only the final one.

The faulty run has no fixed end: its groups train until g2 is back in the quorum, then are
stopped with SIGTERM (a preemption: each leaves at a step boundary). A fixed step count would
race g2's restart against the survivors' remaining steps: on a loaded machine the survivors
had finished before the restarted g2 had imported torch, and g2 then trained alone.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import start_lighthouse
from support.training_events import assert_digests_agree, read_events, start_group, wait_for_event

pytestmark = pytest.mark.slow

ARGS = ("--batch-size", "24", "--width", "32")
OPEN_ENDED = ("--steps", "100000")
"""The faulty run's groups train until the test stops them (the LR schedule does not depend on
``--steps``, so the reference's shorter run takes the same steps)."""
PACING = ("--step-delay", "0.05")
"""Keeps the faulty run's logs short while g2 restarts (the delay is a sleep, outside what the
digests cover)."""
DETERMINISTIC = {"REPLICAFT_DETERMINISTIC": "1", "REPLICAFT_VIRTUAL_SHARDS": "6"}
STOPPED = (0, 143)
"""A group stopped by SIGTERM leaves at a step boundary; the writer group exits with 143."""


def digests(events: Path, min_steps: int) -> dict[int, str]:
    """The digest of every committed step (the groups agree on each: checked first)."""
    assert_digests_agree(events, min_steps=min_steps)
    return {e["step"]: e["digest"] for e in read_events(events) if e["event"] == "committed"}


@pytest.mark.timeout(300)
def test_group_killed_and_healed_ends_bitwise_where_the_fault_free_run_ends(tmp_path: Path) -> None:
    reference, faulty = tmp_path / "reference", tmp_path / "faulty"
    lh = start_lighthouse(status=False)
    run = (*ARGS, *OPEN_ENDED, *PACING)
    groups = {
        rid: start_group(
            lh.grpc_address, rid, faulty, *run, fault_points="allreduce@6" if rid == "g2" else None, **DETERMINISTIC
        )
        for rid in ("g0", "g1", "g2")
    }
    assert groups["g2"].wait_exit(120) == -signal.SIGKILL
    restarted_at = time.time()
    groups["g2"] = start_group(lh.grpc_address, "g2", faulty, *run, **DETERMINISTIC)
    heal = wait_for_event(
        faulty,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g2" and e["ts"] > restarted_at,
        120,
        "g2 healed after its restart",
    )
    assert heal["ok"], heal
    wait_for_event(
        faulty,
        lambda e: e["event"] == "commit" and e["committed"] and e["num_contributors"] == 3 and e["step"] > heal["step"],
        60,
        "a step committed by all three groups after g2's heal",
    )
    for g in groups.values():
        g.send_signal(signal.SIGTERM)
    for rid, g in groups.items():
        assert g.wait_exit(60) in STOPPED, f"{rid}\n{g.output_tail()}"
    lh.process.kill()

    commits = [e for e in read_events(faulty) if e["event"] == "commit" and e["committed"]]
    assert {e["num_contributors"] for e in commits} >= {2, 3}, "the faulty run never changed membership"
    last_step = max(e["step"] for e in commits)
    got = digests(faulty, min_steps=last_step)

    lh = start_lighthouse(status=False)
    groups = {
        rid: start_group(lh.grpc_address, rid, reference, *ARGS, "--steps", str(last_step), **DETERMINISTIC)
        for rid in ("g0", "g1", "g2")
    }
    for rid, g in groups.items():
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    want = digests(reference, min_steps=last_step)
    assert max(want) == max(got) == last_step
    differing = sorted(step for step in got if want.get(step) != got[step])
    assert not differing, f"steps whose state differs from the fault-free run: {differing}"
